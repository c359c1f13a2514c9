// Tests of the step's input assembly (batch_input.h): bit-identical to gathering and scaling
// afresh, in both layouts, for full and short batches, reusing its buffers.
#include <gtest/gtest.h>

#include <cstdint>

#include "dptrain/data/batch_input.h"
#include "dptrain/data/data.h"

namespace dptrain {
namespace {

struct Pool {
  torch::Tensor images = torch::randint(0, 256, {50, 28, 28}, torch::kUInt8);  // (50, 28, 28)
  torch::Tensor labels = torch::randint(0, 10, {50}, torch::kInt64);           // (50)
};

class BatchAssemblerLayout : public ::testing::TestWithParam<bool> {};

TEST_P(BatchAssemblerLayout, MatchesToModelInputBitForBit) {
  const bool channels_last = GetParam();
  torch::manual_seed(7);
  Pool pool;
  BatchAssembler assembler(16, torch::kCPU, channels_last);
  const void* first_buffer = nullptr;
  for (const int64_t n : {16, 9, 16}) {  // full, short (the last batch), full again
    const auto index = torch::randperm(50, torch::kInt64).narrow(0, 0, n);
    const auto [x, y] = assembler.gather(pool.images, pool.labels, index);
    EXPECT_TRUE(torch::equal(x, to_model_input(pool.images.index_select(0, index))));
    EXPECT_TRUE(torch::equal(y, pool.labels.index_select(0, index)));
    EXPECT_EQ(x.sizes(), (std::vector<int64_t>{n, 1, 28, 28}));
    EXPECT_EQ(x.is_contiguous(at::MemoryFormat::ChannelsLast), true);  // C = 1: both hold
    if (!first_buffer) first_buffer = x.data_ptr();
    EXPECT_EQ(x.data_ptr(), first_buffer) << "the buffer was reallocated";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, BatchAssemblerLayout, ::testing::Values(false, true),
                         [](const auto& info) {
                           return std::string(info.param ? "ChannelsLast" : "Contiguous");
                         });

TEST(BatchAssembler, RejectsABatchLargerThanItsBuffers) {
  Pool pool;
  BatchAssembler assembler(4, torch::kCPU, false);
  EXPECT_THROW(assembler.gather(pool.images, pool.labels, torch::arange(5)), c10::Error);
  EXPECT_THROW(BatchAssembler(0, torch::kCPU, false), c10::Error);
}

}  // namespace
}  // namespace dptrain
