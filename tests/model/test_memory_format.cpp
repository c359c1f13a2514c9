// Tests of the layout choice (memory_format.h): the defaults per device, the refusal of
// channels-last where oneDNN runs its AVX2 kernels, and how the ISA cap is read.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>

#include "dptrain/core/errors.h"
#include "dptrain/model/memory_format.h"

namespace {

using dptrain::CpuKernels;
using dptrain::MemoryFormat;
using dptrain::resolve_memory_format;

const torch::Device kCpu(torch::kCPU);
const torch::Device kCuda(torch::kCUDA, 0);

CpuKernels kernels(bool avx512, const std::string& cap = "") {
  CpuKernels cpu;
  cpu.avx512 = avx512;
  cpu.isa_cap = cap;
  return cpu;
}

TEST(ResolveMemoryFormat, AutoIsChannelsLastOnCudaAndOnAvx512KernelsElseContiguous) {
  for (const bool avx512 : {false, true}) {
    EXPECT_EQ(resolve_memory_format(MemoryFormat::kAuto, kCuda, kernels(avx512)),
              MemoryFormat::kChannelsLast);
  }
#if defined(__x86_64__) || defined(__i386__)
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kAuto, kCpu, kernels(true)),
            MemoryFormat::kChannelsLast);
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kAuto, kCpu, kernels(true, "avx512_core")),
            MemoryFormat::kChannelsLast);
#endif
  for (const auto& cpu : {kernels(false), kernels(true, "AVX2"), kernels(true, "avx2_vnni")}) {
    EXPECT_EQ(resolve_memory_format(MemoryFormat::kAuto, kCpu, cpu), MemoryFormat::kContiguous)
        << "cap '" << cpu.isa_cap << "'";
  }
}

TEST(ResolveMemoryFormat, ExplicitChoicesStandWhereTheyAreSafe) {
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kContiguous, kCpu, kernels(false)),
            MemoryFormat::kContiguous);
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kContiguous, kCuda, kernels(false)),
            MemoryFormat::kContiguous);
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kChannelsLast, kCuda, kernels(false)),
            MemoryFormat::kChannelsLast);
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kChannelsLast, kCpu, kernels(true)),
            MemoryFormat::kChannelsLast);
  EXPECT_EQ(resolve_memory_format(MemoryFormat::kChannelsLast, kCpu, kernels(true, "avx512_core")),
            MemoryFormat::kChannelsLast);
}

#if defined(__x86_64__) || defined(__i386__)
// The message, or nullopt when nothing was thrown.
std::optional<std::string> refusal(const CpuKernels& cpu) {
  try {
    resolve_memory_format(MemoryFormat::kChannelsLast, kCpu, cpu);
  } catch (const dptrain::UsageError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

TEST(ResolveMemoryFormat, ChannelsLastOnAvx2KernelsIsAUsageErrorNamingTheFlag) {
  for (const auto& cpu : {kernels(false), kernels(true, "AVX2"), kernels(true, "avx2"),
                          kernels(true, "AVX2_VNNI"), kernels(true, "SSE41")}) {
    const auto message = refusal(cpu);
    ASSERT_TRUE(message) << "not refused with cap '" << cpu.isa_cap << "'";
    EXPECT_NE(message->find("--memory-format channels-last"), std::string::npos) << *message;
    EXPECT_NE(message->find("--memory-format contiguous"), std::string::npos) << *message;
  }
  EXPECT_NE(refusal(kernels(false))->find("this CPU has no AVX-512"), std::string::npos);
  EXPECT_NE(refusal(kernels(true, "AVX2"))->find("the oneDNN ISA cap AVX2 turns AVX-512 off"),
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

}  // namespace
