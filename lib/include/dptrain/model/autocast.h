// Mixed precision for the forward pass: an RAII guard that turns LibTorch's autocast on for one
// device type on this thread, across the 1.13 and 2.x spellings of the same switch.
// Not here: loss scaling (bfloat16 has float32's range and needs none).
#pragma once

#include <torch/types.h>

#include "dptrain/model/memory_format.h"

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

// Note [bf16 without bf16 units] (memory_format.cpp): where oneDNN cannot run bf16 on this CPU
// at all (no AVX-512, or an ISA cap below it), turns LibTorch's use of oneDNN off while it lives,
// so that LibTorch's own bf16 kernels run the convolutions, as LibTorch 2.x and LibTorch on an
// AVX2-only CPU choose by themselves; LibTorch 1.13 under such a cap fails every bf16
// convolution instead ("could not create a primitive descriptor iterator"). Does nothing for
// fp32, for GPU replicas, or where oneDNN runs AVX-512.
class CpuBf16KernelsGuard {
 public:
  CpuBf16KernelsGuard(const torch::Device& device, Amp amp, const CpuKernels& cpu);
  ~CpuBf16KernelsGuard();
  CpuBf16KernelsGuard(const CpuBf16KernelsGuard&) = delete;
  CpuBf16KernelsGuard& operator=(const CpuBf16KernelsGuard&) = delete;
  bool onednn_turned_off() const { return restore_; }

 private:
  bool restore_ = false;
  bool previous_ = true;
};

}  // namespace dptrain
