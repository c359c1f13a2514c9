// Tests of the layout choice (memory_format.h): the defaults per device, the refusal of
// channels-last where oneDNN runs kernels below AVX2, and how the ISA cap is read.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <string>

#include "dptrain/core/errors.h"
#include "dptrain/model/memory_format.h"

namespace {

using dptrain::CpuKernels;
using dptrain::MemoryFormat;
using dptrain::resolve_memory_format;

const torch::Device kCpuDevice(torch::kCPU);
const torch::Device kCuda(torch::kCUDA, 0);

// A CPU with AVX-512 (and so AVX2), or with neither, under an ISA cap.
CpuKernels kernels(bool avx512, const std::string& cap = "") {
  CpuKernels cpu;
  cpu.avx2 = avx512;
  cpu.avx512 = avx512;
  cpu.isa_cap = cap;
  return cpu;
}

// A CPU with AVX2 and no AVX-512 (AMD EPYC up to Zen 3).
CpuKernels avx2_kernels(const std::string& cap = "") {
  auto cpu = kernels(false, cap);
  cpu.avx2 = true;
  return cpu;
}

TEST(ResolveMemoryFormat, AutoIsChannelsLastOnCudaAndOnAvx512KernelsElseContiguous) {
  for (const bool avx512 : {false, true}) {
    EXPECT_EQ(resolve_memory_format(MemoryFormat::kAuto, kCuda, kernels(avx512)),
              MemoryFormat::kChannelsLast);
  }
#if defined(__x86_64__) || defined(__i386__)
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kAuto, kCpuDevice, kernels(true)),
            MemoryFormat::kChannelsLast);
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kAuto, kCpuDevice, kernels(true, "avx512_core")),
            MemoryFormat::kChannelsLast);
#endif
  // Contiguous on AVX2 kernels, though channels-last is allowed there: Note [Why auto stays
  // contiguous on AVX2].
  for (const auto& cpu : {kernels(false), avx2_kernels(), kernels(true, "AVX2"),
                          kernels(true, "avx2_vnni"), kernels(true, "SSE41")}) {
    EXPECT_EQ(resolve_memory_format(MemoryFormat::kAuto, kCpuDevice, cpu),
              MemoryFormat::kContiguous)
        << "cap '" << cpu.isa_cap << "'";
  }
}

TEST(ResolveMemoryFormat, ExplicitChoicesStandWhereTheyAreSafe) {
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kContiguous, kCpuDevice, kernels(false)),
            MemoryFormat::kContiguous);
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kContiguous, kCuda, kernels(false)),
            MemoryFormat::kContiguous);
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kChannelsLast, kCuda, kernels(false)),
            MemoryFormat::kChannelsLast);
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kChannelsLast, kCpuDevice, kernels(true)),
            MemoryFormat::kChannelsLast);
  EXPECT_EQ(
      resolve_memory_format(MemoryFormat::kChannelsLast, kCpuDevice, kernels(true, "avx512_core")),
      MemoryFormat::kChannelsLast);
  // The AVX2 kernels, sound in channels-last with the strided 1x1 kernel out of the way (Note
  // [Channels-last on the CPU]).
  for (const auto& cpu :
       {avx2_kernels(), avx2_kernels("AVX2"), avx2_kernels("avx2_vnni"), kernels(true, "AVX2")}) {
    EXPECT_EQ(resolve_memory_format(MemoryFormat::kChannelsLast, kCpuDevice, cpu),
              MemoryFormat::kChannelsLast)
        << "cap '" << cpu.isa_cap << "'";
  }
}

#if defined(__x86_64__) || defined(__i386__)
// The message, or nullopt when nothing was thrown.
std::optional<std::string> refusal(const CpuKernels& cpu) {
  try {
    resolve_memory_format(MemoryFormat::kChannelsLast, kCpuDevice, cpu);
  } catch (const dptrain::UsageError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

TEST(ResolveMemoryFormat, ChannelsLastBelowAvx2KernelsIsAUsageErrorNamingTheFlag) {
  for (const auto& cpu : {kernels(false), kernels(true, "AVX"), kernels(true, "sse41"),
                          avx2_kernels("SSE41"), avx2_kernels("AVX")}) {
    const auto message = refusal(cpu);
    ASSERT_TRUE(message) << "not refused with cap '" << cpu.isa_cap << "'";
    EXPECT_NE(message->find("--memory-format channels-last"), std::string::npos) << *message;
    EXPECT_NE(message->find("--memory-format contiguous"), std::string::npos) << *message;
  }
  EXPECT_NE(refusal(kernels(false))->find("this CPU has no AVX2"), std::string::npos);
  EXPECT_NE(refusal(avx2_kernels("AVX"))->find("the oneDNN ISA cap AVX turns AVX2 off"),
            std::string::npos);
}
#endif

TEST(CpuKernelsTest, AnIsaCapBelowAvx512DisablesIt) {
  EXPECT_TRUE(kernels(true).runs_avx512());
  EXPECT_TRUE(kernels(true, "ALL").runs_avx512());
  EXPECT_TRUE(kernels(true, "AVX512_CORE_BF16").runs_avx512());
  EXPECT_FALSE(kernels(true, "AVX2").runs_avx512());
  EXPECT_FALSE(kernels(false).runs_avx512());
  EXPECT_FALSE(kernels(false, "ALL").runs_avx512());
}

TEST(CpuKernelsTest, AnIsaCapBelowAvx2DisablesIt) {
  EXPECT_TRUE(avx2_kernels().runs_avx2());
  EXPECT_TRUE(avx2_kernels("AVX2_VNNI").runs_avx2());
  EXPECT_TRUE(kernels(true).runs_avx2());
  EXPECT_TRUE(kernels(true, "AVX2").runs_avx2());
  EXPECT_FALSE(avx2_kernels().runs_avx512());
  EXPECT_FALSE(avx2_kernels("AVX").runs_avx2());
  EXPECT_FALSE(kernels(true, "SSE41").runs_avx2());
  EXPECT_FALSE(kernels(false).runs_avx2());
  EXPECT_FALSE(kernels(false, "ALL").runs_avx2());
}

// Sets an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DetectCpuKernels, ReadsOneDnnsCapUnderEitherName) {
  {
    const ScopedEnv onednn("ONEDNN_MAX_CPU_ISA", "AVX2");
    const ScopedEnv dnnl("DNNL_MAX_CPU_ISA", nullptr);
    EXPECT_EQ(dptrain::detect_cpu_kernels().isa_cap, "AVX2");
    EXPECT_FALSE(dptrain::detect_cpu_kernels().runs_avx512());
  }
  {
    const ScopedEnv onednn("ONEDNN_MAX_CPU_ISA", nullptr);
    const ScopedEnv dnnl("DNNL_MAX_CPU_ISA", "AVX");
    EXPECT_EQ(dptrain::detect_cpu_kernels().isa_cap, "AVX");
  }
  {
    // The newer name wins, as in oneDNN.
    const ScopedEnv onednn("ONEDNN_MAX_CPU_ISA", "AVX512_CORE");
    const ScopedEnv dnnl("DNNL_MAX_CPU_ISA", "AVX2");
    EXPECT_EQ(dptrain::detect_cpu_kernels().isa_cap, "AVX512_CORE");
  }
}

// The flags Linux reads from CPUID for this machine's first processor in /proc/cpuinfo.
std::set<std::string> cpuinfo_flags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    return {std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
  }
  return {};
}

// detect_cpu_kernels reads CPUID itself; Linux's own reading of it must agree on this machine
// (an AVX2-only EPYC, a Zen 4 with AVX512-BF16, a Xeon with AMX: each says its own).
TEST(DetectCpuKernels, Bf16UnitsAgreeWithTheKernelsCpuFlags) {
#if defined(__x86_64__) || defined(__i386__)
  const auto flags = cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "/proc/cpuinfo has no flags line here";
  const ScopedEnv onednn("ONEDNN_MAX_CPU_ISA", nullptr);
  const ScopedEnv dnnl("DNNL_MAX_CPU_ISA", nullptr);
  const auto cpu = dptrain::detect_cpu_kernels();
  const bool avx512 = flags.count("avx512f") && flags.count("avx512bw") &&
                      flags.count("avx512vl") && flags.count("avx512dq");
  EXPECT_EQ(cpu.avx512, avx512);
  EXPECT_EQ(cpu.avx2, flags.count("avx2") > 0 && flags.count("fma") > 0);
  EXPECT_EQ(cpu.avx512_bf16, avx512 && flags.count("avx512_bf16") > 0);
  EXPECT_EQ(cpu.amx_bf16, avx512 && flags.count("amx_bf16") > 0);
  const std::string expected = !avx512                      ? ""
                               : flags.count("amx_bf16")    ? "AMX"
                               : flags.count("avx512_bf16") ? "AVX512-BF16"
                                                            : "";
  EXPECT_EQ(cpu.bf16_units(), expected);
#else
  GTEST_SKIP() << "CPUID is read on x86 only";
#endif
}

TEST(CpuKernelsTest, AnIsaCapTurnsBf16UnitsOffBelowTheirLevel) {
  CpuKernels amx = kernels(true);
  amx.avx512_bf16 = amx.amx_bf16 = true;
  EXPECT_EQ(amx.bf16_units(), "AMX");
  amx.isa_cap = "avx512_core_bf16";
  EXPECT_EQ(amx.bf16_units(), "AVX512-BF16");
  amx.isa_cap = "AVX512_CORE";
  EXPECT_EQ(amx.bf16_units(), "");
  EXPECT_TRUE(amx.runs_avx512());
  amx.isa_cap = "AVX2";
  EXPECT_EQ(amx.bf16_units(), "");
  CpuKernels zen4 = kernels(true);
  zen4.avx512_bf16 = true;
  EXPECT_EQ(zen4.bf16_units(), "AVX512-BF16");
  zen4.isa_cap = "AVX512_CORE_AMX";  // a cap above the CPU allows what it has
  EXPECT_EQ(zen4.bf16_units(), "AVX512-BF16");
  EXPECT_EQ(kernels(false).bf16_units(), "");
}

}  // namespace
