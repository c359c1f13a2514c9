// Tests of the crop-and-flip augmentation (augment.h): the draws' range and determinism, crops
// and flips against a per-pixel reference, and the same images for a batch and its shards.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "dptrain/data/augment.h"

namespace {

using namespace dptrain;

// The slow, obvious reference: pixel (i, j) of the output is padded pixel (dy + i, dx + j'),
// j' = j or W - 1 - j when flipped, zero outside the image.
torch::Tensor reference_crop_flip(const torch::Tensor& x, const torch::Tensor& draws,
                                  int64_t padding) {
  auto out = torch::zeros_like(x);
  const int64_t h = x.size(2), w = x.size(3);
  for (int64_t b = 0; b < x.size(0); ++b) {
    const int64_t dy = draws[b][0].item<int64_t>(), dx = draws[b][1].item<int64_t>();
    const bool flip = draws[b][2].item<int64_t>() != 0;
    for (int64_t c = 0; c < x.size(1); ++c) {
      for (int64_t i = 0; i < h; ++i) {
        for (int64_t j = 0; j < w; ++j) {
          const int64_t row = dy + i - padding, col = dx + (flip ? w - 1 - j : j) - padding;
          if (row >= 0 && row < h && col >= 0 && col < w) out[b][c][i][j] = x[b][c][row][col];
        }
      }
    }
  }
  return out;
}

TEST(CropFlipDraws, InRangeRepeatableAndDifferentPerStep) {
  const auto draws = draw_crop_flip(/*seed=*/5, /*epoch=*/2, /*step=*/7, /*count=*/4000, 2);
  ASSERT_EQ(draws.sizes(), (std::vector<int64_t>{4000, 3}));
  EXPECT_EQ(draws.select(1, 0).min().item<int64_t>(), 0);
  EXPECT_EQ(draws.select(1, 0).max().item<int64_t>(), 4);
  EXPECT_EQ(draws.select(1, 1).min().item<int64_t>(), 0);
  EXPECT_EQ(draws.select(1, 1).max().item<int64_t>(), 4);
  const auto flips = draws.select(1, 2);
  EXPECT_TRUE(torch::logical_or(flips.eq(0), flips.eq(1)).all().item<bool>());
  const auto flipped = flips.sum().item<int64_t>();
  EXPECT_GT(flipped, 1800);  // 2000 expected; 4.5 standard deviations either side
  EXPECT_LT(flipped, 2200);
  EXPECT_TRUE(torch::equal(draws, draw_crop_flip(5, 2, 7, 4000, 2)));
  EXPECT_FALSE(torch::equal(draws, draw_crop_flip(5, 2, 8, 4000, 2)));
  EXPECT_FALSE(torch::equal(draws, draw_crop_flip(5, 3, 7, 4000, 2)));
  EXPECT_FALSE(torch::equal(draws, draw_crop_flip(6, 2, 7, 4000, 2)));
  // A batch's first rows do not depend on how many are drawn.
  EXPECT_TRUE(torch::equal(draws.narrow(0, 0, 100), draw_crop_flip(5, 2, 7, 100, 2)));
}

TEST(CropFlip, CentredUnflippedIsTheImageAndFlippedIsItsMirror) {
  torch::manual_seed(1);
  const auto x = torch::rand({3, 1, 28, 28});
  const auto centre = torch::tensor({2, 2, 0}, torch::kInt64).repeat({3, 1});
  EXPECT_TRUE(torch::equal(crop_flip(x, centre, 2), x));
  const auto mirror = torch::tensor({2, 2, 1}, torch::kInt64).repeat({3, 1});
  EXPECT_TRUE(torch::equal(crop_flip(x, mirror, 2), x.flip({3})));
}

TEST(CropFlip, EveryDrawMatchesThePerPixelReference) {
  torch::manual_seed(2);
  const auto x = torch::rand({64, 2, 9, 7});
  const auto draws = draw_crop_flip(11, 0, 3, 64, 3);
  EXPECT_TRUE(torch::equal(crop_flip(x, draws, 3), reference_crop_flip(x, draws, 3)));
}

TEST(CropFlip, ShardsOfABatchGetTheBatchsImages) {
  torch::manual_seed(3);
  const auto x = torch::rand({10, 1, 28, 28});
  const auto draws = draw_crop_flip(0, 1, 4, 10, 2);
  const auto whole = crop_flip(x, draws, 2);
  // Three replicas' shards of 4, 3 and 3 images, each with its rows of the draws.
  int64_t begin = 0;
  for (const int64_t n : {4, 3, 3}) {
    EXPECT_TRUE(torch::equal(crop_flip(x.narrow(0, begin, n), draws.narrow(0, begin, n), 2),
                             whole.narrow(0, begin, n)));
    begin += n;
  }
}

TEST(CropFlip, KeepsChannelsLastAndRefusesMisshapenDraws) {
  const auto x = torch::rand({2, 3, 5, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  const auto out = crop_flip(x, draw_crop_flip(0, 0, 0, 2, 1), 1);
  EXPECT_TRUE(out.is_contiguous(at::MemoryFormat::ChannelsLast));
  // One channel, as the model's input is made (batch_input.cpp): the same strides as x, which
  // oneDNN reads as channels-last.
  const auto grey =
      torch::empty({2, 1, 5, 5},
                   torch::TensorOptions().memory_format(at::MemoryFormat::ChannelsLast))
          .copy_(torch::rand({2, 1, 5, 5}));
  const auto cropped = crop_flip(grey, draw_crop_flip(0, 0, 0, 2, 1), 1);
  EXPECT_EQ(cropped.strides(), grey.strides());
  EXPECT_EQ(cropped.suggest_memory_format(), at::MemoryFormat::ChannelsLast);
  EXPECT_EQ(crop_flip(torch::rand({2, 1, 5, 5}), draw_crop_flip(0, 0, 0, 2, 1), 1).strides(),
            torch::rand({2, 1, 5, 5}).strides())
      << "contiguous stays contiguous";
  EXPECT_THROW(crop_flip(x, torch::zeros({3, 3}, torch::kInt64), 1), c10::Error);
  EXPECT_THROW(crop_flip(x.select(1, 0), torch::zeros({2, 3}, torch::kInt64), 1), c10::Error);
}

TEST(AugmentNames, RoundTripAndUnknown) {
  EXPECT_EQ(augment_from_name("none"), Augment::kNone);
  EXPECT_EQ(augment_from_name("crop-flip"), Augment::kCropFlip);
  EXPECT_EQ(augment_from_name(augment_name(Augment::kCropFlip)), Augment::kCropFlip);
  EXPECT_EQ(augment_from_name("flip"), std::nullopt);
}

}  // namespace
