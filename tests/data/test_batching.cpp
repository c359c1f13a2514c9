// Tests of batching.h: epoch orders (deterministic in seed and epoch, a permutation, fixed bits),
// global batch ranges with a partial last batch, and replica shards; the sequence of global
// batches must not depend on the number of replicas.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/data/batching.h"
#include "dptrain/core/random.h"

namespace {

using namespace dptrain;

using Range = std::pair<int64_t, int64_t>;

bool is_permutation_of_iota(const std::vector<int64_t>& order) {
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// epoch_order

TEST(BatchingEpochOrder, SameSeedAndEpochGiveTheSameOrder) {
  EXPECT_EQ(epoch_order(1000, 42, 3), epoch_order(1000, 42, 3));
  EXPECT_EQ(epoch_order(60000, 7, 0), epoch_order(60000, 7, 0));
}

TEST(BatchingEpochOrder, DifferentEpochsGiveDifferentOrders) {
  const auto first = epoch_order(1000, 42, 0);
  for (int64_t epoch = 1; epoch < 10; ++epoch) {
    EXPECT_NE(epoch_order(1000, 42, epoch), first) << "epoch " << epoch;
  }
}

TEST(BatchingEpochOrder, DifferentSeedsGiveDifferentOrders) {
  const auto first = epoch_order(1000, 0, 2);
  for (uint64_t seed = 1; seed < 10; ++seed) {
    EXPECT_NE(epoch_order(1000, seed, 2), first) << "seed " << seed;
  }
}

TEST(BatchingEpochOrder, FixedBitsForAFixedSeed) {
  // From an independent Python implementation of SplitMix64, derive_seed and Fisher-Yates.
  EXPECT_EQ(epoch_order(10, 42, 0), (std::vector<int64_t>{5, 7, 3, 1, 8, 2, 9, 4, 0, 6}));
  EXPECT_EQ(epoch_order(10, 42, 1), (std::vector<int64_t>{5, 1, 8, 7, 0, 2, 3, 4, 9, 6}));
}

TEST(BatchingEpochOrder, IsTheRandomPermutationOfTheDerivedSeed) {
  for (int64_t epoch : {0, 1, 17}) {
    Rng rng(derive_seed(123, static_cast<uint64_t>(epoch)));
    EXPECT_EQ(epoch_order(500, 123, epoch), random_permutation(500, rng)) << "epoch " << epoch;
  }
}

TEST(BatchingEpochOrder, NegativeCountThrows) {
  EXPECT_THROW(epoch_order(-1, 0, 0), std::invalid_argument);
}

class BatchingEpochOrderSize : public ::testing::TestWithParam<int64_t> {};

TEST_P(BatchingEpochOrderSize, EveryIndexAppearsExactlyOnce) {
  const int64_t n = GetParam();
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const auto order = epoch_order(n, 99, epoch);
    ASSERT_EQ(static_cast<int64_t>(order.size()), n);
    EXPECT_TRUE(is_permutation_of_iota(order)) << "n " << n << ", epoch " << epoch;
  }
}

INSTANTIATE_TEST_SUITE_P(BatchingSizes, BatchingEpochOrderSize,
                         ::testing::Values(0, 1, 2, 3, 10, 257, 60000));

// ---------------------------------------------------------------------------------------------
// num_batches and batch_range

struct BatchCountCase {
  int64_t num_examples;
  int64_t batch_size;
  int64_t batches;
  int64_t last_size;  // the size of the last batch; 0 when there is none
};

std::ostream& operator<<(std::ostream& out, const BatchCountCase& c) {
  return out << c.num_examples << " examples in batches of " << c.batch_size;
}

class BatchingCount : public ::testing::TestWithParam<BatchCountCase> {};

TEST_P(BatchingCount, CountsBatchesAndKeepsThePartialLastOne) {
  const auto& c = GetParam();
  ASSERT_EQ(num_batches(c.num_examples, c.batch_size), c.batches);
  if (c.batches > 0) {
    const auto [begin, end] = batch_range(c.num_examples, c.batch_size, c.batches - 1);
    EXPECT_EQ(end, c.num_examples);
    EXPECT_EQ(end - begin, c.last_size);
  }
  // The batches tile [0, num_examples) in order, all full but the last.
  int64_t next = 0;
  for (int64_t i = 0; i < c.batches; ++i) {
    const auto [begin, end] = batch_range(c.num_examples, c.batch_size, i);
    EXPECT_EQ(begin, next) << "batch " << i;
    EXPECT_EQ(end - begin, i + 1 < c.batches ? c.batch_size : c.last_size) << "batch " << i;
    next = end;
  }
  EXPECT_EQ(next, c.num_examples);
  EXPECT_THROW(batch_range(c.num_examples, c.batch_size, c.batches), std::out_of_range);
}

INSTANTIATE_TEST_SUITE_P(BatchingCounts, BatchingCount,
                         ::testing::Values(BatchCountCase{10, 4, 3, 2}, BatchCountCase{8, 4, 2, 4},
                                           BatchCountCase{0, 4, 0, 0}, BatchCountCase{1, 100, 1, 1},
                                           BatchCountCase{7, 1, 7, 1},
                                           BatchCountCase{60000, 256, 235, 96},
                                           BatchCountCase{10000, 256, 40, 16}));

TEST(BatchingBatchRange, ExactRangesForTenExamplesInBatchesOfFour) {
  EXPECT_EQ(batch_range(10, 4, 0), (Range{0, 4}));
  EXPECT_EQ(batch_range(10, 4, 1), (Range{4, 8}));
  EXPECT_EQ(batch_range(10, 4, 2), (Range{8, 10}));
}

TEST(BatchingBatchRange, OutOfRangeIndexThrows) {
  EXPECT_THROW(batch_range(10, 4, 3), std::out_of_range);
  EXPECT_THROW(batch_range(10, 4, -1), std::out_of_range);
  EXPECT_THROW(batch_range(0, 4, 0), std::out_of_range);
}

TEST(BatchingBatchRange, NonPositiveBatchSizeThrows) {
  EXPECT_THROW(num_batches(10, 0), std::invalid_argument);
  EXPECT_THROW(num_batches(10, -4), std::invalid_argument);
  EXPECT_THROW(batch_range(10, 0, 0), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// shard_range

TEST(BatchingShardRange, ExactShards) {
  EXPECT_EQ(shard_range(10, 3, 0), (Range{0, 4}));
  EXPECT_EQ(shard_range(10, 3, 1), (Range{4, 7}));
  EXPECT_EQ(shard_range(10, 3, 2), (Range{7, 10}));
  EXPECT_EQ(shard_range(256, 1, 0), (Range{0, 256}));
  EXPECT_EQ(shard_range(256, 2, 1), (Range{128, 256}));
}

TEST(BatchingShardRange, MoreReplicasThanExamplesGiveEmptyShards) {
  EXPECT_EQ(shard_range(2, 4, 0), (Range{0, 1}));
  EXPECT_EQ(shard_range(2, 4, 1), (Range{1, 2}));
  EXPECT_EQ(shard_range(2, 4, 2), (Range{2, 2}));
  EXPECT_EQ(shard_range(2, 4, 3), (Range{2, 2}));
  EXPECT_EQ(shard_range(0, 3, 1), (Range{0, 0}));
}

TEST(BatchingShardRange, InvalidRankOrWorldThrows) {
  EXPECT_THROW(shard_range(10, 3, -1), std::invalid_argument);
  EXPECT_THROW(shard_range(10, 3, 3), std::invalid_argument);
  EXPECT_THROW(shard_range(10, 0, 0), std::invalid_argument);
  EXPECT_THROW(shard_range(10, -2, 0), std::invalid_argument);
  EXPECT_THROW(shard_range(-1, 2, 0), std::invalid_argument);
}

class BatchingShardWorld : public ::testing::TestWithParam<int> {};

TEST_P(BatchingShardWorld, ShardsAreEvenContiguousAndCovering) {
  const int world = GetParam();
  for (int64_t global = 0; global <= 40; ++global) {
    SCOPED_TRACE("global size " + std::to_string(global));
    int64_t next = 0;
    for (int rank = 0; rank < world; ++rank) {
      const auto [begin, end] = shard_range(global, world, rank);
      EXPECT_EQ(begin, next) << "rank " << rank;
      // The first (global % world) shards hold one example more; sizes differ by at most one.
      const int64_t expected = global / world + (rank < global % world ? 1 : 0);
      EXPECT_EQ(end - begin, expected) << "rank " << rank;
      next = end;
    }
    EXPECT_EQ(next, global);
  }
}

// What the replicas of a `world` take in an epoch: for each global batch, the shards of ranks
// 0..world-1 put back together in rank order.
std::vector<std::vector<int64_t>> joined_batches(int64_t num_examples, int64_t batch_size,
                                                 uint64_t seed, int64_t epoch, int world) {
  const auto order = epoch_order(num_examples, seed, epoch);
  std::vector<std::vector<int64_t>> batches;
  for (int64_t b = 0; b < num_batches(num_examples, batch_size); ++b) {
    const auto [begin, end] = batch_range(num_examples, batch_size, b);
    std::vector<int64_t> joined;
    for (int rank = 0; rank < world; ++rank) {
      const auto [shard_begin, shard_end] = shard_range(end - begin, world, rank);
      joined.insert(joined.end(), order.begin() + begin + shard_begin,
                    order.begin() + begin + shard_end);
    }
    batches.push_back(joined);
  }
  return batches;
}

// The sequence of global batches does not depend on the number of replicas, and one epoch of
// them is the epoch order.
TEST_P(BatchingShardWorld, ConcatenatedShardsAreTheGlobalBatch) {
  const int world = GetParam();
  const int64_t num_examples = 23;
  const int64_t batch_size = 5;  // the last batch has 3 examples: fewer than some worlds
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    SCOPED_TRACE("epoch " + std::to_string(epoch));
    const auto single = joined_batches(num_examples, batch_size, 3, epoch, 1);
    const auto sharded = joined_batches(num_examples, batch_size, 3, epoch, world);
    EXPECT_EQ(sharded, single);
    ASSERT_EQ(sharded.size(), 5u);
    EXPECT_EQ(sharded.back().size(), 3u);
    std::vector<int64_t> all;
    for (const auto& batch : sharded) all.insert(all.end(), batch.begin(), batch.end());
    EXPECT_EQ(all, epoch_order(num_examples, 3, epoch));
  }
}

INSTANTIATE_TEST_SUITE_P(BatchingWorlds, BatchingShardWorld, ::testing::Values(1, 2, 3, 4, 8));

}  // namespace
