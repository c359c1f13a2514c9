// What a run accepts to read (accepted_model.h): the width it builds, or the widest model that
// fits the memory available, and the width a file's claim is read at.
#include "dptrain/train/accepted_model.h"

#include <cstdint>
#include <cstdio>
#include <string>

#include "checkpoint_run_state.h"
#include "dptrain/core/errors.h"
#include "dptrain/data/data.h"
#include "dptrain/model/model.h"
#include "dptrain/train/memory_budget.h"

namespace dptrain {

AcceptedModel accepted_run_model(int64_t width, bool width_from_flag) {
  AcceptedModel accepted;
  accepted.width = width;
  accepted.max_width = width;
  accepted.model_tensors = true;
  accepted.width_from_flag = width_from_flag;
  return accepted;
}

int64_t accepted_width(int64_t claimed, const AcceptedModel& accepted, const std::string& label) {
  check_claimed_width(claimed, label);  // a corrupt file is called so, not a machine too small
  const std::string w = std::to_string(claimed);
  if (accepted.width > 0 && claimed != accepted.width) {
    if (accepted.width_from_flag) {
      throw UsageError("--width " + std::to_string(accepted.width) + ": " + label +
                       " holds a model of width " + w +
                       " (leave --width out: the file records it); not read");
    }
    throw DataError(label + " was written for another model: --width " + w + " (this run: " +
                    std::to_string(accepted.width) + "); not read");
  }
  if (claimed <= accepted.max_width) return claimed;
  if (accepted.available_bytes > 0) {  // claimed <= kMaxWidth: the bound below is its own
    const auto gib = [](double bytes) {
      char text[32];
      std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1 << 30));
      return std::string(text);
    };
    throw UsageError(
        label + ": this machine cannot hold a width-" + w + " model: its file and weights need " +
        "about " + gib(8.0 * static_cast<double>(model_elements_bound(claimed, kNumClasses, 1))) +
        ", and " + gib(static_cast<double>(accepted.available_bytes)) + " of memory is available" +
        (accepted.address_space_limit ? " under ulimit -v" : "") + " (at most width " +
        std::to_string(accepted.max_width) + "); not read");
  }
  throw DataError(label + ": claims a model of width " + w + ", wider than this run reads (" +
                  std::to_string(accepted.max_width) + "); not read");
}

AcceptedModel accepted_in_memory(bool model_tensors) {
  AcceptedModel accepted;
  accepted.max_width = kMaxWidth;
  accepted.model_tensors = model_tensors;
  const auto available = available_host_memory();
  if (!available) return accepted;
  // The file's data and the model built from it, float32 both: 8 bytes an element.
  const auto fits = [&](int64_t w) {
    return 8 * model_elements_bound(w, kNumClasses, 1) <= static_cast<uint64_t>(available->bytes);
  };
  if (fits(kMaxWidth)) return accepted;
  int64_t low = 1, high = kMaxWidth;  // the widest that fits lies in [low, high)
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    (fits(mid) ? low : high) = mid;
  }
  accepted.max_width = low;
  accepted.available_bytes = available->bytes;
  accepted.address_space_limit = available->address_space_limit;
  return accepted;
}

}  // namespace dptrain
