// What arithmetic a replica's step runs, in words for the run's first line: its layout, its
// precision, and on CUDA whether cuDNN and cuBLAS may round float32 through TF32 and whether
// cuDNN's benchmark mode picks the algorithms. LibTorch lets cuDNN use TF32 by default, so an
// "fp32" run on a GPU since Ampere is a TF32 run for its convolutions; the line says so.
// The same precision picks the column of the device's peak TFLOP/s that an epoch's MFU is measured
// against. Not here: choosing the layout (memory_format.h), turning autocast on (autocast.h), or
// the peak table itself (core/peak_tflops.h).
#pragma once

#include <torch/types.h>

#include <optional>
#include <string>

#include "dptrain/core/peak_tflops.h"
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
// device's peak that MFU is measured against (peak_precision).
bool convolutions_use_tf32(const torch::Device& device);

// The precision of a run's convolutions, where nearly all its FLOPs are: bf16 under --amp bf16;
// else TF32 where cuDNN may round float32 through it (convolutions_use_tf32, model/numerics.h,
// LibTorch's default on CUDA); else fp32.
PeakPrecision peak_precision(Amp amp, bool convolutions_tf32);

// The peak of one rank's device for a run, in TFLOP/s: `given` when the run gives one
// (--peak-tflops); else on CUDA the table's figure (core/peak_tflops.h) for the device at the
// run's precision under `amp` (read from LibTorch's switches as they are now); else NaN: an
// unknown GPU or a CPU, for which nothing is claimed.
double device_peak_tflops(std::optional<double> given, Amp amp, const torch::Device& device);

}  // namespace dptrain
