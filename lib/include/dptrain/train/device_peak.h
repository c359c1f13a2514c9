// What a rank's device can do and what the run has used of its machine, for the epoch's
// efficiency figures (EpochStats::tflops, mfu, peak_host_bytes, peak_device_bytes): the dense
// peak TFLOP/s of known NVIDIA data-centre GPUs at bf16, TF32 and fp32, which of those a run's
// arithmetic is measured against, and the run's peak host and GPU memory so far.
// Not here: the model's FLOPs (model/flops.h) or the epoch's figures themselves (rank.cpp).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "dptrain/model/autocast.h"
#include "dptrain/train/options.h"

namespace dptrain {

// The arithmetic a run's convolutions use, the column of the peak table MFU is measured against.
enum class PeakPrecision { kBFloat16, kTf32, kFloat32 };

// "bf16", "TF32", "fp32"
std::string peak_precision_name(PeakPrecision precision);

// The precision of a run's convolutions, where nearly all its FLOPs are: bf16 under --amp bf16;
// else TF32 where cuDNN may round float32 through it (convolutions_use_tf32, model/numerics.h,
// LibTorch's default on CUDA); else fp32.
PeakPrecision peak_precision(Amp amp, bool convolutions_tf32);

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

// The peak of one rank's device for this run, in TFLOP/s: options.peak_tflops when given
// (--peak-tflops); else on CUDA the table's figure for the device at the run's precision (read
// from LibTorch's switches as they are now); else NaN: an unknown GPU or a CPU, for which nothing
// is claimed.
double device_peak_tflops(const TrainOptions& options, const torch::Device& device);

// The process's peak resident set size so far, in bytes (getrusage's ru_maxrss, which Linux
// gives in KiB): every replica of the process, the data and LibTorch's own memory included.
double peak_host_bytes();

// On CUDA, the largest number of bytes LibTorch's caching allocator has had allocated to tensors
// on `device` since the process started (its "allocated_bytes" peak: what the run's tensors
// needed at most, not the larger "reserved" figure that also counts the cache's free blocks).
// NaN on the CPU and in a build without CUDA.
double peak_device_bytes(const torch::Device& device);

}  // namespace dptrain
