// The fused BatchNorm + shortcut + ReLU against LibTorch's separate kernels (torch::batch_norm,
// the sum, relu): values, every gradient and the running statistics, in both layouts, with and
// without a shortcut, at shapes where one of C, H * W or N is 1; and the inputs it refuses.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include "dptrain/model/fused_batch_norm.h"
#include "dptrain/model/model.h"

namespace dptrain {
namespace {

struct Result {
  torch::Tensor out, grad_x, grad_shortcut, grad_weight, grad_bias, running_mean, running_var;
};

// The affine parameters every run uses, (C).
torch::Tensor test_weight(int64_t c, torch::ScalarType type) {
  return torch::linspace(0.5, 1.5, c, torch::TensorOptions().dtype(type));
}
torch::Tensor test_bias(int64_t c, torch::ScalarType type) {
  return torch::linspace(-0.2, 0.3, c, torch::TensorOptions().dtype(type));
}

// One forward and backward of relu(bn(x) + shortcut), fused or by LibTorch's kernels, from the
// same inputs and a fixed upstream gradient. With conv_bias_grad (fused only), the fused
// operation also takes a conv_bias, whose gradient lands there.
Result run(bool fused, const torch::Tensor& x0, const torch::Tensor& shortcut0,
           const torch::Tensor& upstream, torch::Tensor* conv_bias_grad = nullptr) {
  const int64_t c = x0.size(1);
  auto x = x0.clone().requires_grad_();
  auto shortcut = shortcut0.defined() ? shortcut0.clone().requires_grad_() : torch::Tensor();
  // bf16 activations keep float32 parameters and statistics, as under autocast.
  const auto parameter_type =
      x0.scalar_type() == torch::kBFloat16 ? torch::kFloat32 : x0.scalar_type();
  const auto options = torch::TensorOptions().dtype(parameter_type);
  auto weight = test_weight(c, parameter_type).requires_grad_();
  auto bias = test_bias(c, parameter_type).requires_grad_();
  auto running_mean = torch::linspace(-1, 1, c, options);
  auto running_var = torch::linspace(0.5, 2, c, options);
  torch::Tensor out;
  auto conv_bias = conv_bias_grad ? torch::zeros({c}, options).requires_grad_() : torch::Tensor();
  if (fused) {
    out = batch_norm_add_relu(x, shortcut, weight, bias, running_mean, running_var, 0.1, 1e-5,
                              conv_bias);
  } else {
    out = torch::batch_norm(x, weight, bias, running_mean, running_var, /*training=*/true, 0.1,
                            1e-5, /*cudnn_enabled=*/false);
    if (shortcut.defined()) out = out + shortcut;
    out = torch::relu(out);
  }
  out.backward(upstream);
  if (conv_bias_grad) *conv_bias_grad = conv_bias.grad();
  return {out.detach(),  x.grad(),    shortcut.defined() ? shortcut.grad() : torch::Tensor(),
          weight.grad(), bias.grad(), running_mean,
          running_var};
}

// run() on x, shortcut and upstream gradient converted to `type` first (an undefined shortcut
// stays undefined).
Result run_as(torch::ScalarType type, bool fused, const torch::Tensor& x0,
              const torch::Tensor& shortcut0, const torch::Tensor& upstream) {
  const auto converted = [type](const torch::Tensor& t) { return t.defined() ? t.to(type) : t; };
  return run(fused, converted(x0), converted(shortcut0), converted(upstream));
}

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  const double scale = std::max(want.abs().max().item<double>(), 1e-30);
  return (got.to(torch::kFloat64) - want.to(torch::kFloat64)).abs().max().item<double>() / scale;
}

void expect_close(const Result& got, const Result& want, double tolerance) {
  EXPECT_LT(relative_error(got.out, want.out), tolerance) << "output";
  EXPECT_LT(relative_error(got.grad_x, want.grad_x), tolerance) << "x's gradient";
  EXPECT_LT(relative_error(got.grad_weight, want.grad_weight), tolerance) << "gamma's gradient";
  EXPECT_LT(relative_error(got.grad_bias, want.grad_bias), tolerance) << "beta's gradient";
  EXPECT_LT(relative_error(got.running_mean, want.running_mean), tolerance) << "running mean";
  EXPECT_LT(relative_error(got.running_var, want.running_var), tolerance) << "running var";
  ASSERT_EQ(got.grad_shortcut.defined(), want.grad_shortcut.defined());
  if (want.grad_shortcut.defined()) {
    EXPECT_LT(relative_error(got.grad_shortcut, want.grad_shortcut), tolerance) << "shortcut's";
  }
}

// (N, C, H, W), channels-last, with a shortcut
using Case = std::tuple<std::vector<int64_t>, bool, bool>;

class FusedBatchNorm : public ::testing::TestWithParam<Case> {
 protected:
  // x with a mean far from zero against its spread in channel 0, as the book's initialisation
  // gives the stem: the shifted sums must not lose it.
  torch::Tensor input(torch::ScalarType type) const {
    const auto& [sizes, channels_last, with_shortcut] = GetParam();
    torch::manual_seed(7);
    auto x = torch::randn(sizes, torch::kFloat64);
    x.select(1, 0).mul_(1e-3).add_(40);
    return layout(x.to(type));
  }
  torch::Tensor shortcut(torch::ScalarType type) const {
    const auto& [sizes, channels_last, with_shortcut] = GetParam();
    if (!with_shortcut) return {};
    torch::manual_seed(8);
    return layout(torch::randn(sizes, torch::kFloat64).to(type));
  }
  torch::Tensor upstream(torch::ScalarType type) const {
    torch::manual_seed(9);
    return layout(torch::randn(std::get<0>(GetParam()), torch::kFloat64).to(type));
  }
  torch::Tensor layout(const torch::Tensor& t) const {
    return std::get<1>(GetParam()) ? t.contiguous(at::MemoryFormat::ChannelsLast) : t;
  }
};

TEST_P(FusedBatchNorm, Float64MatchesLibTorchsKernels) {
  const auto type = torch::kFloat64;
  const auto want = run(false, input(type), shortcut(type), upstream(type));
  const auto got = run(true, input(type), shortcut(type), upstream(type));
  expect_close(got, want, 1e-10);
  EXPECT_EQ(got.out.suggest_memory_format(), input(type).suggest_memory_format());
  EXPECT_EQ(got.grad_x.suggest_memory_format(), input(type).suggest_memory_format());
}

// Float32 against the float64 truth on the same (rounded) inputs, no further from it than
// LibTorch's own float32 kernels are. Compared by relative L2 norm: where an output lies within
// rounding of zero the two precisions' ReLUs may decide differently, which moves single
// gradients by their whole size.
double relative_l2(const torch::Tensor& got, const torch::Tensor& want) {
  const auto w = want.to(torch::kFloat64);
  return (got.to(torch::kFloat64) - w).norm().item<double>() /
         std::max(w.norm().item<double>(), 1e-30);
}

TEST_P(FusedBatchNorm, Float32IsAsCloseToFloat64AsLibTorchs) {
  const auto x = input(torch::kFloat32);
  const auto s = shortcut(torch::kFloat32);
  const auto g = upstream(torch::kFloat32);
  const auto truth = run_as(torch::kFloat64, false, x, s, g);
  const auto libtorch = run(false, x, s, g);
  const auto fused = run(true, x, s, g);
  const auto check = [&](torch::Tensor Result::*field, const char* what) {
    const double ours = relative_l2(fused.*field, truth.*field);
    const double theirs = relative_l2(libtorch.*field, truth.*field);
    EXPECT_LE(ours, 2 * theirs + 1e-6) << what << ": LibTorch's float32 is at " << theirs;
  };
  check(&Result::out, "output");
  check(&Result::grad_x, "x's gradient");
  check(&Result::grad_weight, "gamma's gradient");
  check(&Result::grad_bias, "beta's gradient");
  check(&Result::running_mean, "running mean");
  check(&Result::running_var, "running var");
  if (s.defined()) check(&Result::grad_shortcut, "shortcut's gradient");
}

TEST_P(FusedBatchNorm, RepeatsBitForBit) {
  const auto type = torch::kFloat32;
  const auto first = run(true, input(type), shortcut(type), upstream(type));
  const auto second = run(true, input(type), shortcut(type), upstream(type));
  EXPECT_TRUE(torch::equal(first.out, second.out));
  EXPECT_TRUE(torch::equal(first.grad_x, second.grad_x));
  EXPECT_TRUE(torch::equal(first.grad_weight, second.grad_weight));
}

// With a conv_bias, every result is the same bits as without, and the bias's gradient is x's
// gradient summed over N, H and W: in float64 and rounded once to the bias's type, so within
// half a float32 unit of the float64 sum of the stored values, beside float64's own rounding.
TEST_P(FusedBatchNorm, ConvBiasGradientIsTheSumOfXsGradient) {
  for (const auto type : {torch::kFloat32, torch::kBFloat16}) {
    const auto x = input(type);
    const auto s = shortcut(type);
    const auto g = upstream(type);
    torch::Tensor conv_bias_grad;
    const auto with = run(true, x, s, g, &conv_bias_grad);
    const auto without = run(true, x, s, g);
    EXPECT_TRUE(torch::equal(with.out, without.out)) << "output";
    EXPECT_TRUE(torch::equal(with.grad_x, without.grad_x)) << "x's gradient";
    EXPECT_TRUE(torch::equal(with.grad_weight, without.grad_weight)) << "gamma's gradient";
    EXPECT_TRUE(torch::equal(with.grad_bias, without.grad_bias)) << "beta's gradient";
    EXPECT_TRUE(torch::equal(with.running_mean, without.running_mean)) << "running mean";
    if (s.defined()) {
      EXPECT_TRUE(torch::equal(with.grad_shortcut, without.grad_shortcut)) << "shortcut's";
    }
    ASSERT_TRUE(conv_bias_grad.defined());
    ASSERT_EQ(conv_bias_grad.scalar_type(), torch::kFloat32);
    const auto dx = with.grad_x.to(torch::kFloat64);
    const auto want = dx.sum({0, 2, 3});
    const auto values = static_cast<double>(dx.numel() / dx.size(1));
    const auto bound = want.abs() * std::ldexp(1.0, -24) +
                       values * std::ldexp(1.0, -50) * dx.abs().max().item<double>();
    EXPECT_TRUE(((conv_bias_grad.to(torch::kFloat64) - want).abs() <= bound).all().item<bool>())
        << torch::stack({conv_bias_grad.to(torch::kFloat64), want});
  }
}

// bf16 values are widened to float exactly, computed on as the float32 path computes, and
// rounded once when stored: the bf16 results are the float32 path's on the same (widened)
// inputs, rounded to the nearest bf16 as LibTorch rounds, to the bit; the parameters' gradients
// and the running statistics, kept in float32, are the float32 path's exactly. (The big shape has
// about a dozen outputs that lie half-way between two bf16 values, and so checks ties too.)
TEST_P(FusedBatchNorm, Bf16IsTheFloat32PathRoundedOnce) {
  const auto x = input(torch::kBFloat16);
  const auto s = shortcut(torch::kBFloat16);
  const auto g = upstream(torch::kBFloat16);
  const auto half = run(true, x, s, g);
  const auto single = run_as(torch::kFloat32, true, x, s, g);
  ASSERT_EQ(half.out.scalar_type(), torch::kBFloat16);
  ASSERT_EQ(half.grad_x.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(half.out.suggest_memory_format(), x.suggest_memory_format());
  EXPECT_TRUE(torch::equal(half.out, single.out.to(torch::kBFloat16))) << "output";
  EXPECT_TRUE(torch::equal(half.grad_x, single.grad_x.to(torch::kBFloat16))) << "x's gradient";
  if (s.defined()) {
    EXPECT_TRUE(torch::equal(half.grad_shortcut, single.grad_shortcut.to(torch::kBFloat16)))
        << "shortcut's gradient";
  }
  EXPECT_TRUE(torch::equal(half.grad_weight, single.grad_weight)) << "gamma's gradient";
  EXPECT_TRUE(torch::equal(half.grad_bias, single.grad_bias)) << "beta's gradient";
  EXPECT_TRUE(torch::equal(half.running_mean, single.running_mean)) << "running mean";
  EXPECT_TRUE(torch::equal(half.running_var, single.running_var)) << "running var";
}

// Against the float64 truth on the same bf16 inputs: each output and input gradient is one
// rounding to bf16 away from it, so its relative error is at most bf16's unit roundoff u = 2^-8
// (8 significant bits, round to nearest), plus float32's own error on the way; and the ReLU's
// mask, where an output lies within rounding of zero, may move a gradient by its whole size,
// which the relative L2 norm keeps small. The statistics and the parameters' gradients are sums
// in float64 of exact values: float32's precision, not bf16's.
TEST_P(FusedBatchNorm, Bf16IsWithinOneRoundingOfFloat64) {
  const auto x = input(torch::kBFloat16);
  const auto s = shortcut(torch::kBFloat16);
  const auto g = upstream(torch::kBFloat16);
  const auto truth = run_as(torch::kFloat64, false, x, s, g);
  const auto half = run(true, x, s, g);
  const double u = std::ldexp(1.0, -8);
  // Elementwise for the output: |out - truth| <= u |truth| + float32's error, a few units of
  // 2^-24 of the terms (x - mean) * gamma / sigma, beta and the shortcut it adds up.
  const auto x64 = x.to(torch::kFloat64);
  const int64_t c = x.size(1);
  const auto mean = x64.mean({0, 2, 3}, /*keepdim=*/true);
  const auto sigma = (x64.var({0, 2, 3}, /*unbiased=*/false, /*keepdim=*/true) + 1e-5).sqrt();
  auto terms = ((x64 - mean) * test_weight(c, torch::kFloat64).view({1, c, 1, 1}) / sigma).abs() +
               test_bias(c, torch::kFloat64).abs().view({1, c, 1, 1});
  if (s.defined()) terms = terms + s.to(torch::kFloat64).abs();
  const auto out = half.out.to(torch::kFloat64);
  const auto bound = u * truth.out.abs() + 8 * std::ldexp(1.0, -24) * terms;
  EXPECT_TRUE(((out - truth.out).abs() <= bound).all().item<bool>())
      << "largest error " << (out - truth.out).abs().max().item<double>();
  EXPECT_LE(relative_l2(half.grad_x, truth.grad_x), u + 1e-4) << "x's gradient";
  if (s.defined()) {
    EXPECT_LE(relative_l2(half.grad_shortcut, truth.grad_shortcut), 1e-4) << "shortcut's";
  }
  EXPECT_LE(relative_l2(half.grad_weight, truth.grad_weight), 1e-4) << "gamma's gradient";
  EXPECT_LE(relative_l2(half.grad_bias, truth.grad_bias), 1e-4) << "beta's gradient";
  EXPECT_LE(relative_l2(half.running_mean, truth.running_mean), 1e-6) << "running mean";
  EXPECT_LE(relative_l2(half.running_var, truth.running_var), 1e-6) << "running var";
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedBatchNorm,
                         ::testing::Combine(::testing::Values(std::vector<int64_t>{5, 3, 7, 9},
                                                              std::vector<int64_t>{64, 16, 28, 28},
                                                              std::vector<int64_t>{31, 32, 4, 4},
                                                              std::vector<int64_t>{3, 1, 5, 5},
                                                              std::vector<int64_t>{9, 8, 1, 1},
                                                              std::vector<int64_t>{1, 4, 3, 1}),
                                            ::testing::Bool(), ::testing::Bool()));

TEST(FusedBatchNormInputs, RefusesWhatItDoesNotHandle) {
  const auto weight = torch::ones({4});
  const auto x = torch::randn({2, 4, 3, 3});
  EXPECT_TRUE(batch_norm_add_relu_applies(x, {}, weight));
  EXPECT_TRUE(batch_norm_add_relu_applies(x, torch::randn({2, 4, 3, 3}), weight));
  EXPECT_TRUE(batch_norm_add_relu_applies(x.to(torch::kBFloat16), {}, weight))
      << "bf16 activations, float32 parameters";
  EXPECT_FALSE(batch_norm_add_relu_applies(x.to(torch::kBFloat16), {}, weight.to(torch::kBFloat16)))
      << "bf16 parameters";
  EXPECT_FALSE(batch_norm_add_relu_applies(x.to(torch::kBFloat16), x, weight))
      << "a float32 shortcut to bf16 activations";
  EXPECT_FALSE(batch_norm_add_relu_applies(x.to(torch::kHalf), {}, weight)) << "float16";
  EXPECT_FALSE(batch_norm_add_relu_applies(x.to(torch::kFloat64), {}, weight)) << "weight type";
  EXPECT_FALSE(batch_norm_add_relu_applies(x.select(3, 0), {}, weight)) << "3-D";
  EXPECT_FALSE(
      batch_norm_add_relu_applies(torch::randn({2, 4, 3, 6}).slice(3, 0, 6, 2), {}, weight))
      << "strided, neither layout";
  EXPECT_FALSE(batch_norm_add_relu_applies(torch::randn({1, 4, 1, 1}), {}, weight))
      << "one value per channel";
  EXPECT_FALSE(batch_norm_add_relu_applies(x, torch::randn({2, 4, 3, 2}), weight)) << "shape";
  EXPECT_FALSE(batch_norm_add_relu_applies(x, {}, torch::ones({3}))) << "channels";
  auto running_mean = torch::zeros({4});
  auto running_var = torch::ones({4});
  EXPECT_THROW(batch_norm_add_relu(torch::randn({1, 4, 1, 1}), {}, weight, torch::zeros({4}),
                                   running_mean, running_var, 0.1, 1e-5),
               c10::Error);
  EXPECT_THROW(batch_norm_add_relu(x, {}, weight, torch::zeros({4}), running_mean, running_var, 0.1,
                                   1e-5, torch::zeros({3})),
               c10::Error)
      << "a conv_bias of other channels";
}

// A shortcut in the other layout is accepted and gives the same values.
TEST(FusedBatchNormInputs, ShortcutInTheOtherLayout) {
  torch::manual_seed(3);
  const auto x = torch::randn({4, 8, 5, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  const auto shortcut = torch::randn({4, 8, 5, 5});
  const auto weight = torch::ones({8});
  const auto bias = torch::zeros({8});
  auto m1 = torch::zeros({8}), v1 = torch::ones({8}), m2 = torch::zeros({8}), v2 = torch::ones({8});
  const auto a = batch_norm_add_relu(x, shortcut, weight, bias, m1, v1, 0.1, 1e-5);
  const auto b = batch_norm_add_relu(x, shortcut.contiguous(at::MemoryFormat::ChannelsLast), weight,
                                     bias, m2, v2, 0.1, 1e-5);
  EXPECT_TRUE(torch::equal(a, b));
}

// The whole model in channels-last (where forward_add_relu fuses), fused and not: the same
// gradients and running statistics in float64, and not the same bits, which shows the fused
// operation ran.
TEST(FusedBatchNormModel, ResNetGradientsMatchTheUnfusedModel) {
  torch::manual_seed(5);
  const auto x =
      torch::rand({6, 1, 28, 28}, torch::kFloat64).contiguous(at::MemoryFormat::ChannelsLast);
  const auto y = torch::randint(0, 10, {6}, torch::kLong);
  std::vector<std::vector<torch::Tensor>> results;
  for (const bool fused : {false, true}) {
    ResNetOptions options{10, 1, 4};
    options.fused_batch_norm = fused;
    ResNet model(options);
    init_reference_weights(*model, 11);
    model->to(torch::kFloat64);
    convert_to_channels_last(*model);
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    std::vector<torch::Tensor> r;
    for (const auto& p : model->parameters()) r.push_back(p.grad().clone());
    for (const auto& b : model->buffers()) r.push_back(b.clone());
    results.push_back(r);
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  bool any_bit_differs = false;
  for (size_t i = 0; i < results[0].size(); ++i) {
    const auto& want = results[0][i];
    const auto& got = results[1][i];
    const double scale = std::max(want.abs().max().item<double>(), 1e-6);
    EXPECT_LT((got - want).abs().max().item<double>() / scale, 1e-8) << "tensor " << i;
    any_bit_differs = any_bit_differs || !torch::equal(got, want);
  }
  EXPECT_TRUE(any_bit_differs) << "fused and unfused agree to the bit: the fused path did not run";
}

// The names of the backward graph's nodes (from `root`) with an edge to `target`, one per edge.
std::vector<std::string> nodes_with_an_edge_to(const std::shared_ptr<torch::autograd::Node>& root,
                                               const torch::autograd::Node* target) {
  std::vector<std::string> names;
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack{root.get()};
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (!edge.function) continue;
      if (edge.function.get() == target) names.push_back(node->name());
      stack.push_back(edge.function.get());
    }
  }
  return names;
}

// --conv-bias-grad fused on the whole model, its input laid out as batch_input.cpp lays it out:
// in channels-last each of the 17 convolution biases that feed a BatchNorm gets its gradient
// from the fused BatchNorm's node alone (one edge: not the convolution's too, nor none), the
// loss and every other gradient are the same bits as the library's, and those biases' gradients
// the same to float32 rounding of the largest gradient (their exact value is zero); in the
// contiguous layout, where nothing fuses, the convolutions give them and every bit is the same.
TEST(FusedBatchNormModel, FusedConvBiasGradientsChangeOnlyThoseBiases) {
  torch::manual_seed(6);
  const auto x = torch::rand({12, 1, 28, 28});
  const auto y = torch::randint(0, 10, {12}, torch::kLong);
  const auto feeds_batch_norm = [](const std::string& name) {
    const auto ends = [&](const std::string& tail) {
      return name.size() >= tail.size() &&
             name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    return name == "0.bias" || ends("conv1.bias") || ends("conv2.bias");
  };
  for (const bool channels_last : {true, false}) {
    std::vector<std::pair<torch::Tensor, std::vector<std::pair<std::string, torch::Tensor>>>> runs;
    for (const bool fused_bias_grad : {false, true}) {
      SCOPED_TRACE(std::string(channels_last ? "channels-last" : "contiguous") +
                   (fused_bias_grad ? ", fused" : ", library"));
      ResNetOptions options{10, 1, 4};
      options.fused_conv_bias_grad = fused_bias_grad;
      ResNet model(options);
      init_reference_weights(*model, 11);
      auto input = x;
      if (channels_last) {
        convert_to_channels_last(*model);
        input = torch::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::ChannelsLast))
                    .copy_(x);
      }
      const auto loss = torch::nn::functional::cross_entropy(model->forward(input), y);
      int biases = 0;
      for (const auto& p : model->named_parameters()) {
        if (!feeds_batch_norm(p.key())) continue;
        ++biases;
        const auto names = nodes_with_an_edge_to(
            loss.grad_fn(), torch::autograd::impl::grad_accumulator(p.value()).get());
        ASSERT_EQ(names.size(), 1u) << p.key();
        const bool from_batch_norm = names[0].find("BatchNormAddRelu") != std::string::npos;
        EXPECT_EQ(from_batch_norm, channels_last && fused_bias_grad)
            << p.key() << "'s gradient comes from " << names[0];
        // What the run's first line says, from the settings, is what the graph shows.
        EXPECT_EQ(from_batch_norm,
                  fuses_conv_bias_gradients(
                      options, torch::kCPU,
                      channels_last ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous,
                      /*synchronised_batch_norm=*/false))
            << p.key();
      }
      EXPECT_EQ(biases, 17) << "the stem's and the 16 of the blocks";
      loss.backward();
      std::vector<std::pair<std::string, torch::Tensor>> grads;
      for (const auto& p : model->named_parameters()) grads.emplace_back(p.key(), p->grad());
      for (const auto& b : model->named_buffers()) grads.emplace_back(b.key(), b->clone());
      runs.emplace_back(loss.detach(), grads);
    }
    const auto& [library_loss, library] = runs[0];
    const auto& [fused_loss, fused] = runs[1];
    EXPECT_TRUE(torch::equal(library_loss, fused_loss));
    double largest = 0;
    for (const auto& [name, g] : library) largest = std::max(largest, g.abs().max().item<double>());
    ASSERT_EQ(library.size(), fused.size());
    for (size_t i = 0; i < library.size(); ++i) {
      const auto& [name, want] = library[i];
      const auto& got = fused[i].second;
      if (channels_last && feeds_batch_norm(name)) {
        EXPECT_LT((got - want).abs().max().item<double>(), 1e-5 * largest) << name;
      } else {
        EXPECT_TRUE(torch::equal(got, want)) << name << (channels_last ? "" : ", contiguous");
      }
    }
  }
}

}  // namespace
}  // namespace dptrain
