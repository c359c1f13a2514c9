// Tests of the memory guard (memory_budget.h): the estimate's scale at the book's sizes, and
// the refusal of sizes no machine holds, from the library and from the command line.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "dptrain/core/errors.h"
#include "dptrain/train/memory_budget.h"
#include "support/data_support.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(MemoryBudget, EstimateAtTheReferenceSizeIsAFewGiB) {
  // Width 64, batch 256: PyTorch needs about 2-3 GiB for this model and batch.
  const int64_t bytes = estimate_training_bytes(64, 256);
  EXPECT_GT(bytes, 1 * kGiB);
  EXPECT_LT(bytes, 6 * kGiB);
  // Activations grow with the batch, weights with the square of the width.
  EXPECT_GT(estimate_training_bytes(64, 512), bytes);
  EXPECT_GT(estimate_training_bytes(128, 0), 3 * estimate_training_bytes(64, 0));
}

TEST(MemoryBudget, RefusesWhatDoesNotFitNamingBothFlags) {
  EXPECT_NO_THROW(check_host_memory(8, 256, 2, 24 * kGiB));
  try {
    check_host_memory(64, 10000000, 1, 24 * kGiB);
    ADD_FAILURE() << "no UsageError";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("--batch-size and --width too large"), std::string::npos) << message;
    EXPECT_NE(message.find("24.0 GiB"), std::string::npos) << message;
  }
  EXPECT_THROW(check_host_memory(4096, 1, 1, 24 * kGiB), UsageError);
  // Two replicas on one host need twice what one needs.
  const int64_t one = estimate_training_bytes(16, 1000);
  EXPECT_NO_THROW(check_host_memory(16, 1000, 1, one + 1));
  EXPECT_THROW(check_host_memory(16, 1000, 2, one + 1), UsageError);
}

// An estimate saturated at 2^63 - 1 bytes would name 8589934592.0 GiB whatever the sizes. The
// figure is the estimate's own, however large.
TEST(MemoryBudget, TheNeededFigureIsTheEstimateNeverASaturatedOne) {
  try {
    check_host_memory(int64_t{1} << 20, int64_t{1} << 40, 1, 24 * kGiB);
    ADD_FAILURE() << "no UsageError";
  } catch (const UsageError& e) {
    // 2 x 25 x 784 values an example per unit of width, 4 bytes each, at width 2^20 and 2^40
    // examples: 1.81e23 bytes (1.68e14 GiB) of activations, far past 2^63 bytes (8.6e9 GiB).
    const std::string message = e.what();
    EXPECT_NE(message.find("need about 1683627627064"), std::string::npos) << message;
    EXPECT_EQ(message.find("8589934592.0"), std::string::npos) << message;
  }
}

TEST(MemoryBudget, NeededAndLeftAreNeverPrintedAlike) {
  // Just over what is left: at one digit both read "0.3 GiB"; the message uses the digits it
  // takes to tell them apart, and the figure it names as needed is the larger.
  const int64_t needed = estimate_training_bytes(8, 64);
  for (const int64_t left : {needed - 1, needed - needed / 50, needed - needed / 5}) {
    try {
      check_host_memory(8, 64, 1, left);
      FAIL() << "expected a UsageError for " << left << " bytes left";
    } catch (const UsageError& e) {
      const std::string message = e.what();
      const auto need_at = message.find("need about ") + 11;
      const auto and_at = message.find(", and ", need_at);
      const auto left_at = and_at + 6;
      const std::string need_text = message.substr(need_at, and_at - need_at);
      const std::string left_text =
          message.substr(left_at, message.find(" of memory", left_at) - left_at);
      EXPECT_NE(need_text, left_text) << message;
      EXPECT_GT(std::stod(need_text), std::stod(left_text)) << message;
    }
  }
}

TEST(MemoryBudget, AvailableHostMemoryIsReadHere) {
  const auto available = available_host_bytes();
  ASSERT_TRUE(available.has_value()) << "/proc/meminfo has no MemAvailable";
  EXPECT_GT(*available, 0);
}

TEST(MemoryBudget, AbsurdBatchFromTheCommandLineIsAUsageError) {
  const auto data_dir = testing::real_data_dir();
  ASSERT_TRUE(data_dir.has_value()) << "the real Fashion-MNIST is not installed";
  const auto result = testing::run_command(
      {testing::dptrain_binary(), "train", "--devices", "cpu", "--batch-size", "2000000000",
       "--train-limit", "60000", "--test-limit", "10", "--data-dir", *data_dir},
      {}, 120);
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_EQ(result.err.find("error: --batch-size and --width too large"), 0u) << result.err;
  EXPECT_EQ(result.err.find('\n'), result.err.size() - 1) << "not one line: " << result.err;
}

}  // namespace
}  // namespace dptrain
