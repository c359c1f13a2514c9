// Tests of our BatchNorm (batch_norm.h): identical to torch::nn::BatchNorm2d per replica, and in
// synchronised mode N thread ranks on shards compute what one replica computes on the batch.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "dptrain/data/batching.h"
#include "dptrain/model/batch_norm.h"
#include "dptrain/parallel/data_parallel.h"
#include "support/parallel_support.h"
#include "support/test_support.h"

namespace {

using namespace dptrain;
using dptrain::testing::largest_difference;
using dptrain::testing::LargestDifference;
using dptrain::testing::run_thread_ranks;

// A BatchNorm with non-trivial affine parameters and running statistics.
BatchNorm make_batch_norm(int64_t channels) {
  // LibTorch's default generator is one per process: thread ranks must take turns with it.
  static std::mutex generator_mutex;
  std::lock_guard<std::mutex> lock(generator_mutex);
  BatchNorm bn(channels);
  torch::NoGradGuard no_grad;
  torch::manual_seed(11);
  bn->weight.uniform_(0.5, 1.5);
  bn->bias.uniform_(-0.5, 0.5);
  bn->running_mean.uniform_(-1, 1);
  bn->running_var.uniform_(0.5, 2);
  return bn;
}

TEST(BatchNorm, MatchesTorchBatchNorm2dBitForBit) {
  auto ours = make_batch_norm(3);
  torch::nn::BatchNorm2d theirs(3);
  {
    torch::NoGradGuard no_grad;
    theirs->weight.copy_(ours->weight);
    theirs->bias.copy_(ours->bias);
    theirs->running_mean.copy_(ours->running_mean);
    theirs->running_var.copy_(ours->running_var);
  }
  const auto x = torch::randn({4, 3, 5, 5});
  const auto g = torch::randn({4, 3, 5, 5});
  ours->forward(x).backward(g);
  theirs->forward(x).backward(g);
  EXPECT_TRUE(torch::equal(ours->weight.grad(), theirs->weight.grad()));
  EXPECT_TRUE(torch::equal(ours->bias.grad(), theirs->bias.grad()));
  EXPECT_TRUE(torch::equal(ours->running_mean, theirs->running_mean));
  EXPECT_TRUE(torch::equal(ours->running_var, theirs->running_var));
  EXPECT_TRUE(torch::equal(ours->num_batches_tracked, theirs->num_batches_tracked));
  ours->eval();
  theirs->eval();
  EXPECT_TRUE(torch::equal(ours->forward(x), theirs->forward(x)));
}

TEST(BatchNorm, SynchronisedWorldOfOneMatchesPerReplica) {
  // The same statistics by another formula: equal up to float rounding.
  auto plain = make_batch_norm(3);
  auto synced = make_batch_norm(3);
  Communicator single;
  synced->set_sync(&single);
  const auto x = torch::randn({6, 3, 4, 4}).requires_grad_();
  const auto x2 = x.detach().clone().requires_grad_();
  const auto g = torch::randn({6, 3, 4, 4});
  const auto y_plain = plain->forward(x);
  const auto y_synced = synced->forward(x2);
  EXPECT_TRUE(torch::allclose(y_plain, y_synced, 1e-5, 1e-5));
  y_plain.backward(g);
  y_synced.backward(g);
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(plain->weight.grad(), synced->weight.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(plain->running_var, synced->running_var, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(plain->running_mean, synced->running_mean, 1e-5, 1e-6));
}

class SyncBatchNormWorld : public ::testing::TestWithParam<int> {};

TEST_P(SyncBatchNormWorld, ShardsComputeWhatOneReplicaComputesOnTheBatch) {
  const int world = GetParam();
  constexpr int64_t kBatch = 7;  // uneven over 2 and 3 ranks
  torch::manual_seed(12);
  const auto x = torch::randn({kBatch, 3, 4, 4}) * 2 + 1;
  const auto g = torch::randn({kBatch, 3, 4, 4});

  // One replica on the whole batch, synchronised over a world of one.
  Communicator single;
  auto reference = make_batch_norm(3);
  reference->set_sync(&single);
  const auto x_ref = x.clone().requires_grad_();
  const auto y_ref = reference->forward(x_ref);
  y_ref.backward(g);

  run_thread_ranks(world, [&](Communicator& communicator) {
    auto bn = make_batch_norm(3);
    bn->set_sync(&communicator);
    const auto [begin, end] = shard_range(kBatch, world, communicator.rank());
    const auto x_shard = x.slice(0, begin, end).clone().requires_grad_();
    const auto y = bn->forward(x_shard);
    y.backward(g.slice(0, begin, end));
    const int r = communicator.rank();
    EXPECT_TRUE(torch::allclose(y, y_ref.slice(0, begin, end), 1e-5, 1e-6)) << "rank " << r;
    EXPECT_TRUE(torch::allclose(x_shard.grad(), x_ref.grad().slice(0, begin, end), 1e-4, 1e-6))
        << "rank " << r;
    EXPECT_TRUE(torch::allclose(bn->running_mean, reference->running_mean, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(bn->running_var, reference->running_var, 1e-5, 1e-6));
    // Parameter gradients are per-shard partial sums: together they make the whole.
    auto weight_grad = bn->weight.grad().clone();
    communicator.allreduce_sum(weight_grad, "test");
    EXPECT_TRUE(torch::allclose(weight_grad, reference->weight.grad(), 1e-4, 1e-5));
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, SyncBatchNormWorld, ::testing::Values(1, 2, 3));

// ---- Through DataParallel -----------------------------------------------------------

// A convolution, our BatchNorm and a linear head: statistics, buffers and all.
struct ConvBatchNormImpl : torch::nn::Module {
  ConvBatchNormImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 3, 3)))),
        bn(register_module("bn", BatchNorm(3))),
        fc(register_module("fc", torch::nn::Linear(3 * 4 * 4, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) {  // (N, 1, 6, 6) -> (N, 2)
    return fc(torch::relu(bn(conv(x))).flatten(1));
  }
  torch::nn::Conv2d conv;
  BatchNorm bn;
  torch::nn::Linear fc;
};
TORCH_MODULE(ConvBatchNorm);

ConvBatchNorm make_conv_batch_norm(int seed) {
  static std::mutex generator_mutex;
  std::lock_guard<std::mutex> lock(generator_mutex);
  torch::manual_seed(seed);
  return ConvBatchNorm();
}

std::vector<torch::Tensor> state_of(torch::nn::Module& module) {
  auto state = module.parameters();
  for (const auto& buffer : module.buffers()) state.push_back(buffer);
  return state;
}

class DataParallelBatchNormWorld : public ::testing::TestWithParam<int> {};

// DataParallel with sync_batch_norm: N replicas on their shards end where one replica on the
// whole batch ends, weights and running statistics alike.
TEST_P(DataParallelBatchNormWorld, SyncBatchNormEqualsOneReplicaOnTheWholeBatch) {
  const int world = GetParam();
  constexpr int kSteps = 3;
  constexpr int64_t kShard = 3;
  torch::manual_seed(13);
  std::vector<torch::Tensor> xs;
  std::vector<torch::Tensor> ys;
  for (int step = 0; step < kSteps; ++step) {
    xs.push_back(torch::randn({kShard * world, 1, 6, 6}) * 2 + 1);
    ys.push_back(torch::randn({kShard * world, 2}));
  }
  auto reference = make_conv_batch_norm(14);
  torch::optim::SGD sgd(reference->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad();
    torch::nn::functional::mse_loss(reference->forward(xs[step]), ys[step]).backward();
    sgd.step();
  }
  LargestDifference largest;
  run_thread_ranks(world, [&](Communicator& communicator) {
    auto model = make_conv_batch_norm(14 + communicator.rank());  // rank 0's wins
    DataParallelOptions options;
    options.sync_batch_norm = true;
    DataParallel parallel(model.ptr(), communicator, options);
    const int64_t begin = kShard * communicator.rank();
    for (int step = 0; step < kSteps; ++step) {
      parallel.zero_grad();
      const auto logits = model->forward(xs[step].slice(0, begin, begin + kShard));
      parallel.backward(
          torch::nn::functional::mse_loss(logits, ys[step].slice(0, begin, begin + kShard)));
      parallel.sgd_step(0.1);
    }
    EXPECT_TRUE(torch::equal(model->bn->num_batches_tracked, reference->bn->num_batches_tracked));
    largest.update(largest_difference(state_of(*model), state_of(*reference)));
  });
  EXPECT_LT(largest.report("sync batch norm, world " + std::to_string(world)), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Worlds, DataParallelBatchNormWorld, ::testing::Values(2, 3));

}  // namespace
