// What arithmetic a replica's step runs, in words for the run's first line: its layout, its
// precision, and on CUDA whether cuDNN and cuBLAS may round float32 through TF32 and whether
// cuDNN's benchmark mode picks the algorithms. LibTorch lets cuDNN use TF32 by default, so an
// "fp32" run on a GPU since Ampere is a TF32 run for its convolutions; the line says so.
// Not here: choosing the layout (memory_format.h) or turning autocast on (autocast.h).
#pragma once

#include <torch/types.h>

#include <string>

#include "dptrain/model/autocast.h"
#include "dptrain/model/memory_format.h"

namespace dptrain {

// "channels-last, fp32" on the CPU, "channels-last, bf16 autocast on AVX512-BF16" (the bf16
// units of `cpu`, or that it has none); on CUDA, e.g. "channels-last, fp32; cuDNN: TF32 on,
// benchmark on; cuBLAS: TF32 off". `layout` is resolved (never kAuto). Reads LibTorch's global
// switches and NVIDIA_TF32_OVERRIDE (0 turns TF32 off below LibTorch), as they are now.
std::string describe_arithmetic(const torch::Device& device, MemoryFormat layout, Amp amp,
                                bool cudnn_benchmark, const CpuKernels& cpu);

// Whether cuDNN may now round `device`'s float32 convolutions through TF32: LibTorch allows it
// (its default) and NVIDIA_TF32_OVERRIDE is not 0. False on the CPU. It picks the column of the
// device's peak that MFU is measured against (train/device_peak.h).
bool convolutions_use_tf32(const torch::Device& device);

}  // namespace dptrain
