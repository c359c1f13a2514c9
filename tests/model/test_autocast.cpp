// bf16 autocast on the CPU (autocast.h): which kernels run where oneDNN has no bf16 at all
// (CpuBf16KernelsGuard), and a bf16 convolution held near float32 by a bound derived from
// bf16's precision, on oneDNN's kernels and on LibTorch's own.
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <tuple>

#include "dptrain/model/autocast.h"
#include "dptrain/model/memory_format.h"

namespace {

using dptrain::Amp;
using dptrain::AutocastGuard;
using dptrain::CpuBf16KernelsGuard;
using dptrain::CpuKernels;

const torch::Device kCpu(torch::kCPU);

CpuKernels cpu_with(bool avx512, const std::string& cap = "") {
  CpuKernels cpu;
  cpu.avx512 = avx512;
  cpu.isa_cap = cap;
  return cpu;
}

// Puts LibTorch's oneDNN switch back as the test found it.
class OneDnnSwitch : public ::testing::Test {
 protected:
  void TearDown() override { at::globalContext().setUserEnabledMkldnn(enabled_); }
  bool enabled_ = at::globalContext().userEnabledMkldnn();
};

TEST_F(OneDnnSwitch, TurnedOffOnlyForCpuBf16WhereOneDnnHasNoAvx512AndRestoredAfter) {
  at::globalContext().setUserEnabledMkldnn(true);
  {
    const CpuBf16KernelsGuard guard(kCpu, Amp::kBFloat16, cpu_with(false));
    EXPECT_TRUE(guard.onednn_turned_off());
    EXPECT_FALSE(at::globalContext().userEnabledMkldnn());
  }
  EXPECT_TRUE(at::globalContext().userEnabledMkldnn());
  {
    const CpuBf16KernelsGuard guard(kCpu, Amp::kBFloat16, cpu_with(true, "AVX2"));
    EXPECT_FALSE(at::globalContext().userEnabledMkldnn());
  }
  EXPECT_TRUE(at::globalContext().userEnabledMkldnn());
  for (const auto& [device, amp, cpu] :
       {std::tuple{kCpu, Amp::kOff, cpu_with(false)},
        std::tuple{kCpu, Amp::kBFloat16, cpu_with(true)},
        std::tuple{kCpu, Amp::kBFloat16, cpu_with(true, "AVX512_CORE")},
        std::tuple{torch::Device(torch::kCUDA, 0), Amp::kBFloat16, cpu_with(false)}}) {
    const CpuBf16KernelsGuard guard(device, amp, cpu);
    EXPECT_FALSE(guard.onednn_turned_off());
    EXPECT_TRUE(at::globalContext().userEnabledMkldnn());
  }
  // A caller that had turned oneDNN off keeps it off.
  at::globalContext().setUserEnabledMkldnn(false);
  { const CpuBf16KernelsGuard guard(kCpu, Amp::kBFloat16, cpu_with(false)); }
  EXPECT_FALSE(at::globalContext().userEnabledMkldnn());
}

// One 3x3 convolution under bf16 autocast against float32. Rounding x and w to bf16 (unit
// roundoff u = 2^-9) changes each product x*w by at most (2u + u^2)|x||w|; summing K = 9 * C
// products adds at most gamma_K = K v / (1 - K v) of S = conv(|x|, |w|) (Higham), where v is
// the unit roundoff of the sum: 2^-24 where the kernel sums in float32 (oneDNN's), u where it
// may sum in bf16 (LibTorch 1.13's generic kernel does: its error reaches 1.3 % of S on these
// numbers, five times oneDNN's 0.26 %; 2.11's sums in float32); float32's own sum is within
// gamma_K(2^-24) S too; the result is rounded to
// bf16 once more (u |y|). So |y_bf16 - y_fp32| <= (2u + u^2 + gamma_K(v) + gamma_K(2^-24)) S
// + u |y_bf16|.
void expect_bf16_convolution_within_its_bound(bool sums_in_float32) {
  torch::manual_seed(3);
  const int64_t channels = 16;
  const auto x = torch::randn({8, channels, 14, 14});
  const auto w = torch::randn({channels, channels, 3, 3}) * 0.1;
  const auto fp32 = torch::conv2d(x, w, {}, 1, 1);
  torch::Tensor bf16;
  {
    const AutocastGuard autocast(kCpu, Amp::kBFloat16);
    bf16 = torch::conv2d(x, w, {}, 1, 1);
  }
  ASSERT_EQ(bf16.scalar_type(), torch::kBFloat16);
  const auto magnitude =
      torch::conv2d(x.abs().to(torch::kDouble), w.abs().to(torch::kDouble), {}, 1, 1);
  const double u = std::ldexp(1.0, -9);
  const double k = 9.0 * static_cast<double>(channels);
  const auto gamma = [k](double v) { return k * v / (1 - k * v); };
  const double sum_roundoff = sums_in_float32 ? std::ldexp(1.0, -24) : u;
  const auto bound =
      (2 * u + u * u + gamma(sum_roundoff) + gamma(std::ldexp(1.0, -24))) * magnitude +
      u * bf16.to(torch::kDouble).abs();
  const auto error = (bf16.to(torch::kDouble) - fp32.to(torch::kDouble)).abs();
  EXPECT_TRUE(torch::all(error <= bound).item<bool>())
      << "largest excess " << (error - bound).max().item<double>();
  // The bound is not loose by orders of magnitude: bf16 does differ from float32.
  EXPECT_GT(error.max().item<double>(), 1e-4 * magnitude.max().item<double>());
}

TEST_F(OneDnnSwitch, Bf16ConvolutionOnOneDnnStaysWithinBf16sBound) {
  at::globalContext().setUserEnabledMkldnn(true);
  expect_bf16_convolution_within_its_bound(true);
}

TEST_F(OneDnnSwitch, Bf16ConvolutionOnLibTorchsOwnKernelsStaysWithinBf16sBound) {
  const CpuBf16KernelsGuard guard(kCpu, Amp::kBFloat16, cpu_with(false));
  ASSERT_FALSE(at::globalContext().userEnabledMkldnn());
  expect_bf16_convolution_within_its_bound(false);
}

}  // namespace
