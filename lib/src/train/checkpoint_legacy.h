// The reader of dptrain's checkpoint files of format versions 1 and 2 (DPTRNCKP), which dptrain
// no longer writes, inside the train layer only: checkpoint.cpp dispatches to it by a file's
// first bytes. Not here: version 3, the safetensors checkpoint (checkpoint.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "dptrain/core/files.h"
#include "dptrain/train/accepted_model.h"
#include "dptrain/train/checkpoint_types.h"

namespace dptrain {

// Whether a file's first bytes are DPTRNCKP's magic, or a zip archive's (a TorchScript or
// torch.save file, which the legacy reader refuses by name).
bool is_legacy_checkpoint(const uint8_t* first, size_t available);

// The whole file in memory; DataError "<label>: ..." as parse_checkpoint.
Checkpoint parse_legacy_checkpoint(const uint8_t* bytes, size_t size, const std::string& label);

// The file, its configuration checked against what the run accepts and its size bounded by that
// model before the rest is read (Note [A file is bounded by what the run can use, not by its own
// word] in accepted_model.h).
Checkpoint read_legacy_checkpoint(const RegularFile& file, const AcceptedModel& accepted);

}  // namespace dptrain
