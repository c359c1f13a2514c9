// Choosing the memory layout per device. See memory_format.h.
#include "dptrain/model/memory_format.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "dptrain/core/errors.h"

namespace dptrain {

// Note [Channels-last on the CPU]
// LibTorch runs CPU convolutions in channels-last through oneDNN. On a CPU without AVX-512
// (AMD EPYC up to Zen 3, many laptops) oneDNN picks its AVX2 kernels, and their convolution
// backward writes past the end of a heap block: in Debian's LibTorch 1.13 and in PyPI's 2.11
// alike, a 1x1 stride-2 convolution from 4 to 8 channels (the book's stage-2 shortcut at
// --width 4) aborts with "double free or corruption", and valgrind names an 8-byte write past
// a 3,264-byte block. scripts/repro/channels_last_heap.py shows it in PyTorch alone, on any x86
// CPU: ONEDNN_MAX_CPU_ISA=AVX2 (or valgrind, which has no AVX-512) selects those kernels.
// Every width from 1 to 7 breaks, so there the CPU default is contiguous, and an explicit
// channels-last request is refused.
//
// The AVX-512 kernels are other code, and valgrind cannot run them. The guarded allocator
// (cpu_allocator.h) can check them: it puts every tensor's end against an inaccessible page,
// which stops oneDNN's generated code too. It stops the AVX2 overrun above at the faulting
// write, and it trains the book's model in channels-last on the AVX-512 kernels at every width
// from 1 to 16, at batches of 256 and 96, on 1 and 2 threads, and at width 64, without a fault
// (tests/model/test_guarded_kernels.cpp, on every machine that has AVX-512). At odd batches the
// AVX-512 kernels did break, in both layouts and both LibTorch versions, in the same strided
// 1x1 convolution (the weight gradient of the stage-2 shortcut came back as 2.2e21 at width 4,
// batch 31); dptrain no longer runs that kernel on the CPU (Note [The strided 1x1 convolution
// on the CPU], projection.cpp). Channels-last is the faster layout there (at width 16 on 2
// threads: bench/results/2026-12-01-cpu-notes.md), and the layout in which BatchNorm, the
// shortcut and the ReLU run fused (fused_batch_norm.h), so where oneDNN runs AVX-512 the CPU
// default is channels-last. Whether the AVX2 kernels are sound once the strided 1x1 kernel is
// out of the way is not shown yet, so there channels-last stays refused. CUDA convolutions are
// cuDNN's: channels-last is their fast layout, and the default there.

namespace {

std::string upper(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return text;
}

// The values of oneDNN's ISA cap that keep it below AVX-512 (oneDNN's documented names; any
// other value leaves AVX-512 allowed, as oneDNN ignores names it does not know).
bool caps_below_avx512(const std::string& cap) {
  const std::string value = upper(cap);
  for (const char* lower : {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2"}) {
    if (value == lower) return true;
  }
  return false;
}

}  // namespace

std::string memory_format_name(MemoryFormat format) {
  switch (format) {
    case MemoryFormat::kAuto:
      return "auto";
    case MemoryFormat::kChannelsLast:
      return "channels-last";
    case MemoryFormat::kContiguous:
      return "contiguous";
  }
  return "auto";
}

bool CpuKernels::runs_avx512() const { return avx512 && !caps_below_avx512(isa_cap); }

std::string CpuKernels::describe() const {
  if (runs_avx512()) return "this CPU has AVX-512";
  if (avx512) return "the oneDNN ISA cap " + isa_cap + " turns AVX-512 off";
  return "this CPU has no AVX-512";
}

CpuKernels detect_cpu_kernels() {
  CpuKernels cpu;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
  // oneDNN reads ONEDNN_MAX_CPU_ISA first, then its older name.
  for (const char* name : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    if (const char* value = std::getenv(name); value && *value) {
      cpu.isa_cap = value;
      break;
    }
  }
  return cpu;
}

MemoryFormat resolve_memory_format(MemoryFormat requested, const torch::Device& device,
                                   [[maybe_unused]] const CpuKernels& cpu) {
  if (!device.is_cpu()) {
    return requested == MemoryFormat::kAuto ? MemoryFormat::kChannelsLast : requested;
  }
#if defined(__x86_64__) || defined(__i386__)
  if (requested == MemoryFormat::kAuto) {
    return cpu.runs_avx512() ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
  }
  if (requested == MemoryFormat::kChannelsLast && !cpu.runs_avx512()) {
    throw UsageError("--memory-format channels-last on the CPU: " + cpu.describe() +
                     ", so oneDNN runs its AVX2 (or older) kernels, whose channels-last "
                     "convolution backward corrupts the heap (an upstream LibTorch bug: "
                     "scripts/repro/channels_last_heap.py); use --memory-format contiguous, "
                     "the CPU default");
  }
#endif
  return requested == MemoryFormat::kAuto ? MemoryFormat::kContiguous : requested;
}

}  // namespace dptrain
