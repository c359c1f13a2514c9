// The arithmetic of a replica's step, in words. See numerics.h.
#include "dptrain/model/numerics.h"

#include <ATen/Context.h>
#include <torch/version.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include "dptrain/core/peak_tflops.h"
#include "dptrain/model/autocast.h"
#include "dptrain/model/memory_format.h"
#include <optional>

#if defined(DPTRAIN_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

namespace dptrain {
namespace {

// Whether LibTorch lets cuDNN's convolutions and cuBLAS's matrix products round float32 through
// TF32. LibTorch 2.9 replaced the two allowTF32 switches by a precision per backend and operation
// and deprecated the old getters (2.11's allowTF32CuDNN() throws once convolutions and RNNs
// differ), so each version is asked in its own words. In the new settings "none" means "as the
// level above says" (cuDNN's convolutions, then all CUDA operations, then every backend), and none
// set anywhere is IEEE.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
bool tf32_allowed(at::Float32Op op) {
  const auto& context = at::globalContext();
  for (const auto& [backend, level] :
       {std::pair{at::Float32Backend::CUDA, op},
        std::pair{at::Float32Backend::CUDA, at::Float32Op::ALL},
        std::pair{at::Float32Backend::GENERIC, at::Float32Op::ALL}}) {
    const auto precision = context.float32Precision(backend, level);
    if (precision != at::Float32Precision::NONE) return precision == at::Float32Precision::TF32;
  }
  return false;
}
bool cudnn_tf32() { return tf32_allowed(at::Float32Op::CONV); }
bool cublas_tf32() { return tf32_allowed(at::Float32Op::MATMUL); }
#else
bool cudnn_tf32() { return at::globalContext().allowTF32CuDNN(); }
bool cublas_tf32() { return at::globalContext().allowTF32CuBLAS(); }
#endif

// NVIDIA's libraries read NVIDIA_TF32_OVERRIDE themselves: 0 forbids TF32 whatever LibTorch
// allows (and no other value allows more than LibTorch does).
bool tf32_forbidden_by_environment() {
  const char* override_tf32 = std::getenv("NVIDIA_TF32_OVERRIDE");
  return override_tf32 != nullptr && std::strcmp(override_tf32, "0") == 0;
}

}  // namespace

std::string describe_arithmetic(const torch::Device& device, MemoryFormat layout, Amp amp,
                                bool cudnn_benchmark, const CpuKernels& cpu) {
  std::string text =
      memory_format_name(layout) + (amp == Amp::kBFloat16 ? ", bf16 autocast" : ", fp32");
  if (device.is_cpu() && amp == Amp::kBFloat16) text += " " + cpu.describe_bf16();
  if (!device.is_cuda()) return text;
  const bool forbidden = tf32_forbidden_by_environment();
  const auto tf32 = [&](bool allowed) {
    if (forbidden) return std::string("TF32 off (NVIDIA_TF32_OVERRIDE=0)");
    return std::string(allowed ? "TF32 on" : "TF32 off");
  };
  text += "; cuDNN: " + tf32(cudnn_tf32()) + ", benchmark " + (cudnn_benchmark ? "on" : "off") +
          "; cuBLAS: " + tf32(cublas_tf32());
  return text;
}

bool convolutions_use_tf32(const torch::Device& device) {
  return device.is_cuda() && !tf32_forbidden_by_environment() && cudnn_tf32();
}

PeakPrecision peak_precision(Amp amp, bool convolutions_tf32) {
  if (amp == Amp::kBFloat16) return PeakPrecision::kBFloat16;
  return convolutions_tf32 ? PeakPrecision::kTf32 : PeakPrecision::kFloat32;
}

double device_peak_tflops(std::optional<double> given, Amp amp, const torch::Device& device) {
  if (given) return *given;
#if defined(DPTRAIN_WITH_CUDA)
  if (device.is_cuda()) {
    const auto* properties = at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0);
    const auto peak = table_peak_tflops(properties->name,
                                        peak_precision(amp, convolutions_use_tf32(device)));
    return peak ? *peak : std::numeric_limits<double>::quiet_NaN();
  }
#else
  (void)amp;
  (void)device;
#endif
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace dptrain
