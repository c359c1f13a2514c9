// Tests of random.h against reference values from an independent Python implementation of
// SplitMix64 (bits, bounded draws, derived seeds, normals, permutations), plus statistical checks
// with fixed seeds, so every test is deterministic.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "dptrain/core/random.h"

namespace {

using namespace dptrain;

// ---------------------------------------------------------------------------------------------
// Rng

TEST(RandomGenerator, SplitMix64ReferenceValuesForSeedZero) {
  Rng rng(0);
  EXPECT_EQ(rng.next_u64(), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(rng.next_u64(), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(rng.next_u64(), 0x06c45d188009454fULL);
}

TEST(RandomGenerator, SplitMix64ReferenceValuesForAnotherSeed) {
  Rng rng(1234567);
  EXPECT_EQ(rng.next_u64(), 0x599ed017fb08fc85ULL);
  EXPECT_EQ(rng.next_u64(), 0x2c73f08458540fa5ULL);
  EXPECT_EQ(rng.next_u64(), 0x883ebce5a3f27c77ULL);
}

TEST(RandomGenerator, CopiesContinueTheSameStream) {
  Rng rng(77);
  rng.next_u64();
  Rng copy = rng;
  for (int i = 0; i < 100; ++i) EXPECT_EQ(rng.next_u64(), copy.next_u64());
}

TEST(RandomGenerator, NextUnitIsTheTop53BitsScaled) {
  Rng bits(5), units(5);
  for (int i = 0; i < 1000; ++i) {
    const double expected = static_cast<double>(bits.next_u64() >> 11) / 9007199254740992.0;
    const double unit = units.next_unit();
    EXPECT_EQ(unit, expected);
    EXPECT_GE(unit, 0.0);
    EXPECT_LT(unit, 1.0);
  }
  Rng zero(0);
  EXPECT_EQ(zero.next_unit(), 0.8833108082136426);
  EXPECT_EQ(zero.next_unit(), 0.43152799704850997);
}

TEST(RandomGenerator, NextBelowReferenceValues) {
  Rng small(0);
  std::vector<uint64_t> draws;
  for (int i = 0; i < 10; ++i) draws.push_back(small.next_below(10));
  EXPECT_EQ(draws, (std::vector<uint64_t>{5, 0, 9, 4, 7, 0, 3, 0, 9, 0}));
  // A bound just over 2^63 rejects almost half the draws: 2^64 mod bound = 2^63 - 1.
  Rng large(0);
  const uint64_t bound = (uint64_t{1} << 63) + 1;
  EXPECT_EQ(large.next_below(bound), 7070836379803831726ULL);
  EXPECT_EQ(large.next_below(bound), 8686239339925766635ULL);
  EXPECT_EQ(large.next_below(bound), 5009149828745571131ULL);
  EXPECT_EQ(large.next_below(bound), 8338494477124284581ULL);
}

class RandomNextBelowBound : public ::testing::TestWithParam<uint64_t> {};

TEST_P(RandomNextBelowBound, NeverReachesTheBound) {
  const uint64_t bound = GetParam();
  Rng rng(bound);
  for (int i = 0; i < 20000; ++i) ASSERT_LT(rng.next_below(bound), bound) << "draw " << i;
}

INSTANTIATE_TEST_SUITE_P(RandomBounds, RandomNextBelowBound,
                         ::testing::Values(1, 2, 3, 7, 10, 1000, (uint64_t{1} << 32) + 1,
                                           (uint64_t{1} << 63) + 1,
                                           std::numeric_limits<uint64_t>::max()));

TEST(RandomGenerator, NextBelowOneIsAlwaysZero) {
  Rng rng(3);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(rng.next_below(1), 0u);
}

// Pearson's chi-square over `counts` against equal expected counts.
double chi_square(const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const double expected = static_cast<double>(total) / static_cast<double>(counts.size());
  double sum = 0.0;
  for (int64_t c : counts) sum += (static_cast<double>(c) - expected) * (c - expected) / expected;
  return sum;
}

TEST(RandomGenerator, NextBelowIsRoughlyUniform) {
  Rng rng(42);
  std::vector<int64_t> counts(10, 0);
  for (int i = 0; i < 100000; ++i) ++counts[rng.next_below(10)];
  // 27.88 is the 99.9% point of chi-square with 9 degrees of freedom; this seed gives 9.23.
  EXPECT_LT(chi_square(counts), 27.88);
  for (int64_t c : counts) EXPECT_NEAR(c, 10000, 400);
}

TEST(RandomGenerator, NextBelowLargeBoundHitsBothHalves) {
  // With a bound of 3 * 2^62, modulo bias would make the lower third twice as likely as the
  // rest; rejection sampling keeps [0, bound/2) and [bound/2, bound) equally likely.
  Rng rng(11);
  const uint64_t bound = uint64_t{3} << 62;
  int64_t lower = 0;
  const int draws = 100000;
  for (int i = 0; i < draws; ++i) lower += rng.next_below(bound) < bound / 2 ? 1 : 0;
  EXPECT_NEAR(static_cast<double>(lower) / draws, 0.5, 0.01);
}

// ---------------------------------------------------------------------------------------------
// derive_seed

TEST(RandomDeriveSeed, ReferenceValues) {
  EXPECT_EQ(derive_seed(1, 2), 0xf977a0eab49ffb2fULL);
  // Stream 0 of seed 0 is the second output of SplitMix64 from 0.
  EXPECT_EQ(derive_seed(0, 0), 0x6e789e6aa1b965f4ULL);
}

TEST(RandomDeriveSeed, DeterministicAndDistinctAcrossStreamsAndSeeds) {
  EXPECT_EQ(derive_seed(42, 7), derive_seed(42, 7));
  std::set<uint64_t> seen;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    for (uint64_t stream = 0; stream < 50; ++stream) seen.insert(derive_seed(seed, stream));
  }
  EXPECT_EQ(seen.size(), 2500u);
}

// ---------------------------------------------------------------------------------------------
// fill_normal

TEST(RandomFillNormal, ReferenceValuesForSeedZero) {
  Rng rng(0);
  std::vector<float> out(4);
  fill_normal(rng, out.data(), out.size(), 0.0, 1.0);
  EXPECT_FLOAT_EQ(out[0], -1.8839083909988403f);
  EXPECT_FLOAT_EQ(out[1], 0.8645068407058716f);
  EXPECT_FLOAT_EQ(out[2], 0.22760793566703796f);
  EXPECT_FLOAT_EQ(out[3], -0.04211268573999405f);
}

struct NormalCase {
  uint64_t seed;
  double mean;
  double stddev;
};

std::ostream& operator<<(std::ostream& out, const NormalCase& c) {
  return out << "seed " << c.seed << ", N(" << c.mean << ", " << c.stddev << "^2)";
}

class RandomFillNormalMoments : public ::testing::TestWithParam<NormalCase> {};

TEST_P(RandomFillNormalMoments, MeanStddevAndOneSigmaMassOverAMillionSamples) {
  const auto& c = GetParam();
  const size_t n = 1000000;
  std::vector<float> out(n);
  Rng rng(c.seed);
  fill_normal(rng, out.data(), n, c.mean, c.stddev);
  double sum = 0.0;
  for (float x : out) sum += x;
  const double mean = sum / n;
  double squares = 0.0;
  int64_t within_one_sigma = 0;
  for (float x : out) {
    squares += (x - mean) * (x - mean);
    within_one_sigma += std::abs(x - c.mean) < c.stddev ? 1 : 0;
  }
  const double stddev = std::sqrt(squares / n);
  // The standard error of the mean is stddev / 1000 and of the stddev about stddev / 1414;
  // the bounds are about 5 standard errors.
  EXPECT_NEAR(mean, c.mean, 0.005 * c.stddev);
  EXPECT_NEAR(stddev, c.stddev, 0.0035 * c.stddev);
  EXPECT_NEAR(static_cast<double>(within_one_sigma) / n, 0.682689, 0.0025);
  for (float x : out) ASSERT_TRUE(std::isfinite(x));
}

INSTANTIATE_TEST_SUITE_P(RandomNormals, RandomFillNormalMoments,
                         ::testing::Values(NormalCase{2024, 0.0, 1.0}, NormalCase{99, 3.0, 0.5}));

TEST(RandomFillNormal, SameSeedGivesTheSameSamples) {
  std::vector<float> a(1001), b(1001);
  Rng first(8), second(8);
  fill_normal(first, a.data(), a.size(), 0.0, 0.01);
  fill_normal(second, b.data(), b.size(), 0.0, 0.01);
  EXPECT_EQ(a, b);
  Rng other(9);
  fill_normal(other, b.data(), b.size(), 0.0, 0.01);
  EXPECT_NE(a, b);
}

class RandomFillNormalCount : public ::testing::TestWithParam<size_t> {};

TEST_P(RandomFillNormalCount, FillsExactlyCountValues) {
  const size_t count = GetParam();
  const float sentinel = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(count + 1, sentinel);
  Rng rng(4);
  fill_normal(rng, out.data(), count, 0.0, 1.0);
  for (size_t i = 0; i < count; ++i) EXPECT_TRUE(std::isfinite(out[i])) << "element " << i;
  EXPECT_TRUE(std::isnan(out[count])) << "wrote past the end";
  // An odd count is the prefix of the next even count.
  std::vector<float> even(count + count % 2);
  Rng again(4);
  fill_normal(again, even.data(), even.size(), 0.0, 1.0);
  for (size_t i = 0; i < count; ++i) EXPECT_EQ(out[i], even[i]) << "element " << i;
  // Each pair of samples takes two draws, whether or not both are stored.
  Rng used(4);
  for (size_t i = 0; i < 2 * ((count + 1) / 2); ++i) used.next_u64();
  EXPECT_EQ(rng.next_u64(), used.next_u64());
}

INSTANTIATE_TEST_SUITE_P(RandomCounts, RandomFillNormalCount,
                         ::testing::Values(0, 1, 2, 3, 7, 8, 1001));

TEST(RandomFillNormal, ZeroStddevGivesTheMean) {
  std::vector<float> out(9);
  Rng rng(1);
  fill_normal(rng, out.data(), out.size(), 0.25, 0.0);
  for (float x : out) EXPECT_EQ(x, 0.25f);
}

// ---------------------------------------------------------------------------------------------
// random_permutation

TEST(RandomPermutation, ReferenceValues) {
  Rng rng(0);
  EXPECT_EQ(random_permutation(10, rng), (std::vector<int64_t>{6, 3, 2, 9, 8, 1, 4, 7, 0, 5}));
}

class RandomPermutationSize : public ::testing::TestWithParam<int64_t> {};

TEST_P(RandomPermutationSize, IsADeterministicPermutation) {
  const int64_t n = GetParam();
  Rng rng(21), again(21);
  const auto order = random_permutation(n, rng);
  ASSERT_EQ(static_cast<int64_t>(order.size()), n);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_EQ(random_permutation(n, again), order);
}

INSTANTIATE_TEST_SUITE_P(RandomSizes, RandomPermutationSize,
                         ::testing::Values(0, 1, 2, 5, 100, 10000));

TEST(RandomPermutation, AllOrdersOfThreeAreEquallyLikely) {
  Rng rng(7);
  std::map<std::vector<int64_t>, int64_t> seen;
  for (int i = 0; i < 60000; ++i) ++seen[random_permutation(3, rng)];
  ASSERT_EQ(seen.size(), 6u);
  std::vector<int64_t> counts;
  for (const auto& [order, count] : seen) counts.push_back(count);
  // 20.52 is the 99.9% point of chi-square with 5 degrees of freedom; this seed gives 4.87.
  EXPECT_LT(chi_square(counts), 20.52);
}

TEST(RandomPermutation, SuccessiveCallsDiffer) {
  Rng rng(0);
  const auto first = random_permutation(100, rng);
  EXPECT_NE(random_permutation(100, rng), first);
}

}  // namespace
