// The arithmetic the run's first line announces (numerics.h): exact texts for the CPU and, from
// LibTorch's switches alone (no GPU needed), for CUDA, with TF32 allowed, disallowed and
// forbidden below LibTorch by NVIDIA_TF32_OVERRIDE.
#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/model/numerics.h"

namespace {

using namespace dptrain;

// A CPU with AVX-512 and no bf16 units, as the AMD EPYC of Zen 3 and Intel's Skylake server.
const CpuKernels kNoBf16Units = [] {
  CpuKernels cpu;
  cpu.avx512 = true;
  return cpu;
}();

CpuKernels with_avx512_bf16(bool amx, const std::string& cap = "") {
  CpuKernels cpu = kNoBf16Units;
  cpu.avx512_bf16 = true;
  cpu.amx_bf16 = amx;
  cpu.isa_cap = cap;
  return cpu;
}

// Restores LibTorch's TF32 switches and NVIDIA_TF32_OVERRIDE when a test ends.
class Tf32Switches : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* value = std::getenv("NVIDIA_TF32_OVERRIDE");
    had_override_ = value != nullptr;
    if (had_override_) override_ = value;
    ::unsetenv("NVIDIA_TF32_OVERRIDE");
  }
  void TearDown() override {
    at::globalContext().setAllowTF32CuDNN(cudnn_);
    at::globalContext().setAllowTF32CuBLAS(cublas_);
    if (had_override_) {
      ::setenv("NVIDIA_TF32_OVERRIDE", override_.c_str(), 1);
    } else {
      ::unsetenv("NVIDIA_TF32_OVERRIDE");
    }
  }

 private:
  bool cudnn_ = at::globalContext().allowTF32CuDNN();
  bool cublas_ = at::globalContext().allowTF32CuBLAS();
  bool had_override_ = false;
  std::string override_;
};

TEST_F(Tf32Switches, CpuSaysLayoutAndPrecisionOnly) {
  const torch::Device cpu(torch::kCPU);
  EXPECT_EQ(describe_arithmetic(cpu, MemoryFormat::kContiguous, Amp::kOff, true, kNoBf16Units),
            "contiguous, fp32");
  EXPECT_EQ(describe_arithmetic(cpu, MemoryFormat::kChannelsLast, Amp::kBFloat16, false,
                                with_avx512_bf16(false)),
            "channels-last, bf16 autocast on AVX512-BF16");
  EXPECT_EQ(describe_arithmetic(cpu, MemoryFormat::kChannelsLast, Amp::kOff, false,
                                with_avx512_bf16(true)),
            "channels-last, fp32");
}

// Note [bf16 without bf16 units] in memory_format.cpp: the first line of a bf16 run says what
// its products run on, and where there is nothing to run them on, why and what to expect.
TEST_F(Tf32Switches, CpuBf16SaysWhichUnitsRunItOrThatNoneDo) {
  const torch::Device cpu(torch::kCPU);
  const auto bf16 = [&](const CpuKernels& kernels) {
    return describe_arithmetic(cpu, MemoryFormat::kContiguous, Amp::kBFloat16, false, kernels);
  };
  EXPECT_EQ(bf16(with_avx512_bf16(true)), "contiguous, bf16 autocast on AMX");
  EXPECT_EQ(bf16(with_avx512_bf16(true, "AVX512_CORE_BF16")),
            "contiguous, bf16 autocast on AVX512-BF16");
  EXPECT_EQ(bf16(kNoBf16Units),
            "contiguous, bf16 autocast without bf16 units (this CPU has neither AVX512-BF16 nor "
            "AMX; oneDNN emulates bf16 on AVX-512, a few times slower than fp32; --amp off is "
            "faster)");
  EXPECT_EQ(bf16(CpuKernels{}),
            "contiguous, bf16 autocast without bf16 units (this CPU has no AVX-512, so neither "
            "AVX512-BF16 nor AMX; LibTorch's own bf16 kernels run it, many times slower than "
            "fp32; --amp off is faster)");
  EXPECT_EQ(bf16(with_avx512_bf16(true, "avx2")),
            "contiguous, bf16 autocast without bf16 units (the oneDNN ISA cap avx2 turns this "
            "CPU's off; LibTorch's own bf16 kernels run it, many times slower than fp32; --amp "
            "off is faster)");
  EXPECT_EQ(bf16(with_avx512_bf16(false, "AVX512_CORE_VNNI")),
            "contiguous, bf16 autocast without bf16 units (the oneDNN ISA cap AVX512_CORE_VNNI "
            "turns this CPU's off; oneDNN emulates bf16 on AVX-512, a few times slower than "
            "fp32; --amp off is faster)");
  // A name oneDNN does not know caps nothing, as oneDNN ignores it.
  EXPECT_EQ(bf16(with_avx512_bf16(false, "ALL")), "contiguous, bf16 autocast on AVX512-BF16");
  EXPECT_EQ(bf16(with_avx512_bf16(true, "AVX10_1_512_AMX")), "contiguous, bf16 autocast on AMX");
}

TEST_F(Tf32Switches, CudaSaysWhetherCudnnAndCublasMayUseTf32) {
  const torch::Device gpu(torch::kCUDA, 0);
  at::globalContext().setAllowTF32CuDNN(true);
  at::globalContext().setAllowTF32CuBLAS(false);
  EXPECT_EQ(describe_arithmetic(gpu, MemoryFormat::kChannelsLast, Amp::kOff, true, kNoBf16Units),
            "channels-last, fp32; cuDNN: TF32 on, benchmark on; cuBLAS: TF32 off");
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(true);
  EXPECT_EQ(
      describe_arithmetic(gpu, MemoryFormat::kContiguous, Amp::kBFloat16, false, kNoBf16Units),
      "contiguous, bf16 autocast; cuDNN: TF32 off, benchmark off; cuBLAS: TF32 on");
}

TEST_F(Tf32Switches, NvidiaOverrideZeroForbidsTf32WhateverLibTorchAllows) {
  const torch::Device gpu(torch::kCUDA, 0);
  at::globalContext().setAllowTF32CuDNN(true);
  at::globalContext().setAllowTF32CuBLAS(true);
  ::setenv("NVIDIA_TF32_OVERRIDE", "0", 1);
  EXPECT_EQ(describe_arithmetic(gpu, MemoryFormat::kChannelsLast, Amp::kOff, true, kNoBf16Units),
            "channels-last, fp32; cuDNN: TF32 off (NVIDIA_TF32_OVERRIDE=0), benchmark on; "
            "cuBLAS: TF32 off (NVIDIA_TF32_OVERRIDE=0)");
  ::setenv("NVIDIA_TF32_OVERRIDE", "1", 1);  // allows no more than LibTorch does
  EXPECT_EQ(describe_arithmetic(gpu, MemoryFormat::kChannelsLast, Amp::kOff, true, kNoBf16Units),
            "channels-last, fp32; cuDNN: TF32 on, benchmark on; cuBLAS: TF32 on");
}

// The column of a GPU's peak that MFU is measured against follows cuDNN's switch and the override
// (peak_precision); a CPU has no TF32.
TEST_F(Tf32Switches, ConvolutionsUseTf32WhereCudnnMayAndTheOverrideAllows) {
  const torch::Device gpu(torch::kCUDA, 0);
  at::globalContext().setAllowTF32CuDNN(true);
  at::globalContext().setAllowTF32CuBLAS(false);
  EXPECT_TRUE(convolutions_use_tf32(gpu));
  EXPECT_FALSE(convolutions_use_tf32(torch::Device(torch::kCPU)));
  ::setenv("NVIDIA_TF32_OVERRIDE", "0", 1);
  EXPECT_FALSE(convolutions_use_tf32(gpu));
  ::unsetenv("NVIDIA_TF32_OVERRIDE");
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(true);
  EXPECT_FALSE(convolutions_use_tf32(gpu));
}

// ---- The device's peak for a run's precision ------------------------------------------------

TEST(PeakPrecision, BfloatUnderAmpElseTf32WhereAllowedElseFp32) {
  EXPECT_EQ(peak_precision(Amp::kBFloat16, true), PeakPrecision::kBFloat16);
  EXPECT_EQ(peak_precision(Amp::kBFloat16, false), PeakPrecision::kBFloat16);
  EXPECT_EQ(peak_precision(Amp::kOff, true), PeakPrecision::kTf32);
  EXPECT_EQ(peak_precision(Amp::kOff, false), PeakPrecision::kFloat32);
  EXPECT_EQ(peak_precision_name(PeakPrecision::kTf32), "TF32");
}

TEST(DevicePeak, TheCpuHasNoneUnlessTheFlagGivesIt) {
  EXPECT_TRUE(std::isnan(device_peak_tflops(std::nullopt, Amp::kOff, torch::kCPU)));
  EXPECT_TRUE(std::isnan(device_peak_tflops(std::nullopt, Amp::kBFloat16, torch::kCPU)));
  EXPECT_EQ(device_peak_tflops(2.5, Amp::kBFloat16, torch::kCPU), 2.5);
}

TEST(DevicePeak, TheFlagWinsOverTheTableOnAGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  EXPECT_EQ(device_peak_tflops(123.0, Amp::kOff, torch::Device(torch::kCUDA, 0)), 123.0);
}

// LibTorch's warnings, collected while it lives, every TORCH_WARN_ONCE included. The handler's
// interface and namespace changed in LibTorch 2.
#if TORCH_VERSION_MAJOR >= 2
namespace warnings = c10::WarningUtils;
class WarningCollector : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;
};
#else
namespace warnings = c10::Warning;
class WarningCollector : public c10::WarningHandler {
 public:
  void process(const c10::SourceLocation& /*where*/, const std::string& message,
               bool /*verbatim*/) override {
    messages.push_back(message);
  }
  std::vector<std::string> messages;
};
#endif

// LibTorch 2.9 deprecated the allowTF32 getters, printing a warning at every call: the first
// line of a CUDA run must ask in words that warn on no version.
TEST_F(Tf32Switches, DescribingCudaRaisesNoWarning) {
  const torch::Device gpu(torch::kCUDA, 0);
  WarningCollector collected;
  {
    const warnings::WarningHandlerGuard collect(&collected);
    const warnings::WarnAlways every_time;
    EXPECT_NE(describe_arithmetic(gpu, MemoryFormat::kChannelsLast, Amp::kOff, true, kNoBf16Units)
                  .find("; cuDNN: TF32 "),
              std::string::npos);
  }
  for (const auto& message : collected.messages) ADD_FAILURE() << "LibTorch warned: " << message;
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
// With the precisions set per operation, cuDNN's convolutions TF32 and its RNNs IEEE (as a user's
// code or a library may set them), LibTorch 2.11's old getter allowTF32CuDNN() throws ("a mix of
// the legacy and new APIs"): the line reads the convolutions' own precision, the one that runs.
TEST_F(Tf32Switches, PerOperationPrecisionsAreReadForTheConvolutions) {
  const torch::Device gpu(torch::kCUDA, 0);
  auto& context = at::globalContext();
  const auto rnn = context.float32Precision(at::Float32Backend::CUDA, at::Float32Op::RNN);
  context.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV,
                              at::Float32Precision::TF32);
  context.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::RNN,
                              at::Float32Precision::IEEE);
  context.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL,
                              at::Float32Precision::NONE);  // as the level above: IEEE here
  EXPECT_EQ(describe_arithmetic(gpu, MemoryFormat::kChannelsLast, Amp::kOff, false, kNoBf16Units),
            "channels-last, fp32; cuDNN: TF32 on, benchmark off; cuBLAS: TF32 off");
  context.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::RNN, rnn);
}
#endif

}  // namespace
