// Autocast on and off for one device type. See autocast.h.
#include "dptrain/model/autocast.h"
#include "dptrain/model/memory_format.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace dptrain {
namespace {

// LibTorch 2.x takes the device type as an argument; 1.13 has a function per device type.
void set_autocast(torch::DeviceType type, bool enabled) {
#if TORCH_VERSION_MAJOR >= 2
  if (enabled) at::autocast::set_autocast_dtype(type, torch::kBFloat16);
  at::autocast::set_autocast_enabled(type, enabled);
#else
  if (type == torch::kCUDA) {
    if (enabled) at::autocast::set_autocast_gpu_dtype(torch::kBFloat16);
    at::autocast::set_enabled(enabled);
  } else {
    if (enabled) at::autocast::set_autocast_cpu_dtype(torch::kBFloat16);
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

}  // namespace

AutocastGuard::AutocastGuard(const torch::Device& device, Amp amp)
    : active_(amp != Amp::kOff), device_type_(device.type()) {
  if (active_) set_autocast(device_type_, true);
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  set_autocast(device_type_, false);
  // Casted copies of the weights are cached for one forward pass; the next step's weights differ.
  at::autocast::clear_cache();
}

CpuBf16KernelsGuard::CpuBf16KernelsGuard(const torch::Device& device, Amp amp,
                                         const CpuKernels& cpu) {
  if (!device.is_cpu() || amp != Amp::kBFloat16 || cpu.runs_avx512()) return;
  previous_ = at::globalContext().userEnabledMkldnn();
  restore_ = previous_;
  if (restore_) at::globalContext().setUserEnabledMkldnn(false);
}

CpuBf16KernelsGuard::~CpuBf16KernelsGuard() {
  if (restore_) at::globalContext().setUserEnabledMkldnn(previous_);
}

}  // namespace dptrain
