// Tests of the fused SGD and gradient clipping on the reducer's buckets (bucket_sgd.h): every
// step held to torch::optim::SGD with the same momentum, Nesterov and weight decay, and the
// clipping to torch::nn::utils::clip_grad_norm_, by torch::equal (Note [Fused SGD is
// torch::optim::SGD]); a resume of the momentum buffers; and the misuse that is refused.
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/sgd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/parallel/bucket_sgd.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/reducer.h"

namespace {

using namespace dptrain;

// A conv weight (channels-last, so that views keep strides), its bias, a matrix and a vector:
// in four buckets at a 200-byte limit.
std::vector<torch::Tensor> mixed_layout_parameters(int seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> parameters;
  parameters.push_back(torch::randn({4, 3, 2, 2}).contiguous(at::MemoryFormat::ChannelsLast));
  parameters.push_back(torch::randn({4}));
  parameters.push_back(torch::randn({4, 37}));
  parameters.push_back(torch::randn({37}));
  for (auto& p : parameters) p.requires_grad_();
  return parameters;
}

// A loss that reaches every parameter, on a fixed input.
torch::Tensor loss_of(const std::vector<torch::Tensor>& p) {
  const auto x = torch::linspace(-1, 1, 2 * 3 * 3 * 3).view({2, 3, 3, 3});
  const auto h = torch::conv2d(x, p[0], p[1]).flatten(1);             // (2, 16)
  const auto y = torch::tanh(h.narrow(1, 0, 4)).matmul(p[2]) + p[3];  // (2, 37)
  return y.pow(2).sum();
}

// torch::optim::SGD as a PyTorch user sets it up: with the excluded parameters (one dimension)
// in a group of their own without weight decay.
std::unique_ptr<torch::optim::SGD> reference_sgd(const std::vector<torch::Tensor>& params,
                                                 const SgdOptions& o, double lr) {
  const auto options = [&](double decay) {
    return torch::optim::SGDOptions(lr)
        .momentum(o.momentum)
        .nesterov(o.nesterov)
        .weight_decay(decay);
  };
  if (!o.weight_decay_skip_vectors) {
    return std::make_unique<torch::optim::SGD>(params, options(o.weight_decay));
  }
  std::vector<torch::Tensor> decayed, vectors;
  for (const auto& p : params) (p.dim() <= 1 ? vectors : decayed).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decayed, std::make_unique<torch::optim::SGDOptions>(options(o.weight_decay)));
  groups.emplace_back(vectors, std::make_unique<torch::optim::SGDOptions>(options(0)));
  return std::make_unique<torch::optim::SGD>(groups, options(o.weight_decay));
}

struct SgdCase {
  std::string name;
  SgdOptions options;
};

std::ostream& operator<<(std::ostream& out, const SgdCase& c) { return out << c.name; }

class FusedSgd : public ::testing::TestWithParam<SgdCase> {};

// Steps at changing learning rates (a schedule's), with clipping on the last two.
TEST_P(FusedSgd, EveryStepIsBitIdenticalToTorchOptimSgd) {
  const SgdOptions& o = GetParam().options;
  Communicator single;
  auto params = mixed_layout_parameters(7);
  auto reference = mixed_layout_parameters(7);
  Reducer reducer(params, single, /*bucket_bytes=*/200);
  ASSERT_GE(reducer.num_buckets(), 2u);
  BucketSgd sgd(reducer, o);
  auto torch_sgd = reference_sgd(reference, o, 0.1);
  const double lrs[] = {0.1, 0.05, 0.2, 0.01, 0.3, 0.07};
  for (int step = 0; step < 6; ++step) {
    reducer.zero_grad();
    reducer.prepare_for_backward();
    loss_of(params).backward();
    reducer.finalize_backward();
    torch_sgd->zero_grad();
    loss_of(reference).backward();
    if (step >= 4) {
      const auto norm = clip_gradient_norm(reducer, 0.5);
      const double torch_norm = torch::nn::utils::clip_grad_norm_(reference, 0.5);
      EXPECT_EQ(norm.item<double>(), torch_norm) << "step " << step;
    }
    sgd.step(lrs[step]);
    for (auto& group : torch_sgd->param_groups()) {
      static_cast<torch::optim::SGDOptions&>(group.options()).lr(lrs[step]);
    }
    torch_sgd->step();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(torch::equal(params[i], reference[i])) << "step " << step << " parameter " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, FusedSgd,
    ::testing::Values(SgdCase{"Plain", {}}, SgdCase{"Momentum", {0.9, false, 0, false}},
                      SgdCase{"Nesterov", {0.9, true, 0, false}},
                      SgdCase{"WeightDecay", {0, false, 5e-2, false}},
                      SgdCase{"NesterovWeightDecay", {0.9, true, 5e-2, false}},
                      SgdCase{"NesterovDecaySkipsVectors", {0.9, true, 5e-2, true}}),
    [](const ::testing::TestParamInfo<SgdCase>& info) { return info.param.name; });

TEST(FusedSgdMomentum, ResumedBuffersContinueBitIdentically) {
  const SgdOptions o{0.9, true, 5e-2, true};
  Communicator single;
  auto unbroken = mixed_layout_parameters(3);
  auto resumed = mixed_layout_parameters(3);
  Reducer unbroken_reducer(unbroken, single, /*bucket_bytes=*/200);
  BucketSgd unbroken_sgd(unbroken_reducer, o);
  const auto train_step = [](Reducer& reducer, BucketSgd& sgd, std::vector<torch::Tensor>& p) {
    reducer.zero_grad();
    reducer.prepare_for_backward();
    loss_of(p).backward();
    reducer.finalize_backward();
    sgd.step(0.05);
  };
  for (int step = 0; step < 3; ++step) train_step(unbroken_reducer, unbroken_sgd, unbroken);
  // The resume: the weights and the momentum buffers as a checkpoint holds them (contiguous
  // copies), into a new reducer and optimizer.
  std::vector<torch::Tensor> buffers;
  for (size_t k = 0; k < unbroken.size(); ++k) {
    buffers.push_back(unbroken_sgd.momentum_buffer(k).contiguous().clone());
    torch::NoGradGuard no_grad;
    resumed[k].copy_(unbroken[k]);
  }
  Reducer resumed_reducer(resumed, single, /*bucket_bytes=*/200);
  BucketSgd resumed_sgd(resumed_reducer, o);
  resumed_sgd.load_momentum(buffers);
  for (int step = 0; step < 2; ++step) {
    train_step(unbroken_reducer, unbroken_sgd, unbroken);
    train_step(resumed_reducer, resumed_sgd, resumed);
  }
  for (size_t k = 0; k < unbroken.size(); ++k) {
    EXPECT_TRUE(torch::equal(unbroken[k], resumed[k])) << "parameter " << k;
  }
}

TEST(FusedSgdMomentum, BuffersAreTheParametersShapeAndLayout) {
  Communicator single;
  auto params = mixed_layout_parameters(5);
  Reducer reducer(params, single, /*bucket_bytes=*/200);
  BucketSgd sgd(reducer, SgdOptions{0.5, false, 0, false});
  EXPECT_FALSE(sgd.has_momentum());
  EXPECT_THROW(sgd.momentum_buffer(0), c10::Error);
  reducer.zero_grad();
  reducer.prepare_for_backward();
  loss_of(params).backward();
  reducer.finalize_backward();
  sgd.step(0.1);
  ASSERT_TRUE(sgd.has_momentum());
  for (size_t k = 0; k < params.size(); ++k) {
    const auto buffer = sgd.momentum_buffer(k);
    EXPECT_EQ(buffer.sizes(), params[k].sizes());
    EXPECT_EQ(buffer.strides(), params[k].strides());
    // The first step's buffer is the gradient itself (no weight decay here).
    EXPECT_TRUE(torch::equal(buffer, params[k].grad())) << "parameter " << k;
  }
}

TEST(FusedSgdMisuse, NesterovWithoutMomentumAndBuffersOfAnotherCountAreRefused) {
  Communicator single;
  auto params = mixed_layout_parameters(5);
  Reducer reducer(params, single, /*bucket_bytes=*/200);
  EXPECT_THROW(BucketSgd(reducer, SgdOptions{0, true, 0, false}), UsageError);
  BucketSgd plain(reducer, SgdOptions{});
  EXPECT_THROW(plain.load_momentum({torch::zeros({4})}), c10::Error);
  BucketSgd with_momentum(reducer, SgdOptions{0.9, false, 0, false});
  EXPECT_THROW(with_momentum.load_momentum({torch::zeros({4})}), c10::Error);
}

}  // namespace
