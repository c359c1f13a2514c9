// The arithmetic the run's first line announces (numerics.h): exact texts for the CPU and, from
// LibTorch's switches alone (no GPU needed), for CUDA, with TF32 allowed, disallowed and
// forbidden below LibTorch by NVIDIA_TF32_OVERRIDE.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "dptrain/model/numerics.h"

namespace {

using namespace dptrain;

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
  EXPECT_EQ(describe_arithmetic(cpu, MemoryFormat::kContiguous, Amp::kOff, true),
            "contiguous, fp32");
  EXPECT_EQ(describe_arithmetic(cpu, MemoryFormat::kChannelsLast, Amp::kBFloat16, false),
            "channels-last, bf16 autocast");
}

TEST_F(Tf32Switches, CudaSaysWhetherCudnnAndCublasMayUseTf32) {
  const torch::Device gpu(torch::kCUDA, 0);
  at::globalContext().setAllowTF32CuDNN(true);
  at::globalContext().setAllowTF32CuBLAS(false);
  EXPECT_EQ(describe_arithmetic(gpu, MemoryFormat::kChannelsLast, Amp::kOff, true),
            "channels-last, fp32; cuDNN: TF32 on, benchmark on; cuBLAS: TF32 off");
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(true);
  EXPECT_EQ(describe_arithmetic(gpu, MemoryFormat::kContiguous, Amp::kBFloat16, false),
            "contiguous, bf16 autocast; cuDNN: TF32 off, benchmark off; cuBLAS: TF32 on");
}

TEST_F(Tf32Switches, NvidiaOverrideZeroForbidsTf32WhateverLibTorchAllows) {
  const torch::Device gpu(torch::kCUDA, 0);
  at::globalContext().setAllowTF32CuDNN(true);
  at::globalContext().setAllowTF32CuBLAS(true);
  ::setenv("NVIDIA_TF32_OVERRIDE", "0", 1);
  EXPECT_EQ(describe_arithmetic(gpu, MemoryFormat::kChannelsLast, Amp::kOff, true),
            "channels-last, fp32; cuDNN: TF32 off (NVIDIA_TF32_OVERRIDE=0), benchmark on; "
            "cuBLAS: TF32 off (NVIDIA_TF32_OVERRIDE=0)");
  ::setenv("NVIDIA_TF32_OVERRIDE", "1", 1);  // allows no more than LibTorch does
  EXPECT_EQ(describe_arithmetic(gpu, MemoryFormat::kChannelsLast, Amp::kOff, true),
            "channels-last, fp32; cuDNN: TF32 on, benchmark on; cuBLAS: TF32 on");
}

}  // namespace
