// The run state of a checkpoint (its configuration, position, partial sums and history: all but
// its tensors) as the JSON a version 3 file keeps in "dptrain.run_state", read by fields by name,
// and the checks of a checkpoint's contents that every format version shares. Inside the train
// layer only: checkpoint.cpp, checkpoint_legacy.cpp and accepted_model.cpp use it. Not here: the file around it.
#pragma once

#include <cstdint>
#include <string>

#include "dptrain/core/safetensors.h"
#include "dptrain/train/checkpoint_types.h"

namespace dptrain {

// `checkpoint`'s run state as compact JSON (docs/checkpoints.md gives its fields): integers as
// JSON integers, finite doubles as numbers (shortest round-trip form), the others as the strings
// "nan", "inf" and "-inf".
std::string run_state_text(const Checkpoint& checkpoint);

// A checkpoint's run state from that JSON, the tensors and format fields left empty. A field
// missing or of the wrong type is a DataError "<label>: corrupt: run state: FIELD ..."; fields it
// does not know are left alone. The contents are not checked here (check_checkpoint_contents).
Checkpoint parse_run_state(const std::string& text, const std::string& label);

// The width the run state claims (for a size bound before the rest is read); DataError as above,
// or as check_claimed_width's.
int64_t run_state_width(const std::string& text, const std::string& label);

// A width a file claims, from 1 to kMaxWidth (model.h), checked before the size bound or a model
// of it is built: else a DataError "<label>: corrupt: impossible contents: width is -4 (dptrain
// writes 1 to 4096)", the words of check_checkpoint_contents.
void check_claimed_width(int64_t width, const std::string& label);

// A figure as the run state writes it: "0.125", or "nan", "inf", "-inf".
std::string figure_text(double value);

// Every version's contents checks (Note [A checkpoint's contents are checked, not only its
// digest]); DataError "<label>: corrupt: impossible contents: ...".
void check_checkpoint_contents(const Checkpoint& checkpoint, const std::string& label);

// A checkpoint's tensors as no run writes them: a non-finite value in any floating tensor, a
// negative value in a BatchNorm running variance ("...running_var"); DataError naming the tensor.
void check_checkpoint_tensors(const NamedTensors& tensors, const std::string& label);

}  // namespace dptrain
