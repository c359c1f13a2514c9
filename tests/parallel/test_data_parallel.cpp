// Tests of DataParallel (data_parallel.h) over thread ranks with Gloo: N replicas, each on its
// shard, against ONE replica on the concatenated batch (an MLP with Adam, gradient accumulation
// under no_sync, tied weights, an unused branch, two dtypes), and each wrong use's one error.
// Not here: sync BatchNorm through DataParallel (tests/model/test_batch_norm.cpp).
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/parallel/bucket_sgd.h"
#include "dptrain/parallel/data_parallel.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/world.h"
#include "support/parallel_support.h"

namespace {

using namespace dptrain;
using dptrain::testing::largest_difference;
using dptrain::testing::LargestDifference;
using dptrain::testing::run_thread_ranks;
using namespace std::chrono_literals;
namespace F = torch::nn::functional;

// ---- Models and data --------------------------------------------------------------

// LibTorch's default generator is one per process: thread ranks that seed it take turns.
std::mutex data_parallel_generator_mutex;

template <typename Make>
auto seeded(int seed, Make make) {
  std::lock_guard<std::mutex> lock(data_parallel_generator_mutex);
  torch::manual_seed(seed);
  return make();
}

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t hidden = 8)
      : fc1(register_module("fc1", torch::nn::Linear(6, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 3))) {}
  // x: (N, 6) -> (N, 3), in fc2's dtype
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(torch::tanh(fc1(x)).to(fc2->weight.scalar_type()));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

// One layer applied twice: its parameters get the sum of two gradients in one backward.
struct TiedImpl : torch::nn::Module {
  TiedImpl()
      : shared(register_module("shared", torch::nn::Linear(6, 6))),
        head(register_module("head", torch::nn::Linear(6, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) {  // (N, 6) -> (N, 3)
    return head(torch::tanh(shared(torch::tanh(shared(x)))));
  }
  torch::nn::Linear shared, head;
};
TORCH_MODULE(Tied);

// `branch` takes part only where use_branch is set (a conditional path).
struct BranchyImpl : torch::nn::Module {
  BranchyImpl()
      : used(register_module("used", torch::nn::Linear(6, 3))),
        branch(register_module("branch", torch::nn::Linear(6, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) {  // (N, 6) -> (N, 3)
    return use_branch ? used(x) + branch(x) : used(x);
  }
  torch::nn::Linear used, branch;
  bool use_branch = false;
};
TORCH_MODULE(Branchy);

struct Batch {
  torch::Tensor x;  // (N, 6)
  torch::Tensor y;  // (N, 3)
};

std::vector<Batch> make_batches(int count, int64_t size, int seed) {
  return seeded(seed, [&] {
    std::vector<Batch> batches;
    for (int i = 0; i < count; ++i)
      batches.push_back({torch::randn({size, 6}), torch::randn({size, 3})});
    return batches;
  });
}

// Rank `rank`'s equal share of `batch` among `world` ranks.
Batch shard(const Batch& batch, int world, int rank) {
  const int64_t size = batch.x.size(0) / world;
  return {batch.x.slice(0, rank * size, (rank + 1) * size),
          batch.y.slice(0, rank * size, (rank + 1) * size)};
}

template <typename Model>
torch::Tensor mse(Model& model, const Batch& batch) {
  const auto output = model->forward(batch.x);
  return F::mse_loss(output, batch.y.to(output.scalar_type()));
}

// One replica on the whole batches: a step of LibTorch's SGD at `lr` on each, the reference the
// wrapped replicas are held to.
template <typename Model>
void train_with_sgd(Model& model, const std::vector<Batch>& batches, double lr) {
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(lr));
  for (const auto& batch : batches) {
    sgd.zero_grad();
    mse(model, batch).backward();
    sgd.step();
  }
}

// The optimizer's own zero_grad: LibTorch 2.x sets every .grad undefined (its default), 1.13
// zeroes them in place and takes no argument.
void optimizer_zero_grad(torch::optim::Optimizer& optimizer) {
#if TORCH_VERSION_MAJOR >= 2
  optimizer.zero_grad(/*set_to_none=*/true);
#else
  optimizer.zero_grad();
#endif
}

std::vector<torch::Tensor> gradients(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters) grads.push_back(p.grad());
  return grads;
}

// ---- N replicas against one -------------------------------------------------------

class DataParallelWorld : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelWorld, MlpWithAdamEqualsOneReplicaOnTheWholeBatch) {
  const int world = GetParam();
  constexpr int kSteps = 4;
  const auto batches = make_batches(kSteps, 4 * world, 1);
  auto reference = seeded(10, [] { return Mlp(); });
  torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(0.01));
  for (const auto& batch : batches) {
    optimizer_zero_grad(reference_adam);
    mse(reference, batch).backward();
    reference_adam.step();
  }
  LargestDifference largest;
  run_thread_ranks(world, [&](Communicator& communicator) {
    auto model = seeded(10 + communicator.rank(), [] { return Mlp(); });  // rank 0's wins
    DataParallel parallel(model.ptr(), communicator);
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
    for (const auto& batch : batches) {
      optimizer_zero_grad(adam);
      parallel.backward(mse(model, shard(batch, world, communicator.rank())));
      adam.step();
    }
    largest.update(largest_difference(model->parameters(), reference->parameters()));
  });
  EXPECT_LT(largest.report("adam mlp, world " + std::to_string(world)), 1e-6);
}

// K micro-batches per rank, the first K-1 under no_sync and the last synchronised, against one
// replica on a batch K times larger (times the world).
TEST_P(DataParallelWorld, NoSyncAccumulationEqualsOneLargerBatch) {
  const int world = GetParam();
  constexpr int kMicroBatches = 3;
  const auto micro = make_batches(kMicroBatches, 2 * world, 2);
  const Batch whole{torch::cat({micro[0].x, micro[1].x, micro[2].x}),
                    torch::cat({micro[0].y, micro[1].y, micro[2].y})};
  auto reference = seeded(20, [] { return Mlp(); });
  mse(reference, whole).backward();
  const auto reference_grads = gradients(reference->parameters());
  torch::optim::SGD(reference->parameters(), torch::optim::SGDOptions(0.1)).step();
  LargestDifference grads_largest;
  LargestDifference params_largest;
  run_thread_ranks(world, [&](Communicator& communicator) {
    auto model = seeded(20 + communicator.rank(), [] { return Mlp(); });
    DataParallel parallel(model.ptr(), communicator);
    for (int k = 0; k < kMicroBatches; ++k) {
      const auto loss = mse(model, shard(micro[k], world, communicator.rank())) / kMicroBatches;
      if (k + 1 < kMicroBatches) {
        const auto no_sync = parallel.no_sync();
        parallel.backward(loss);
      } else {
        parallel.backward(loss);
      }
    }
    grads_largest.update(largest_difference(gradients(model->parameters()), reference_grads));
    parallel.sgd_step(0.1);
    params_largest.update(largest_difference(model->parameters(), reference->parameters()));
  });
  const auto world_name = ", world " + std::to_string(world);
  EXPECT_LT(grads_largest.report("no_sync accumulation gradients" + world_name), 1e-6);
  EXPECT_LT(params_largest.report("no_sync accumulation parameters" + world_name), 1e-7);
}

TEST_P(DataParallelWorld, TiedWeightsEqualOneReplicaOnTheWholeBatch) {
  const int world = GetParam();
  const auto batches = make_batches(3, 4 * world, 3);
  auto reference = seeded(30, [] { return Tied(); });
  train_with_sgd(reference, batches, 0.2);
  LargestDifference largest;
  run_thread_ranks(world, [&](Communicator& communicator) {
    auto model = seeded(30 + communicator.rank(), [] { return Tied(); });
    DataParallel parallel(model.ptr(), communicator);
    for (const auto& batch : batches) {
      parallel.zero_grad();
      parallel.backward(mse(model, shard(batch, world, communicator.rank())));
      parallel.sgd_step(0.2);
    }
    largest.update(largest_difference(model->parameters(), reference->parameters()));
  });
  EXPECT_LT(largest.report("tied weights, world " + std::to_string(world)), 1e-6);
}

TEST_P(DataParallelWorld, UnusedBranchWithFindUnusedEqualsTheModelWithoutIt) {
  const int world = GetParam();
  const auto batches = make_batches(3, 4 * world, 4);
  // `used` is registered first, so the same seed gives it the values of this lone layer.
  auto reference = seeded(40, [] { return torch::nn::Linear(6, 3); });
  train_with_sgd(reference, batches, 0.2);
  LargestDifference largest;
  run_thread_ranks(world, [&](Communicator& communicator) {
    auto model = seeded(40 + communicator.rank(), [] { return Branchy(); });
    DataParallelOptions options;
    options.find_unused_parameters = true;
    DataParallel parallel(model.ptr(), communicator, options);
    const auto branch_before = model->branch->weight.detach().clone();
    for (const auto& batch : batches) {
      parallel.zero_grad();
      parallel.backward(mse(model, shard(batch, world, communicator.rank())));
      EXPECT_TRUE(torch::equal(model->branch->weight.grad(), torch::zeros({3, 6})));
      EXPECT_TRUE(torch::equal(model->branch->bias.grad(), torch::zeros({3})));
      parallel.sgd_step(0.2);
    }
    EXPECT_TRUE(torch::equal(model->branch->weight, branch_before));
    largest.update(largest_difference(model->used->parameters(), reference->parameters()));
  });
  EXPECT_LT(largest.report("unused branch, world " + std::to_string(world)), 1e-6);
}

// A float body and a double head: each dtype in buckets of its own.
TEST_P(DataParallelWorld, ParametersOfTwoDtypesEqualOneReplica) {
  const int world = GetParam();
  const auto batches = make_batches(3, 4 * world, 5);
  const auto make = [] {
    Mlp model;
    model->fc2->to(torch::kDouble);
    return model;
  };
  auto reference = seeded(50, make);
  train_with_sgd(reference, batches, 0.2);
  LargestDifference largest;
  run_thread_ranks(world, [&](Communicator& communicator) {
    auto model = seeded(50 + communicator.rank(), make);
    DataParallelOptions options;
    options.bucket_bytes = 64;  // several buckets of each dtype
    DataParallel parallel(model.ptr(), communicator, options);
    EXPECT_EQ(model->fc1->weight.scalar_type(), torch::kFloat);
    EXPECT_EQ(model->fc2->weight.scalar_type(), torch::kDouble);
    for (const auto& batch : batches) {
      parallel.zero_grad();
      parallel.backward(mse(model, shard(batch, world, communicator.rank())));
      parallel.sgd_step(0.2);
    }
    largest.update(largest_difference(model->parameters(), reference->parameters()));
  });
  EXPECT_LT(largest.report("float and double, world " + std::to_string(world)), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Worlds, DataParallelWorld, ::testing::Values(2, 3));

// The World& overload, the replicas threads of this process (run_replicas, world.h).
TEST(DataParallel, ReplicasOfOneProcessWrapThroughTheirWorld) {
  const auto batches = make_batches(3, 8, 14);
  auto reference = seeded(140, [] { return Mlp(); });
  train_with_sgd(reference, batches, 0.2);
  LargestDifference largest;
  run_replicas({torch::Device(torch::kCPU), torch::Device(torch::kCPU)}, [&](World& world) {
    auto model = seeded(140 + world.rank(), [] { return Mlp(); });
    DataParallel parallel(model, world);
    for (const auto& batch : batches) {
      parallel.zero_grad();
      parallel.backward(mse(model, shard(batch, 2, world.rank())));
      parallel.sgd_step(0.2);
    }
    largest.update(largest_difference(model->parameters(), reference->parameters()));
  });
  EXPECT_LT(largest.report("replicas of one process through World, world 2"), 1e-6);
}

// ---- Optimizers ---------------------------------------------------------------------

// The fused update and LibTorch's SGD, each on a wrapped copy of the same model: the same bits.
TEST(DataParallel, SgdStepIsBitIdenticalToTorchOptimSgd) {
  const auto batches = make_batches(3, 8, 6);
  run_thread_ranks(2, [&](Communicator& communicator) {
    auto fused = seeded(60, [] { return Mlp(); });
    auto plain = seeded(60, [] { return Mlp(); });
    DataParallel fused_parallel(fused.ptr(), communicator);
    DataParallel plain_parallel(plain.ptr(), communicator);
    torch::optim::SGD sgd(plain->parameters(), torch::optim::SGDOptions(0.3));
    for (const auto& batch : batches) {
      const auto mine = shard(batch, 2, communicator.rank());
      fused_parallel.zero_grad();
      fused_parallel.backward(mse(fused, mine));
      fused_parallel.sgd_step(0.3);
      optimizer_zero_grad(sgd);
      plain_parallel.backward(mse(plain, mine));
      sgd.step();
    }
    const auto a = fused->parameters();
    const auto b = plain->parameters();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
  });
}

// The wrapper's SGD with Nesterov momentum and weight decay, at a rate that changes every step,
// and clipping on the last two steps, against torch::optim::SGD and clip_grad_norm_ on a wrapped
// copy of the same model: the same bits, and the same norm.
TEST(DataParallel, SgdStepWithNesterovWeightDecayAndClippingIsBitIdenticalToTorchOptim) {
  const auto batches = make_batches(4, 8, 16);
  const double lrs[] = {0.3, 0.1, 0.2, 0.05};
  run_thread_ranks(2, [&](Communicator& communicator) {
    auto fused = seeded(61, [] { return Mlp(); });
    auto plain = seeded(61, [] { return Mlp(); });
    DataParallelOptions options;
    options.sgd.momentum = 0.9;
    options.sgd.nesterov = true;
    options.sgd.weight_decay = 0.01;
    DataParallel fused_parallel(fused.ptr(), communicator, options);
    DataParallel plain_parallel(plain.ptr(), communicator);
    torch::optim::SGD sgd(
        plain->parameters(),
        torch::optim::SGDOptions(lrs[0]).momentum(0.9).nesterov(true).weight_decay(0.01));
    for (size_t step = 0; step < batches.size(); ++step) {
      const auto mine = shard(batches[step], 2, communicator.rank());
      fused_parallel.zero_grad();
      fused_parallel.backward(mse(fused, mine));
      optimizer_zero_grad(sgd);
      plain_parallel.backward(mse(plain, mine));
      if (step >= 2) {
        const auto norm = fused_parallel.clip_grad_norm(0.05);
        EXPECT_EQ(norm.item<double>(), torch::nn::utils::clip_grad_norm_(plain->parameters(), 0.05))
            << "step " << step;
      }
      fused_parallel.sgd_step(lrs[step]);
      static_cast<torch::optim::SGDOptions&>(sgd.param_groups()[0].options()).lr(lrs[step]);
      sgd.step();
    }
    ASSERT_TRUE(fused_parallel.sgd().has_momentum());
    const auto a = fused->parameters();
    const auto b = plain->parameters();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
  });
}

// SGD options out of range are refused when wrapping, a clipping bound that is not a positive
// number when clipping: one UsageError line each, naming the value.
TEST(DataParallel, SgdOptionsOutOfRangeAndABadClippingBoundAreRefused) {
  Communicator single;
  auto model = seeded(62, [] { return Mlp(); });
  const auto refused = [&](SgdOptions sgd, const std::string& expected) {
    DataParallelOptions options;
    options.sgd = sgd;
    try {
      DataParallel parallel(model.ptr(), single, options);
      ADD_FAILURE() << "accepted: " << expected;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), expected);
    }
  };
  refused({1.0, false, 0, false}, "SGD: momentum 1 is out of range; expected 0 <= momentum < 1");
  refused({-0.5, false, 0, false},
          "SGD: momentum -0.5 is out of range; expected 0 <= momentum < 1");
  refused({0, false, std::nan(""), false},
          "SGD: weight decay nan is out of range; expected a finite number >= 0");
  refused({0, true, 0, false}, "SGD: Nesterov momentum needs momentum > 0");
  DataParallel parallel(model.ptr(), single);
  for (const double bound : {0.0, -1.0, std::nan("")}) {
    EXPECT_THROW(parallel.clip_grad_norm(bound), UsageError) << bound;
  }
}

// .grad set undefined (LibTorch 2.x's zero_grad) or replaced by another tensor between steps:
// the next backward puts the bucket views back, zeroed or with the replacement's values.
TEST(DataParallel, GradientsSetToNoneOrReplacedAreViewsAgainAfterBackward) {
  const auto batches = make_batches(2, 8, 7);
  auto reference = seeded(70, [] { return Mlp(); });
  mse(reference, shard(batches[1], 1, 0)).backward();
  run_thread_ranks(2, [&](Communicator& communicator) {
    auto model = seeded(70, [] { return Mlp(); });
    DataParallel parallel(model.ptr(), communicator);
    std::vector<const void*> views;
    for (const auto& p : model->parameters()) views.push_back(p.grad().data_ptr());
    parallel.backward(mse(model, shard(batches[0], 2, communicator.rank())));
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.0));
    optimizer_zero_grad(sgd);  // in place on 1.13: detach_() must accept our .grad
    for (auto& p : model->parameters()) p.mutable_grad().reset();
    model->fc2->bias.mutable_grad() = torch::full({3}, 0.5);  // a stray replacement
    parallel.backward(mse(model, shard(batches[1], 2, communicator.rank())));
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].grad().data_ptr(), views[i]) << i;
    }
    // The replacement's 0.5 was added on both ranks before the mean: 0.5 more than the batch's.
    auto expected = gradients(reference->parameters());
    expected[3] = expected[3] + 0.5;
    EXPECT_LT(largest_difference(gradients(params), expected), 1e-6);
  });
}

// ---- Buffers --------------------------------------------------------------------------

struct WithBufferImpl : torch::nn::Module {
  WithBufferImpl()
      : fc(register_module("fc", torch::nn::Linear(6, 3))),
        seen(register_buffer("seen", torch::zeros({6}))) {}
  torch::Tensor forward(const torch::Tensor& x) {  // (N, 6) -> (N, 3)
    seen.add_(x.detach().mean(0));                 // a running statistic of this rank's own shard
    return fc(x);
  }
  torch::nn::Linear fc;
  torch::Tensor seen;
};
TORCH_MODULE(WithBuffer);

TEST(DataParallel, BuffersAreRankZerosAfterEachBackward) {
  const auto batches = make_batches(2, 8, 8);
  run_thread_ranks(2, [&](Communicator& communicator) {
    auto model = seeded(80, [] { return WithBuffer(); });
    DataParallel parallel(model.ptr(), communicator);
    auto rank0_seen = torch::zeros({6});
    for (const auto& batch : batches) {
      const auto mine = shard(batch, 2, communicator.rank());
      rank0_seen += shard(batch, 2, 0).x.mean(0);
      parallel.zero_grad();
      const auto loss = mse(model, mine);
      EXPECT_EQ(torch::equal(model->seen, rank0_seen), communicator.rank() == 0);
      parallel.backward(loss);
      EXPECT_TRUE(torch::equal(model->seen, rank0_seen)) << "rank " << communicator.rank();
    }
  });
}

// ---- Wrong uses: one clear error each -------------------------------------------------

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no UsageError";
}

TEST(DataParallel, UnusedParameterWithoutFindUnusedIsAnErrorNamingIt) {
  const auto batch = make_batches(1, 8, 9).front();
  std::vector<std::string> errors(2);
  run_thread_ranks(2, [&](Communicator& communicator) {
    auto model = seeded(90, [] { return Branchy(); });
    DataParallel parallel(model.ptr(), communicator);
    errors[communicator.rank()] =
        error_of([&] { parallel.backward(mse(model, shard(batch, 2, communicator.rank()))); });
  });
  for (const auto& error : errors) {
    EXPECT_NE(error.find("'branch.weight'"), std::string::npos) << error;
    EXPECT_NE(error.find("find_unused_parameters"), std::string::npos) << error;
  }
}

// Only rank 1 skips the branch: it names the parameter, and rank 0, whose all-reduce rank 1
// will never join, fails at once instead of at the timeout.
TEST(DataParallel, ARankWhosePeerLackedAGradientFailsFastInsteadOfHanging) {
  const auto batch = make_batches(1, 8, 10).front();
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  run_thread_ranks(
      2,
      [&](Communicator& communicator) {
        auto model = seeded(100, [] { return Branchy(); });
        model->use_branch = communicator.rank() == 0;
        DataParallel parallel(model.ptr(), communicator);
        try {
          parallel.backward(mse(model, shard(batch, 2, communicator.rank())));
          errors[communicator.rank()] = "no error";
        } catch (const std::exception& e) {
          errors[communicator.rank()] = e.what();
        }
      },
      20s);
  const auto seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "a peer's missing gradient ended rank 0 after " << seconds << " s\n";
  EXPECT_LT(seconds, 8.0);
  EXPECT_NE(errors[1].find("rank 1: parameter 'branch.weight'"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("gradient all-reduce"), std::string::npos) << errors[0];
}

TEST(DataParallel, SecondBackwardWithoutStepOrZeroGradIsRefused) {
  const auto batches = make_batches(2, 8, 11);
  run_thread_ranks(2, [&](Communicator& communicator) {
    auto model = seeded(110, [] { return Mlp(); });
    DataParallel parallel(model.ptr(), communicator);
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
    const auto mine = shard(batches[0], 2, communicator.rank());
    parallel.backward(mse(model, mine));
    const auto error = error_of([&] { parallel.backward(mse(model, mine)); });
    EXPECT_NE(error.find("no_sync()"), std::string::npos) << error;
    adam.step();  // a step makes the next backward legitimate, as does a zero_grad
    parallel.backward(mse(model, mine));
    optimizer_zero_grad(adam);
    parallel.backward(mse(model, mine));
    parallel.zero_grad();
    parallel.backward(mse(model, mine));
  });
}

TEST(DataParallel, ParameterReplacedAfterWrappingIsNamed) {
  const auto batch = make_batches(1, 8, 12).front();
  run_thread_ranks(2, [&](Communicator& communicator) {
    const auto mine = shard(batch, 2, communicator.rank());
    auto model = seeded(120, [] { return Mlp(); });
    DataParallel parallel(model.ptr(), communicator);
    model->fc2->weight.set_data(torch::randn({3, 8}));
    auto error = error_of([&] { parallel.backward(mse(model, mine)); });
    EXPECT_NE(error.find("parameter 'fc2.weight' was replaced or moved"), std::string::npos)
        << error;
    auto converted = seeded(121, [] { return Mlp(); });
    DataParallel converted_parallel(converted.ptr(), communicator);
    converted->to(torch::kDouble);
    const Batch mine_double{mine.x.to(torch::kDouble), mine.y.to(torch::kDouble)};
    error = error_of([&] { converted_parallel.backward(mse(converted, mine_double)); });
    EXPECT_NE(error.find("parameter 'fc1.weight' was replaced or moved"), std::string::npos)
        << error;
  });
}

// A rank whose options are out of range refuses them, and its peer learns it in the same
// collective instead of waiting for it until the timeout; valid options that differ between
// ranks (here Nesterov on one) are refused on both, each saying its own.
TEST(DataParallel, RanksWithBadOrDifferentOptionsAreRefusedOnEveryRank) {
  std::vector<std::string> errors(2);
  const auto wrap_all = [&](const std::function<SgdOptions(int)>& sgd_of_rank) {
    run_thread_ranks(2, [&](Communicator& communicator) {
      auto model = seeded(132, [] { return Mlp(); });
      DataParallelOptions options;
      options.sgd = sgd_of_rank(communicator.rank());
      errors[communicator.rank()] =
          error_of([&] { DataParallel parallel(model.ptr(), communicator, options); });
    });
  };
  wrap_all([](int rank) { return rank == 1 ? SgdOptions{1.5, false, 0, false} : SgdOptions{}; });
  EXPECT_EQ(errors[1], "SGD: momentum 1.5 is out of range; expected 0 <= momentum < 1");
  EXPECT_EQ(errors[0],
            "DataParallel: rank 1 refused its options (out of range; that rank names the option): "
            "every rank must wrap with the same valid options");
  wrap_all([](int rank) { return SgdOptions{0.9, rank == 1, 0, false}; });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(errors[rank],
              "rank " + std::to_string(rank) +
                  "'s DataParallelOptions differ from another rank's (here: "
                  "bucket_bytes 26214400, average 1, find_unused_parameters 0, "
                  "buffers broadcast, sync_batch_norm 0, momentum 0.90000000000000002, "
                  "nesterov " +
                  std::to_string(rank) +
                  ", weight_decay 0, weight_decay_skip_vectors 0): every rank must "
                  "wrap with the same options");
  }
  wrap_all([](int) { return SgdOptions{0.9, true, 5e-4, true}; });  // the same on both: accepted
  EXPECT_EQ(errors, std::vector<std::string>(2, "no UsageError"));
}

TEST(DataParallel, RanksWithDifferentParametersAreRefusedByName) {
  std::vector<std::string> errors(2);
  run_thread_ranks(2, [&](Communicator& communicator) {
    auto model = seeded(130, [&] { return Mlp(communicator.rank() == 0 ? 8 : 9); });
    errors[communicator.rank()] =
        error_of([&] { DataParallel parallel(model.ptr(), communicator); });
  });
  EXPECT_NE(errors[0].find("rank 0's module differs from another rank's at parameter "
                           "'fc1.weight' (float [8, 6] here)"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("(float [9, 6] here)"), std::string::npos) << errors[1];
  run_thread_ranks(2, [&](Communicator& communicator) {
    auto model = seeded(131, [&] { return Branchy(); });
    if (communicator.rank() == 1) model->unregister_module("branch");
    errors[communicator.rank()] =
        error_of([&] { DataParallel parallel(model.ptr(), communicator); });
  });
  EXPECT_NE(errors[1].find("rank 1's module has 2 parameters, another rank's has 4"),
            std::string::npos)
      << errors[1];
}

}  // namespace
