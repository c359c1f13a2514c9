// What a run accepts to read from a checkpoint or model file: the width it builds, or any width
// that fits the memory available, and whether the file's tensors must be that model's; and the
// width a file's claim is read at. Not here: the files themselves (checkpoint.h), the model's own
// facts (its size bound and widest width: model.h).
#pragma once

#include <cstdint>
#include <string>

namespace dptrain {

// Note [A file is bounded by what the run can use, not by its own word]
// A file says which model it holds (its run state's width, a plain file's stem), and a bound
// taken from that word is no bound: a sparse file claiming width 4096 would be read whole (4.4 GB)
// by a --width 8 run. So the reader is told what the run can use, and refuses a header that
// claims anything else before a byte of the data is read: a --resume accepts its own --width
// and the names, shapes and dtypes of the model it builds; eval builds the file's width, so it
// accepts any width up to the widest model whose file and weights fit the memory this process
// may still allocate (and kMaxWidth), and then the tensor table of that width.
struct AcceptedModel {
  int64_t width = 0;      // the width the run builds, or 0: the file's, up to max_width
  int64_t max_width = 0;  // the widest file read at all
  // The header's tensors must be the model's of that width: names, shapes and dtypes.
  bool model_tensors = false;
  bool width_from_flag = false;  // `width` is eval's --width (else a --resume's own)
  int64_t available_bytes = 0;   // where memory bounds max_width: what it had, for the message
  bool address_space_limit = false;  // ... and whether ulimit -v set it
};
// A run that builds this width (a --resume's own, or eval's --width): that width, and that
// model's tensors.
AcceptedModel accepted_run_model(int64_t width, bool width_from_flag = false);
// eval and tools: any width whose file and model fit the memory available now (and kMaxWidth);
// with `model_tensors`, the header's tensors must then be the model's of the width it claims.
AcceptedModel accepted_in_memory(bool model_tensors);

// The width a file claiming `claimed` is read at, when `accepted` allows it; before the data is
// read otherwise: a UsageError for eval's --width or a machine too small (as check_host_memory),
// a DataError for a --resume's own width (the directory's scan names such a file unreadable). A
// width no run has is a corrupt file first (check_claimed_width in checkpoint_run_state.h).
int64_t accepted_width(int64_t claimed, const AcceptedModel& accepted, const std::string& label);

}  // namespace dptrain
