// Tests of the summary statistics (statistics.h).
#include <gtest/gtest.h>

#include <cmath>

#include "dptrain/core/statistics.h"

namespace {

using namespace dptrain;

TEST(Statistics, MedianOfOddEvenAndNone) {
  EXPECT_TRUE(std::isnan(median_or_nan({})));
  EXPECT_EQ(median_or_nan({3, 1, 2}), 2);
  EXPECT_EQ(median_or_nan({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median_or_nan({7}), 7);
}

}  // namespace
