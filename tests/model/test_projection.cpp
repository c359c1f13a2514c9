// The projection shortcut (projection.h): subsample's values and gradient exactly, project()
// against the strided convolution in float64, and the odd-batch, narrow-channel shapes where
// oneDNN's own strided 1x1 backward corrupts the heap, run on two threads in both layouts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>

#include "dptrain/model/model.h"
#include "dptrain/model/projection.h"

namespace dptrain {
namespace {

torch::Tensor in_layout(const torch::Tensor& t, bool channels_last) {
  return channels_last ? t.contiguous(at::MemoryFormat::ChannelsLast) : t.contiguous();
}

class ProjectionLayouts : public ::testing::TestWithParam<bool> {};

TEST_P(ProjectionLayouts, SubsampleIsTheStridedViewAndScattersItsGradient) {
  const bool channels_last = GetParam();
  torch::manual_seed(1);
  const auto x0 = in_layout(torch::randn({3, 5, 7, 6}), channels_last);
  auto x = x0.clone().requires_grad_();
  const auto y = subsample(x, 2);  // (3, 5, 4, 3)
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 5, 4, 3}));
  EXPECT_TRUE(torch::equal(y, x0.slice(2, 0, 7, 2).slice(3, 0, 6, 2)));
  EXPECT_EQ(y.is_contiguous(at::MemoryFormat::ChannelsLast) && !y.is_contiguous(), channels_last);
  const auto g = torch::randn({3, 5, 4, 3});
  y.backward(g);
  auto want = torch::zeros({3, 5, 7, 6});
  want.slice(2, 0, 7, 2).slice(3, 0, 6, 2).copy_(g);
  EXPECT_TRUE(torch::equal(x.grad(), want));
  EXPECT_EQ(x.grad().is_contiguous(at::MemoryFormat::ChannelsLast) && !x.grad().is_contiguous(),
            channels_last);
}

// Float64 convolutions are LibTorch's own loops, not oneDNN's: the reference.
TEST_P(ProjectionLayouts, MatchesTheStridedConvolutionInFloat64) {
  const bool channels_last = GetParam();
  torch::manual_seed(2);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(4, 8, 1).stride(2).bias(true));
  conv->to(torch::kFloat64);
  const auto x0 = in_layout(torch::randn({5, 4, 9, 9}, torch::kFloat64), channels_last);
  const auto g = torch::randn({5, 8, 5, 5}, torch::kFloat64);
  std::vector<torch::Tensor> results;
  for (const bool ours : {false, true}) {
    conv->zero_grad();
    auto x = x0.clone().requires_grad_();
    const auto y = ours ? project(*conv, x) : conv->forward(x);
    y.backward(g);
    results.insert(results.end(),
                   {y.detach(), x.grad(), conv->weight.grad().clone(), conv->bias.grad().clone()});
  }
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(torch::allclose(results[4 + i], results[i], 1e-12, 1e-12)) << "tensor " << i;
  }
}

// Where oneDNN's strided kernel aborts or returns garbage (Note [The strided 1x1 convolution on
// the CPU]): two threads, odd batches, 2 to 16 channels. Each weight gradient must match the
// float64 sum over the subsampled pixels.
TEST_P(ProjectionLayouts, OddBatchesAndNarrowChannelsOnTwoThreads) {
  const bool channels_last = GetParam();
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  struct Shape {
    int64_t batch, in, out, size;
  };
  for (const Shape s :
       {Shape{3, 8, 16, 14}, Shape{7, 8, 16, 14}, Shape{31, 8, 16, 14}, Shape{63, 8, 16, 14},
        Shape{3, 4, 8, 28}, Shape{31, 4, 8, 28}, Shape{7, 2, 4, 28}}) {
    torch::manual_seed(s.batch);
    torch::nn::Conv2d conv(torch::nn::Conv2dOptions(s.in, s.out, 1).stride(2).bias(true));
    if (channels_last) convert_to_channels_last(*conv);
    for (int trial = 0; trial < 5; ++trial) {
      conv->zero_grad();
      const auto x0 = in_layout(torch::randn({s.batch, s.in, s.size, s.size}), channels_last);
      auto x = x0.clone().requires_grad_();
      const auto y = project(*conv, x);
      const auto g = in_layout(torch::randn(y.sizes()), channels_last);
      y.backward(g);
      const auto pixels = x0.slice(2, 0, s.size, 2).slice(3, 0, s.size, 2).to(torch::kFloat64);
      const auto want = torch::einsum("nohw,nihw->oi", {g.to(torch::kFloat64), pixels});
      const auto got = conv->weight.grad().view({s.out, s.in}).to(torch::kFloat64);
      EXPECT_LT((got - want).abs().max().item<double>(), 1e-3 * want.abs().max().item<double>())
          << "batch " << s.batch << ", " << s.in << " to " << s.out << " channels, trial " << trial;
      EXPECT_TRUE(torch::allclose(conv->bias.grad().to(torch::kFloat64),
                                  g.to(torch::kFloat64).sum({0, 2, 3}), 1e-4, 1e-3));
    }
  }
  at::set_num_threads(threads);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ProjectionLayouts, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "ChannelsLast" : "Contiguous";
                         });

TEST(Projection, RefusesAnythingButA1x1Convolution) {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(4, 8, 3).stride(2).padding(1));
  EXPECT_THROW(project(*conv, torch::randn({2, 4, 8, 8})), c10::Error);
  EXPECT_THROW(subsample(torch::randn({2, 4, 8}), 2), c10::Error);
  EXPECT_THROW(subsample(torch::randn({2, 4, 8, 8}), 0), c10::Error);
}

}  // namespace
}  // namespace dptrain
