// The arithmetic of a replica's step, in words. See numerics.h.
#include "dptrain/model/numerics.h"

#include <ATen/Context.h>

#include <cstdlib>
#include <cstring>

namespace dptrain {

std::string describe_arithmetic(const torch::Device& device, MemoryFormat layout, Amp amp,
                                bool cudnn_benchmark) {
  std::string text =
      memory_format_name(layout) + (amp == Amp::kBFloat16 ? ", bf16 autocast" : ", fp32");
  if (!device.is_cuda()) return text;
  // NVIDIA's libraries read NVIDIA_TF32_OVERRIDE themselves: 0 forbids TF32 whatever LibTorch
  // allows (and no other value allows more than LibTorch does).
  const char* override_tf32 = std::getenv("NVIDIA_TF32_OVERRIDE");
  const bool forbidden = override_tf32 != nullptr && std::strcmp(override_tf32, "0") == 0;
  const auto tf32 = [&](bool allowed) {
    if (forbidden) return std::string("TF32 off (NVIDIA_TF32_OVERRIDE=0)");
    return std::string(allowed ? "TF32 on" : "TF32 off");
  };
  auto& context = at::globalContext();
  text += "; cuDNN: " + tf32(context.allowTF32CuDNN()) + ", benchmark " +
          (cudnn_benchmark ? "on" : "off") + "; cuBLAS: " + tf32(context.allowTF32CuBLAS());
  return text;
}

}  // namespace dptrain
