// Choosing the memory layout per device. See memory_format.h.
#include "dptrain/model/memory_format.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "dptrain/core/errors.h"

namespace dptrain {

// Note [Channels-last on the CPU]
// LibTorch runs CPU convolutions through oneDNN, which picks its kernels by the CPU's instruction
// set. One of them is broken: the backward of the 1x1 stride-2 convolution writes past its
// buffers (Note [The strided 1x1 convolution on the CPU], projection.cpp). On the AVX2 kernels
// (AMD EPYC up to Zen 3, many laptops) it does so at a batch of 256 in channels-last: the book's
// stage-2 shortcut at widths 1 to 7 aborts with "double free or corruption", in Debian's LibTorch
// 1.13 and PyPI's 2.11 alike (scripts/repro/channels_last_heap.py, in PyTorch alone;
// ONEDNN_MAX_CPU_ISA=AVX2 selects those kernels on any x86 CPU). dptrain never runs that kernel
// on the CPU: it subsamples and convolves at unit stride. With it out of the way, every other
// kernel of the book's model stays inside its tensors in channels-last under the guarded
// allocator (cpu_allocator.h: each tensor's end against an inaccessible page, which stops
// oneDNN's generated code too), on the AVX2 kernels and on the AVX-512 ones: a training step at
// every width from 1 to 16 at batches of 256 and 96 (and 31 on AVX2), on 1 and 2 threads, and at
// width 64 (tests/model/test_guarded_kernels.cpp, where the shortcut's native strided kernel
// faults at the guard page). Memcheck, which runs the AVX2 kernels, agrees at widths 4 and 16
// (docs/channels-last.md). So channels-last is allowed wherever oneDNN runs AVX2 kernels or
// better. Below AVX2 (a CPU without it, or an ISA cap of SSE41 or AVX) no CI test runs those
// kernels in it, and channels-last is refused. CUDA convolutions are cuDNN's: channels-last is
// their fast layout, and the default there.
//
// Note [Why auto stays contiguous on AVX2]
// Channels-last is the faster CPU layout (at width 16 on 2 threads: about 1.3x on AVX-512,
// bench/results/2026-12-01-cpu-notes.md, and 1.17x on an AVX2 EPYC,
// bench/results/2026-12-07-cpu-avx2-channels-last.md), and the layout in which BatchNorm, the
// shortcut and the ReLU run fused (fused_batch_norm.h). Where oneDNN runs AVX-512 it is the
// default. Where it runs AVX2 the default stays contiguous: a layout changes the rounding, and a
// run with every default, the book's, keeps the bits it had on such a CPU. `--recipe fast` asks
// for channels-last (app/recipe_flags.cpp), as may any user.

namespace {

std::string upper(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return text;
}

// The units oneDNN's kernels may use, from lowest to highest; each ISA cap oneDNN documents
// allows those up to one of them.
enum class IsaLevel { kBelowAvx2, kAvx2, kAvx512, kAvx512Bf16, kAmx };

// The level `cap` allows; none for a name oneDNN does not know (it ignores those) or "ALL".
std::optional<IsaLevel> cap_level(const std::string& cap) {
  static const std::pair<const char*, IsaLevel> kCaps[] = {
      {"SSE41", IsaLevel::kBelowAvx2},
      {"AVX", IsaLevel::kBelowAvx2},
      {"AVX2", IsaLevel::kAvx2},
      {"AVX2_VNNI", IsaLevel::kAvx2},
      {"AVX2_VNNI_2", IsaLevel::kAvx2},
      {"AVX512_CORE", IsaLevel::kAvx512},
      {"AVX512_CORE_VNNI", IsaLevel::kAvx512},
      {"AVX512_CORE_BF16", IsaLevel::kAvx512Bf16},
      {"AVX512_CORE_FP16", IsaLevel::kAvx512Bf16},
      {"AVX10_1_512", IsaLevel::kAvx512Bf16},
      {"AVX10_2_512", IsaLevel::kAvx512Bf16},
      {"AVX512_CORE_AMX", IsaLevel::kAmx},
      {"AVX512_CORE_AMX_FP16", IsaLevel::kAmx},
      {"AVX10_1_512_AMX", IsaLevel::kAmx},
      {"AVX10_1_512_AMX_FP16", IsaLevel::kAmx},
      {"AVX10_2_512_AMX_2", IsaLevel::kAmx},
  };
  const std::string value = upper(cap);
  for (const auto& [name, level] : kCaps) {
    if (value == name) return level;
  }
  return std::nullopt;
}

bool cap_allows(const std::string& cap, IsaLevel level) {
  const auto allowed = cap_level(cap);
  return !allowed || *allowed >= level;
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

bool CpuKernels::runs_avx512() const { return avx512 && cap_allows(isa_cap, IsaLevel::kAvx512); }

bool CpuKernels::runs_avx2() const {
  return (avx2 || avx512) && cap_allows(isa_cap, IsaLevel::kAvx2);
}

std::string CpuKernels::describe_avx2() const {
  if (runs_avx2()) return "this CPU has AVX2";
  if (avx2 || avx512) return "the oneDNN ISA cap " + isa_cap + " turns AVX2 off";
  return "this CPU has no AVX2";
}

// Note [bf16 without bf16 units]
// Under bf16 autocast the convolutions and the linear layer run in bf16 through oneDNN. Where
// the CPU has AVX512-BF16 (AMD Zen 4 and later, Intel since Cooper Lake) oneDNN's kernels take
// two bf16 products per fp32 lane in one instruction, and AMX (Intel since Sapphire Rapids)
// multiplies whole bf16 tiles. Without them a bf16 run still trains, slower than fp32: with
// AVX-512 oneDNN emulates the bf16 products; without AVX-512 oneDNN has no bf16 kernels, and
// LibTorch's own (generic) bf16 convolutions run instead (LibTorch picks them by itself on such
// a CPU; under an ISA cap LibTorch 1.13 does not, so dptrain turns oneDNN off for the run:
// CpuBf16KernelsGuard in autocast.h). The run's first line says which of these a bf16 run gets.
// bf16 runs faster than fp32 on AMX, at a fraction of fp32's speed emulated on AVX-512, and far
// slower on LibTorch's kernels (bench/results/2026-12-04-cpu-bf16-units.md, one Xeon with the
// units capped away). The cap is no stand-in for an AVX512-BF16 CPU: a Xeon capped to AVX512-BF16
// runs slower than a CPU that has only those units (the same file).
std::string CpuKernels::bf16_units() const {
  if (!runs_avx512()) return "";
  if (amx_bf16 && cap_allows(isa_cap, IsaLevel::kAmx)) return "AMX";
  if ((avx512_bf16 || amx_bf16) && cap_allows(isa_cap, IsaLevel::kAvx512Bf16)) {
    return "AVX512-BF16";
  }
  return "";
}

std::string CpuKernels::describe_bf16() const {
  if (const auto units = bf16_units(); !units.empty()) return "on " + units;
  const std::string why = avx512 && (avx512_bf16 || amx_bf16)
                              ? "the oneDNN ISA cap " + isa_cap + " turns this CPU's off"
                          : avx512 ? "this CPU has neither AVX512-BF16 nor AMX"
                                   : "this CPU has no AVX-512, so neither AVX512-BF16 nor AMX";
  const std::string how = runs_avx512()
                              ? "oneDNN emulates bf16 on AVX-512, a few times slower than fp32"
                              : "LibTorch's own bf16 kernels run it, many times slower than fp32";
  return "without bf16 units (" + why + "; " + how + "; --amp off is faster)";
}

CpuKernels detect_cpu_kernels() {
  CpuKernels cpu;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  cpu.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  // CPUID leaf 7: subleaf 1's EAX bit 5 is AVX512-BF16, subleaf 0's EDX bit 22 AMX-BF16. Both
  // use AVX-512's registers or tiles, so they count only where AVX-512 itself is usable.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (cpu.avx512 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
    cpu.avx512_bf16 = (eax >> 5) & 1U;
  }
  if (cpu.avx512 && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    cpu.amx_bf16 = (edx >> 22) & 1U;
  }
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
  if (requested == MemoryFormat::kChannelsLast && !cpu.runs_avx2()) {
    throw UsageError("--memory-format channels-last on the CPU: " + cpu.describe_avx2() +
                     ", so oneDNN runs kernels that no test has shown sound in channels-last "
                     "(docs/channels-last.md); use --memory-format contiguous, the CPU default "
                     "(after --recipe, whose fast preset asks for channels-last)");
  }
#endif
  return requested == MemoryFormat::kAuto ? MemoryFormat::kContiguous : requested;
}

}  // namespace dptrain
