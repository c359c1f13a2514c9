// The run state of a checkpoint (its configuration, position, partial sums and history: all but
// its tensors) as the JSON a version 3 file keeps in "dptrain.run_state", read by fields by name,
// and the checks of a checkpoint's contents that every format version shares. Inside the train
// layer only: checkpoint.cpp and checkpoint_legacy.cpp use it. Not here: the file around it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "dptrain/core/safetensors.h"
#include "dptrain/train/checkpoint.h"

namespace dptrain {

// What any dptrain could build: a file claiming more is refused (checkpoint.cpp bounds a file's
// size by the model it claims, and reads a plain file's width from its stem).
constexpr int64_t kMaxWidth = 4096;
constexpr int64_t kMaxClassesOrChannels = 65536;

// The elements of the book's ResNet-18 at width w (model.h): about 2729 w^2 in the convolutions
// (11,175,818 at w = 64), plus terms linear in w (BatchNorm, the stem, the linear layer), bounded
// generously; each argument clamped to what any dptrain could build. Both formats' size bounds
// start from it.
inline uint64_t model_elements_bound(int64_t width, int64_t num_classes, int64_t in_channels) {
  const auto w = static_cast<uint64_t>(std::clamp<int64_t>(width, 1, kMaxWidth));
  const auto k = static_cast<uint64_t>(std::clamp<int64_t>(num_classes, 1, kMaxClassesOrChannels));
  const auto c = static_cast<uint64_t>(std::clamp<int64_t>(in_channels, 1, kMaxClassesOrChannels));
  return 2800 * w * w + 64 * w * (16 + k + c) + 4 * k;
}

// The width a file claiming `claimed` is read at, when `accepted` allows it (Note [A file is
// bounded by what the run can use, not by its own word] in checkpoint.h); before the data is
// read otherwise: a UsageError for eval's --width or a machine too small (as check_host_memory),
// a DataError for a --resume's own width (the directory's scan names such a file unreadable).
int64_t accepted_width(int64_t claimed, const AcceptedModel& accepted, const std::string& label);

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

// A width a file claims, from 1 to kMaxWidth, checked before the size bound or a model of it is
// built: else a DataError "<label>: corrupt: impossible contents: width is -4 (dptrain writes 1
// to 4096)", the words of check_checkpoint_contents.
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
