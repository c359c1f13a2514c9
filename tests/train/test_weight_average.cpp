// Tests of the weights' moving average (weight_average.h): the decay's warm-up, one update
// against its formula, integer buffers copied, and copy_weights.
#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include "dptrain/train/weight_average.h"

namespace {

using namespace dptrain;

torch::nn::Sequential small_model() {
  return torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
}

TEST(WeightAverage, DecayWarmsUpToItsValue) {
  EXPECT_DOUBLE_EQ(weight_average_decay(0.999, 0), 0.1);        // (1 + 0) / (10 + 0)
  EXPECT_DOUBLE_EQ(weight_average_decay(0.999, 10), 11.0 / 20);
  EXPECT_DOUBLE_EQ(weight_average_decay(0.999, 100000), 0.999);  // the decay itself
  EXPECT_DOUBLE_EQ(weight_average_decay(0.5, 100), 0.5);
}

TEST(WeightAverage, UpdateIsTheLerpOfEveryFloatTensorAndCopiesTheIntegerOnes) {
  torch::manual_seed(0);
  auto weights = small_model();
  auto averaged = small_model();
  {
    torch::NoGradGuard no_grad;
    for (auto& b : weights->buffers()) {
      if (b.is_floating_point()) b.uniform_();
    }
    weights->named_buffers()["1.num_batches_tracked"].fill_(7);
  }
  const auto before = averaged->parameters()[0].detach().clone();
  update_weight_average(*averaged, *weights, 0.75);
  EXPECT_TRUE(torch::equal(averaged->parameters()[0],
                           before.lerp(weights->parameters()[0].detach(), 0.25)));
  const auto a = averaged->named_buffers();
  const auto w = weights->named_buffers();
  EXPECT_TRUE(torch::allclose(a["1.running_mean"], 0.75 * torch::zeros({4}) +
                                                        0.25 * w["1.running_mean"]));
  EXPECT_EQ(a["1.num_batches_tracked"].item<int64_t>(), 7);
  EXPECT_FALSE(averaged->parameters()[0].grad().defined());  // no graph was recorded
}

TEST(WeightAverage, CopyWeightsMakesEveryTensorEqual) {
  torch::manual_seed(1);
  auto from = small_model();
  auto to = small_model();
  copy_weights(*to, *from);
  for (size_t i = 0; i < from->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(to->parameters()[i], from->parameters()[i]));
  }
  for (size_t i = 0; i < from->buffers().size(); ++i) {
    EXPECT_TRUE(torch::equal(to->buffers()[i], from->buffers()[i]));
  }
}

}  // namespace
