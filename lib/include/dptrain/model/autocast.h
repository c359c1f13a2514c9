// Mixed precision for the forward pass: an RAII guard that turns LibTorch's autocast on for one
// device type on this thread, across the 1.13 and 2.x spellings of the same switch.
// Not here: loss scaling (bfloat16 has float32's range and needs none).
#pragma once

#include <torch/types.h>

namespace dptrain {

enum class Amp { kOff, kBFloat16 };

class AutocastGuard {
 public:
  // Does nothing when `amp` is kOff.
  AutocastGuard(const torch::Device& device, Amp amp);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  torch::DeviceType device_type_ = torch::kCPU;
};

}  // namespace dptrain
