// The memory layout of a replica's weights and activations: channels-last (N, H, W, C) or
// contiguous (N, C, H, W), chosen per device from evidence, and refused where no test has shown
// LibTorch's kernels sound in it. Not here: converting a model (model.h) or its inputs
// (batch_input.h).
#pragma once

#include <torch/types.h>

#include <string>

namespace dptrain {

enum class MemoryFormat {
  kAuto,          // channels-last on CUDA and where oneDNN runs AVX-512, else contiguous
                  // (Note [Channels-last on the CPU], Note [Why auto stays contiguous on AVX2])
  kChannelsLast,  // (N, H, W, C)
  kContiguous,    // (N, C, H, W), PyTorch's default
};

std::string memory_format_name(MemoryFormat format);

// The instruction set oneDNN, LibTorch's CPU convolution library, runs its kernels with.
struct CpuKernels {
  bool avx2 = false;             // the CPU has AVX2 and FMA (oneDNN's "avx2")
  bool avx512 = false;           // the CPU has AVX-512 F, BW, VL and DQ (oneDNN's "avx512_core")
  bool avx512_bf16 = false;      // and bf16 dot products, AVX512-BF16 ("avx512_core_bf16")
  bool amx_bf16 = false;         // and AMX tiles with bf16 ("avx512_core_amx")
  std::string isa_cap;           // ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA as set, else empty
  bool runs_avx512() const;      // avx512, and no cap below AVX-512
  bool runs_avx2() const;        // avx2 (or avx512), and no cap below AVX2
  std::string describe_avx2() const;  // "this CPU has no AVX2", for messages
  // The bf16 units oneDNN's kernels run on: "AMX", "AVX512-BF16", or "" where the CPU has none
  // or the ISA cap turns them off (Note [bf16 without bf16 units]).
  std::string bf16_units() const;
  // What a bf16 autocast run computes on, for the run's first line: "on AVX512-BF16", or
  // "without bf16 units (...)" saying why and what to expect.
  std::string describe_bf16() const;
};

// This process's CPU and environment.
CpuKernels detect_cpu_kernels();

// The layout a replica on `device` uses: kAuto resolved, never kAuto itself. Throws UsageError
// naming --memory-format for channels-last on a CPU whose oneDNN runs kernels below AVX2, where
// no test has shown them sound in it.
MemoryFormat resolve_memory_format(MemoryFormat requested, const torch::Device& device,
                                   const CpuKernels& cpu);

}  // namespace dptrain
