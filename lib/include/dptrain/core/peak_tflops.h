// What the known GPUs can do: the dense peak TFLOP/s of NVIDIA data-centre GPUs at bf16, TF32
// and fp32 by the name CUDA gives them, the range of a peak any device can have, and an epoch's
// MFU against such a peak. Plain facts of devices, looked up by name: nothing here asks a device.
// Not here: which column a run takes and its device's peak (model/numerics.h), the model's FLOPs
// (model/flops.h), the run's memory peaks (devices.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dptrain {

// The arithmetic a run's convolutions use, the column of the peak table MFU is measured against.
enum class PeakPrecision { kBFloat16, kTf32, kFloat32 };

// "bf16", "TF32", "fp32"
std::string peak_precision_name(PeakPrecision precision);

// The dense peak TFLOP/s (without 2:4 structured sparsity) of the GPU whose name is exactly
// `gpu_name` as CUDA gives it (cudaDeviceProp::name, e.g. "NVIDIA H100 80GB HBM3"), at
// `precision`, from NVIDIA's datasheets; nullopt for a GPU not in the table (a consumer card,
// a GPU older than Ampere, a name that differs in a character).
std::optional<double> table_peak_tflops(const std::string& gpu_name, PeakPrecision precision);

// Note [A plausible device's peak]
// A peak is a device's, so --peak-tflops takes one a device can have: from kMinPeakTflops, 10^-6
// TFLOP/s (1 MFLOP/s, the order of an 80387 coprocessor of 1987; every CPU LibTorch runs on,
// x86-64 with SSE2 or AArch64 with NEON, does a GFLOP/s a core and more), to kMaxPeakTflops,
// 10^5 TFLOP/s (100 PFLOP/s; the fastest GPUs listed today, NVIDIA's Blackwell, do about 2,500
// TFLOP/s dense in bf16 and at most some 15,000 dense at any precision, FP4). 1e-308 would give
// an MFU of 3e306. A run's TFLOP/s stays below kMaxPeakTflops a device too, which bounds what a
// checkpoint may claim (check_checkpoint_contents). An MFU is at most 1: a run whose counted
// FLOPs a second exceed the peak (a --peak-tflops below the device's real one) measured against
// no real peak, and gets no MFU (NaN, as where no peak is known) rather than a figure above 1.
// The run never stops for it: the figure is a report, the training is the run's purpose.
constexpr double kMinPeakTflops = 1e-6;
constexpr double kMaxPeakTflops = 1e5;

// The MFU of an epoch that reached `tflops` on `world_size` devices of `peak_tflops` each: its
// fraction of their summed peak, from 0 to 1; NaN where either figure is NaN or the fraction is
// above 1 (Note [A plausible device's peak]).
double model_flops_utilization(double tflops, double peak_tflops, int64_t world_size);

}  // namespace dptrain
