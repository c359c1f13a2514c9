// Tests of our BatchNorm (batch_norm.h): identical to torch::nn::BatchNorm2d per replica, and in
// synchronised mode N thread ranks on shards compute what one replica computes on the batch.
#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>

#include <cstdint>
#include <mutex>

#include "dptrain/data/batching.h"
#include "dptrain/model/batch_norm.h"
#include "support/parallel_support.h"
#include "support/test_support.h"

namespace {

using namespace dptrain;
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

}  // namespace
