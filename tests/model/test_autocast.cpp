// bf16 autocast on the CPU (autocast.h): which kernels run where oneDNN has no bf16 at all
// (CpuBf16KernelsGuard), a bf16 convolution held near float32 by a bound derived from bf16's
// precision, on oneDNN's kernels and on LibTorch's own, and one whole training step in bf16
// against float64.
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "dptrain/model/autocast.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/model/model.h"

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
// roundoff u = 2^-8: 8 significant bits, round to nearest) changes each product x*w by at most (2u
// + u^2)|x||w|; summing K = 9 * C products adds at most gamma_K = K v / (1 - K v) of S = conv(|x|,
// |w|) (Higham), where v is the unit roundoff of the sum: 2^-24 where the kernel sums in float32
// (oneDNN's), u where it may sum in bf16 (LibTorch 1.13's generic kernel does: its error
// reaches 1.3 % of S on these numbers, five times oneDNN's 0.26 %; 2.11's sums in float32);
// float32's own sum is within gamma_K(2^-24) S too; the result is rounded to bf16 once more (u
// |y|). So |y_bf16 - y_fp32| <= (2u + u^2 + gamma_K(v) + gamma_K(2^-24)) S
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
  const double u = std::ldexp(1.0, -8);
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

// oneDNN has bf16 convolutions from AVX-512 up; below it (an AVX2 CPU) LibTorch 1.13 takes its
// own kernel even with oneDNN on, whose sums may be bf16, so that is the bound there.
TEST_F(OneDnnSwitch, Bf16ConvolutionOnOneDnnStaysWithinBf16sBound) {
  at::globalContext().setUserEnabledMkldnn(true);
  expect_bf16_convolution_within_its_bound(dptrain::detect_cpu_kernels().runs_avx512());
}

TEST_F(OneDnnSwitch, Bf16ConvolutionOnLibTorchsOwnKernelsStaysWithinBf16sBound) {
  const CpuBf16KernelsGuard guard(kCpu, Amp::kBFloat16, cpu_with(false));
  ASSERT_FALSE(at::globalContext().userEnabledMkldnn());
  expect_bf16_convolution_within_its_bound(false);
}

// ---- One whole training step in bf16 -------------------------------------------------------

// The logits, the loss and every parameter's gradient of one step of the book's model (width 4,
// channels-last, a batch of 16 images), as dptrain's step computes them: the forward pass under
// `amp`, the logits in the parameters' type for the loss; `seed` picks the weights and the batch.
struct StepResult {
  torch::Tensor logits;  // (16, 10), float64
  double loss = 0;
  torch::Tensor gradient;     // every parameter's gradient, flattened and joined, float64
  torch::Tensor fc_gradient;  // the last layer's weight gradient, float64
};

StepResult one_step(torch::ScalarType type, Amp amp, bool fused_batch_norm, uint64_t seed) {
  // As dptrain's step, forward and backward: where oneDNN has no bf16 (an ISA cap below
  // AVX-512), LibTorch's own kernels.
  const CpuBf16KernelsGuard kernels(kCpu, amp, dptrain::detect_cpu_kernels());
  dptrain::ResNetOptions options{10, 1, 4};
  options.fused_batch_norm = fused_batch_norm;
  dptrain::ResNet model(options);
  dptrain::init_reference_weights(*model, seed);
  model->to(type);
  dptrain::convert_to_channels_last(*model);
  torch::manual_seed(seed);
  const auto images = torch::rand({16, 1, 28, 28}, torch::kFloat64);
  const auto labels = torch::randint(0, 10, {16}, torch::kLong);
  const auto x = images.to(type).contiguous(at::MemoryFormat::ChannelsLast);
  torch::Tensor logits;
  {
    const AutocastGuard autocast(kCpu, amp);
    logits = model->forward(x).to(type);
  }
  const auto loss = torch::nn::functional::cross_entropy(logits, labels);
  loss.backward();
  std::vector<torch::Tensor> gradients;
  torch::Tensor fc_gradient;
  for (const auto& p : model->named_parameters()) {
    gradients.push_back(p.value().grad().flatten());
    if (p.key() == "fc.1.weight") fc_gradient = p.value().grad().to(torch::kFloat64);
  }
  return {logits.detach().to(torch::kFloat64), loss.item<double>(),
          torch::cat(gradients).to(torch::kFloat64), fc_gradient};
}

double relative_l2_difference(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).norm().item<double>() / want.norm().item<double>();
}

// The forward pass, bounded by bf16's unit roundoff u = 2^-8 where oneDNN's bf16 kernels run
// (AVX-512): each of the L = 18 layers on the longest path (17 convolutions and the linear layer)
// rounds its input and its weights to bf16 (2u of each product) and its output (u); BatchNorm
// divides each layer's scale out, so a layer passes on its input's relative error without a
// gain, and to first order the errors add:
// the logits within 3 L u of float64's in relative L2. The loss is within 2 max|dz| (its gradient
// softmax - onehot has an L1 norm of at most 2 per image), and the last layer's weight gradient,
// the features times softmax - onehot, within twice the logits' bound.
TEST(Bf16Step, TheForwardPassStaysWithinBf16sBound) {
  // The bound takes the convolutions' sums in float32, as oneDNN's bf16 kernels sum; without
  // AVX-512 LibTorch's own kernels run them, and 1.13's sum in bf16 (see the convolution's bound
  // above), which no per-layer bound of a few u holds.
  if (!dptrain::detect_cpu_kernels().runs_avx512()) {
    GTEST_SKIP() << "this CPU has no AVX-512: LibTorch's own bf16 kernels run the convolutions";
  }
  const double u = std::ldexp(1.0, -8);
  const double bound = 3 * 18 * u;
  for (const uint64_t seed : {21, 22, 23}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto truth = one_step(torch::kFloat64, Amp::kOff, true, seed);
    const auto bf16 = one_step(torch::kFloat32, Amp::kBFloat16, true, seed);
    const double logits_error = relative_l2_difference(bf16.logits, truth.logits);
    EXPECT_LE(logits_error, bound);
    EXPECT_GE(logits_error, u / 16) << "no bf16 rounding: did bf16 run?";
    EXPECT_LE(std::abs(bf16.loss - truth.loss),
              2 * (bf16.logits - truth.logits).abs().max().item<double>() + 1e-12);
    EXPECT_LE(relative_l2_difference(bf16.fc_gradient, truth.fc_gradient), 2 * bound);
  }
}

// The backward pass from the book's N(0, 0.01) weights is ill-conditioned: BatchNorm's gradient
// subtracts its means from the incoming gradient, and what is left is small against what bf16
// rounded, so a layer far from the loss has its gradient only to some 20-50 % (the last layer's
// to 2 %) in bf16, whoever computes it. The bound is therefore LibTorch's own: dptrain's step
// (bf16 activations through the fused BatchNorm) no further from float64 than the same model's
// step under autocast on LibTorch's kernels (fp32 activations around them), over three seeds;
// and float32 far closer than either.
TEST(Bf16Step, GradientsAreAsCloseToFloat64AsLibTorchsAutocast) {
  double ours = 0, libtorch = 0, fp32 = 0;
  for (const uint64_t seed : {21, 22, 23}) {
    const auto truth = one_step(torch::kFloat64, Amp::kOff, true, seed);
    const auto fused = one_step(torch::kFloat32, Amp::kBFloat16, true, seed);
    const auto unfused = one_step(torch::kFloat32, Amp::kBFloat16, false, seed);
    EXPECT_FALSE(torch::equal(fused.gradient, unfused.gradient)) << "the fused path did not run";
    ours += relative_l2_difference(fused.gradient, truth.gradient);
    libtorch += relative_l2_difference(unfused.gradient, truth.gradient);
    fp32 += relative_l2_difference(one_step(torch::kFloat32, Amp::kOff, true, seed).gradient,
                                   truth.gradient);
  }
  EXPECT_LE(ours, 1.25 * libtorch) << "mean relative L2 error over 3 seeds: dptrain " << ours / 3
                                   << ", LibTorch's autocast " << libtorch / 3;
  EXPECT_LE(fp32 * 100, ours) << "float32 " << fp32 / 3 << " against bf16 " << ours / 3;
}

}  // namespace
