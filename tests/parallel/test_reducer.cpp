// Tests of the gradient reducer (reducer.h): bucket assignment, gradients as bucket views, and
// the all-reduced result over 1, 2 and 3 thread ranks compared with exact expected sums and
// with the single-replica gradient of the whole batch.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <mutex>

#include "dptrain/core/errors.h"
#include "dptrain/data/batching.h"
#include "dptrain/parallel/reducer.h"
#include "support/parallel_support.h"
#include "support/test_support.h"

namespace {

using namespace dptrain;
using dptrain::testing::run_thread_ranks;
using Buckets = std::vector<std::vector<size_t>>;

// ---- Assignment -------------------------------------------------------------------

TEST(BucketAssignment, MixedSizesFillInReverseOrder) {
  // Sizes in bytes of parameters 0..4; limit 100.
  EXPECT_EQ(assign_buckets({40, 30, 50, 20, 60}, 100), (Buckets{{4, 3}, {2, 1}, {0}}));
}

TEST(BucketAssignment, TensorLargerThanLimitGetsItsOwnBucket) {
  EXPECT_EQ(assign_buckets({10, 500, 10, 10}, 100), (Buckets{{3, 2}, {1}, {0}}));
  EXPECT_EQ(assign_buckets({500}, 100), (Buckets{{0}}));
}

TEST(BucketAssignment, TinyLimitGivesOneTensorPerBucket) {
  EXPECT_EQ(assign_buckets({4, 8, 12}, 1), (Buckets{{2}, {1}, {0}}));
}

TEST(BucketAssignment, LargeLimitGivesOneBucket) {
  EXPECT_EQ(assign_buckets({4, 8, 12}, 1 << 20), (Buckets{{2, 1, 0}}));
}

TEST(BucketAssignment, ExactFitStaysInOneBucket) {
  EXPECT_EQ(assign_buckets({50, 49, 1}, 100), (Buckets{{2, 1, 0}}));
  EXPECT_EQ(assign_buckets({50, 50, 1}, 100), (Buckets{{2, 1}, {0}}));
}

TEST(BucketAssignment, RejectsNonPositiveLimit) {
  EXPECT_THROW(assign_buckets({4}, 0), std::invalid_argument);
}

// ---- One rank ---------------------------------------------------------------------

// LibTorch's default generator is one per process: thread ranks that seed it and draw from it
// must take turns, or they race and draw different values.
std::mutex reducer_generator_mutex;

std::vector<torch::Tensor> make_parameters(const std::vector<std::vector<int64_t>>& shapes,
                                           int seed) {
  std::lock_guard<std::mutex> lock(reducer_generator_mutex);
  torch::manual_seed(seed);
  std::vector<torch::Tensor> parameters;
  for (const auto& shape : shapes) parameters.push_back(torch::randn(shape).requires_grad_());
  return parameters;
}

TEST(Reducer, GradientsAreViewsIntoBuckets) {
  Communicator single;
  auto params = make_parameters({{3, 4}, {5}, {2, 2, 2}}, 1);
  Reducer reducer(params, single, /*bucket_bytes=*/64);  // 48, 20 and 32 bytes
  ASSERT_EQ(reducer.num_buckets(), 2u);
  for (const auto& p : params) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_TRUE(torch::all(p.grad() == 0).item<bool>());
  }
  // Writing through a bucket shows in the gradients, and the other way round.
  reducer.bucket(0).fill_(2);
  EXPECT_TRUE(torch::all(params[2].grad() == 2).item<bool>());
  EXPECT_TRUE(torch::all(params[1].grad() == 2).item<bool>());
  reducer.zero_grad();
  EXPECT_TRUE(torch::all(params[2].grad() == 0).item<bool>());
  EXPECT_EQ(reducer.bucket_parameters(0), (std::vector<size_t>{2, 1}));
  EXPECT_EQ(reducer.bucket_parameters(1), (std::vector<size_t>{0}));
}

TEST(Reducer, SingleRankGradientEqualsAutograd) {
  Communicator single;
  auto params = make_parameters({{3, 4}, {4}, {4, 2}}, 2);
  auto reference = make_parameters({{3, 4}, {4}, {4, 2}}, 2);
  Reducer reducer(params, single, /*bucket_bytes=*/40);
  const auto x = torch::randn({6, 3});
  const auto loss_of = [&](const std::vector<torch::Tensor>& p) {
    return torch::tanh(x.matmul(p[0]) + p[1]).matmul(p[2]).pow(2).sum();
  };
  for (int step = 0; step < 2; ++step) {  // twice: zero_grad must reset the views
    reducer.zero_grad();
    reducer.prepare_for_backward();
    loss_of(params).backward();
    reducer.finalize_backward();
  }
  loss_of(reference).backward();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i].grad(), reference[i].grad())) << "parameter " << i;
  }
}

TEST(Reducer, ParametersMoveIntoBucketLayoutUnchanged) {
  Communicator single;
  auto params = make_parameters({{3, 4}, {5}, {2, 2, 2}}, 4);
  const auto before = make_parameters({{3, 4}, {5}, {2, 2, 2}}, 4);
  Reducer reducer(params, single, /*bucket_bytes=*/64);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], before[i])) << "parameter " << i;
    EXPECT_TRUE(params[i].requires_grad());
  }
  // Bucket 0 holds parameters 2 then 1, so parameter 1's data starts after parameter 2's 8
  // floats and the padding up to the next 256 bytes (64 floats), in one flat allocation.
  EXPECT_EQ(params[1].data_ptr<float>(), params[2].data_ptr<float>() + 64);
}

TEST(Reducer, ChannelsLastParameterKeepsItsLayout) {
  Communicator single;
  auto params = make_parameters({{4, 3, 2, 2}, {4}}, 5);
  params[0] = params[0].detach().contiguous(at::MemoryFormat::ChannelsLast).requires_grad_();
  const auto values = params[0].detach().clone();
  Reducer reducer(params, single);
  EXPECT_TRUE(params[0].is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_EQ(params[0].grad().strides(), params[0].strides());
  EXPECT_TRUE(torch::equal(params[0], values));
}

TEST(Reducer, UnusedParameterIsAnErrorNamingIt) {
  Communicator single;
  auto params = make_parameters({{2}, {2}, {3}}, 3);
  ReducerOptions options;
  options.names = {"a", "b", "c"};
  Reducer reducer(params, single, options);
  reducer.prepare_for_backward();
  (params[0] * 3).sum().backward();
  try {
    reducer.finalize_backward();
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "rank 0: parameter 'b' (and 1 more) got no gradient in this backward pass; a "
                 "parameter that takes no part in the loss needs find_unused_parameters = true "
                 "(DataParallelOptions)");
  }
}

// find_unused: the missing gradients are what their slices hold: zeros, or what a backward
// outside prepare/finalize (no_sync) accumulated there.
TEST(Reducer, FindUnusedTakesMissingGradientsAsWhatTheirSlicesHold) {
  Communicator single;
  auto params = make_parameters({{2}, {2}}, 3);
  ReducerOptions options;
  options.find_unused = true;
  Reducer reducer(params, single, options);
  (params[1] * 5).sum().backward();  // disarmed: accumulates, reduces nothing
  reducer.prepare_for_backward();
  (params[0] * 3).sum().backward();
  reducer.finalize_backward();
  EXPECT_TRUE(torch::equal(params[0].grad(), torch::full({2}, 3.0f)));
  EXPECT_TRUE(torch::equal(params[1].grad(), torch::full({2}, 5.0f)));
  reducer.zero_grad();
  reducer.prepare_for_backward();
  (params[0] * 3).sum().backward();
  reducer.finalize_backward();
  EXPECT_TRUE(torch::equal(params[1].grad(), torch::zeros({2})));
}

// Note [One dtype per bucket]: float and double parameters never share a bucket, and the
// buckets are ordered by their highest parameter index, highest first.
TEST(Reducer, ParametersOfTwoDtypesGetBucketsOfTheirOwn) {
  Communicator single;
  auto params = make_parameters({{3}, {4}, {5}, {2}}, 7);
  params[1] = params[1].detach().to(torch::kDouble).requires_grad_();
  params[3] = params[3].detach().to(torch::kDouble).requires_grad_();
  std::vector<torch::Tensor> before;
  for (const auto& p : params) before.push_back(p.detach().clone());
  Reducer reducer(params, single, /*bucket_bytes=*/1 << 20);
  ASSERT_EQ(reducer.num_buckets(), 2u);
  EXPECT_EQ(reducer.bucket_parameters(0), (std::vector<size_t>{3, 1}));
  EXPECT_EQ(reducer.bucket_parameters(1), (std::vector<size_t>{2, 0}));
  EXPECT_EQ(reducer.bucket(0).scalar_type(), torch::kDouble);
  EXPECT_EQ(reducer.bucket(1).scalar_type(), torch::kFloat);
  reducer.prepare_for_backward();
  torch::Tensor loss = torch::zeros({}, torch::kDouble);
  for (size_t i = 0; i < params.size(); ++i) {
    loss = loss + (params[i] * static_cast<double>(i + 1)).sum();
  }
  loss.backward();
  reducer.finalize_backward();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], before[i])) << i;
    EXPECT_EQ(params[i].grad().scalar_type(), before[i].scalar_type()) << i;
    EXPECT_TRUE(torch::all(params[i].grad() == static_cast<double>(i + 1)).item<bool>()) << i;
  }
}

// .grad set undefined (LibTorch 2.x's Optimizer::zero_grad) or replaced: put back as the view,
// zeroed or holding the replacement's values; and an optimizer may detach_() our .grad.
TEST(Reducer, RestoresGradientViewsSetToNoneOrReplaced) {
  Communicator single;
  auto params = make_parameters({{3}, {4}}, 8);
  Reducer reducer(params, single);
  const auto* first = params[0].grad().data_ptr();
  const auto* second = params[1].grad().data_ptr();
  reducer.bucket(0).fill_(7);
  params[0].mutable_grad().detach_();  // what Optimizer::zero_grad does first
  params[0].mutable_grad().reset();
  params[1].mutable_grad() = torch::full({4}, 2.0f);
  reducer.restore_gradient_views();
  EXPECT_EQ(params[0].grad().data_ptr(), first);
  EXPECT_EQ(params[1].grad().data_ptr(), second);
  EXPECT_TRUE(torch::equal(params[0].grad(), torch::zeros({3})));
  EXPECT_TRUE(torch::equal(params[1].grad(), torch::full({4}, 2.0f)));
}

// ---- Several ranks ----------------------------------------------------------------

class ReducerWorld : public ::testing::TestWithParam<int> {};

TEST_P(ReducerWorld, SumsExactlyOverRanks) {
  const int world = GetParam();
  // Shapes chosen so that with a 64-byte limit there are several buckets, one of them holding a
  // single tensor larger than the limit.
  const std::vector<std::vector<int64_t>> shapes{{3}, {40}, {2, 3}, {5}, {7}};
  run_thread_ranks(world, [&](Communicator& communicator) {
    auto params = make_parameters(shapes, 4);
    Reducer reducer(params, communicator, /*bucket_bytes=*/64);
    EXPECT_GE(reducer.num_buckets(), 3u);
    for (int step = 0; step < 3; ++step) {
      reducer.zero_grad();
      reducer.prepare_for_backward();
      // d loss / d p = coefficient, different on every rank: small integers sum exactly.
      torch::Tensor loss = torch::zeros({});
      for (size_t i = 0; i < params.size(); ++i) {
        loss = loss + (params[i] * static_cast<double>(communicator.rank() + 1 + i + step)).sum();
      }
      loss.backward();
      reducer.finalize_backward();
      for (size_t i = 0; i < params.size(); ++i) {
        double expected = 0;
        for (int r = 0; r < world; ++r) expected += r + 1 + static_cast<double>(i) + step;
        EXPECT_TRUE(torch::all(params[i].grad() == expected).item<bool>())
            << "rank " << communicator.rank() << " parameter " << i << " step " << step;
      }
    }
  });
}

// A model without BatchNorm: the all-reduced gradient of the weighted shard losses equals the
// single-replica gradient of the mean loss over the global batch, also for an uneven split.
TEST_P(ReducerWorld, MatchesSingleReplicaGradientOfGlobalBatch) {
  const int world = GetParam();
  constexpr int64_t kGlobalBatch = 11;  // uneven over 2 and 3 ranks
  torch::manual_seed(7);
  const auto x = torch::rand({kGlobalBatch, 1, 8, 8});
  const auto y = torch::randint(0, 10, {kGlobalBatch}, torch::kLong);
  const auto make_model = [] {
    std::lock_guard<std::mutex> lock(reducer_generator_mutex);
    torch::manual_seed(8);
    return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)),
                                 torch::nn::ReLU(), torch::nn::Flatten(),
                                 torch::nn::Linear(4 * 6 * 6, 10));
  };
  auto reference = make_model();
  torch::nn::functional::cross_entropy(reference->forward(x), y).backward();

  run_thread_ranks(world, [&](Communicator& communicator) {
    auto model = make_model();
    Reducer reducer(model->parameters(), communicator, /*bucket_bytes=*/256);
    const auto [begin, end] = shard_range(kGlobalBatch, world, communicator.rank());
    const auto logits = model->forward(x.slice(0, begin, end));
    const auto loss_sum = torch::nn::functional::cross_entropy(
        logits, y.slice(0, begin, end),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    reducer.prepare_for_backward();
    (loss_sum / static_cast<double>(kGlobalBatch)).backward();
    reducer.finalize_backward();
    const auto params = model->parameters();
    const auto expected = reference->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      // Float rounding only: the sums are regrouped by the split.
      EXPECT_TRUE(torch::allclose(params[i].grad(), expected[i].grad(), 1e-5, 1e-7))
          << "parameter " << i << " max diff "
          << (params[i].grad() - expected[i].grad()).abs().max().item<float>();
    }
  });
}

// average: each bucket divided by the world size before the sum, so .grad is the ranks' mean
// (small integers over 2 ranks: exact); a backward outside prepare/finalize reduces nothing.
TEST(ReducerOptions, AverageGivesTheMeanOfWhatEachRankAccumulated) {
  run_thread_ranks(2, [&](Communicator& communicator) {
    auto params = make_parameters({{3}, {40}, {5}}, 9);
    ReducerOptions options;
    options.average = true;
    options.bucket_bytes = 64;
    Reducer reducer(params, communicator, options);
    const double r = communicator.rank();
    const auto loss_of = [&](double scale) {
      torch::Tensor loss = torch::zeros({});
      for (size_t i = 0; i < params.size(); ++i) {
        loss = loss + (params[i] * (scale * static_cast<double>(i + 1))).sum();
      }
      return loss;
    };
    loss_of(r + 1).backward();  // disarmed: this rank's alone
    for (size_t i = 0; i < params.size(); ++i) {
      const double expected = (r + 1) * static_cast<double>(i + 1);
      EXPECT_TRUE(torch::all(params[i].grad() == expected).item<bool>()) << i;
    }
    reducer.prepare_for_backward();
    loss_of(2 * (r + 1)).backward();
    reducer.finalize_backward();
    // Rank 0 holds 3(i+1), rank 1 6(i+1): the mean is 4.5(i+1).
    for (size_t i = 0; i < params.size(); ++i) {
      const double expected = 4.5 * static_cast<double>(i + 1);
      EXPECT_TRUE(torch::all(params[i].grad() == expected).item<bool>()) << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, ReducerWorld, ::testing::Values(1, 2, 3));

}  // namespace
