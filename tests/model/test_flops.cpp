// Tests of the FLOP count (flops.h, and its walk over the book's ResNet-18 in model.h): one
// layer's count from its options, and the whole model's against a count written out by hand,
// layer by layer, at several widths and input sizes, with the full-width model's exact integers.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dptrain/model/flops.h"
#include "dptrain/model/model.h"

namespace {

using namespace dptrain;

// One layer of the hand count: its name, input channels, output (C, H, W) and square kernel.
struct HandLayer {
  std::string name;
  int64_t in_channels, out_channels, out_height, out_width, kernel;
  int64_t macs() const {
    return out_height * out_width * out_channels * in_channels * kernel * kernel;
  }
};

// The book's ResNet-18 (D2L "Training on Multiple GPUs"), written out: a 3x3 stem at full size;
// stage 1 keeps width w and the size s; stages 2-4 double the channels and halve the size with a
// 3x3 stride-2 convolution (padding 1: ceil(s / 2)) and a 1x1 stride-2 projection; then the
// global average pool and a 8w x K linear layer. In the order forward() runs them: a block's
// shortcut (conv3) before its conv2. `sizes` are the four stages' output sizes for
// a square input, worked out by hand: floor((s + 2 - 3) / 2) + 1 = ceil(s / 2).
std::vector<HandLayer> hand_count(int64_t w, int64_t classes, const int64_t (&sizes)[4]) {
  const int64_t s1 = sizes[0], s2 = sizes[1], s3 = sizes[2], s4 = sizes[3];
  return {
      {"0", 1, w, s1, s1, 3},
      {"resnet_block1.0.conv1", w, w, s1, s1, 3},
      {"resnet_block1.0.conv2", w, w, s1, s1, 3},
      {"resnet_block1.1.conv1", w, w, s1, s1, 3},
      {"resnet_block1.1.conv2", w, w, s1, s1, 3},
      {"resnet_block2.0.conv1", w, 2 * w, s2, s2, 3},
      {"resnet_block2.0.conv3", w, 2 * w, s2, s2, 1},
      {"resnet_block2.0.conv2", 2 * w, 2 * w, s2, s2, 3},
      {"resnet_block2.1.conv1", 2 * w, 2 * w, s2, s2, 3},
      {"resnet_block2.1.conv2", 2 * w, 2 * w, s2, s2, 3},
      {"resnet_block3.0.conv1", 2 * w, 4 * w, s3, s3, 3},
      {"resnet_block3.0.conv3", 2 * w, 4 * w, s3, s3, 1},
      {"resnet_block3.0.conv2", 4 * w, 4 * w, s3, s3, 3},
      {"resnet_block3.1.conv1", 4 * w, 4 * w, s3, s3, 3},
      {"resnet_block3.1.conv2", 4 * w, 4 * w, s3, s3, 3},
      {"resnet_block4.0.conv1", 4 * w, 8 * w, s4, s4, 3},
      {"resnet_block4.0.conv3", 4 * w, 8 * w, s4, s4, 1},
      {"resnet_block4.0.conv2", 8 * w, 8 * w, s4, s4, 3},
      {"resnet_block4.1.conv1", 8 * w, 8 * w, s4, s4, 3},
      {"resnet_block4.1.conv2", 8 * w, 8 * w, s4, s4, 3},
      {"fc.1", 8 * w, classes, 1, 1, 1},
  };
}

struct FlopsCase {
  int64_t width;
  int64_t input;     // a square input, input x input
  int64_t sizes[4];  // the stages' output sizes, by hand
  int64_t forward;   // 2 x the multiply-accumulates, summed by hand (below)
};

// The forward FLOPs, as exact integers (2 x MACs):
// width 64, 28x28: stem 784*64*9 = 451,584; stage 1: 4 * 784*64*64*9 = 115,605,504; stages 2 and 3:
// 14,450,688 + 3 * 28,901,376 + 1,605,632 = 102,760,448 each; stage 4 (4x4): 18,874,368 +
// 3 * 37,748,736 + 2,097,152 = 134,217,728; fc 512*10 = 5,120; in all 455,800,832 MACs.
// width 8, 28x28: stem 56,448; stage 1 1,806,336; stages 2 and 3 1,605,632 each; stage 4 2,097,152;
// fc 640; in all 7,171,840 MACs.
// width 64, 32x32 (stages 32, 16, 8, 4): stem 589,824; stage 1 150,994,944; stage 2 134,217,728;
// stage 3 134,217,728; stage 4 134,217,728; fc 5,120; in all 554,243,072 MACs.
// width 8, 30x30 (stages 30, 15, 8, 4: 15 -> 8 rounds up): stem 64,800; stage 1 2,073,600;
// stage 2 1,843,200; stage 3 2,097,152; stage 4 2,097,152; fc 640; in all 8,176,544 MACs.
class FlopsHandCount : public ::testing::TestWithParam<FlopsCase> {};

TEST_P(FlopsHandCount, EveryLayerAndTheTotalMatchTheHandCount) {
  const FlopsCase c = GetParam();
  const ResNet model(ResNetOptions{10, 1, c.width});
  const auto layers = count_layer_flops(*model, c.input, c.input);
  const auto hand = hand_count(c.width, 10, c.sizes);
  ASSERT_EQ(layers.size(), hand.size());
  int64_t hand_macs = 0;
  for (size_t i = 0; i < hand.size(); ++i) {
    SCOPED_TRACE(hand[i].name);
    EXPECT_EQ(layers[i].name, hand[i].name);
    EXPECT_EQ(layers[i].out.channels, hand[i].out_channels);
    EXPECT_EQ(layers[i].out.height, hand[i].out_height);
    EXPECT_EQ(layers[i].out.width, hand[i].out_width);
    EXPECT_EQ(layers[i].macs, hand[i].macs());
    hand_macs += hand[i].macs();
  }
  EXPECT_EQ(2 * hand_macs, c.forward);
  EXPECT_EQ(forward_flops_per_image(*model, c.input, c.input), c.forward);
}

INSTANTIATE_TEST_SUITE_P(Cases, FlopsHandCount,
                         ::testing::Values(FlopsCase{64, 28, {28, 14, 7, 4}, 911'601'664},
                                           FlopsCase{8, 28, {28, 14, 7, 4}, 14'343'680},
                                           FlopsCase{64, 32, {32, 16, 8, 4}, 1'108'486'144},
                                           FlopsCase{8, 30, {30, 15, 8, 4}, 16'353'088}));

// The figure of issue 43: "2.73 GFLOP per trained image at full width", forward + backward.
TEST(Flops, AFullWidthTrainedImageCosts2Point73Gflop) {
  const ResNet model(ResNetOptions{});
  const int64_t trained = kTrainingPassesPerImage * forward_flops_per_image(*model, 28, 28);
  EXPECT_EQ(trained, 2'734'804'992);
}

// The walk reads the model's own input channels and classes from its layers.
TEST(Flops, CountsTheModelsOwnInputChannelsAndClasses) {
  const ResNet model(ResNetOptions{/*num_classes=*/7, /*in_channels=*/3, /*width=*/4});
  const auto layers = count_layer_flops(*model, 28, 28);
  EXPECT_EQ(layers.front().macs, 28 * 28 * 4 * 3 * 9);  // the stem reads 3 channels
  EXPECT_EQ(layers.back().macs, 32 * 7);                // 8w features to 7 classes
}

TEST(Flops, RefusesAnEmptyInput) {
  const ResNet model(ResNetOptions{10, 1, 4});
  EXPECT_THROW(count_layer_flops(*model, 0, 28), std::invalid_argument);
  EXPECT_THROW(count_layer_flops(*model, 28, -1), std::invalid_argument);
}

// ---- One layer ----------------------------------------------------------------------------------

// A convolution's count from its own options: output size floor((in + 2p - d(k-1) - 1) / s) + 1
// per side, and (C_in / groups) x k x k multiply-accumulates per output element.
TEST(FlopCounter, AConvolutionCountsFromItsOptions) {
  FlopCounter counter;
  const torch::nn::Conv2d strided(
      torch::nn::Conv2dOptions(8, 16, 5).stride(2).padding(1).dilation(2).groups(4));
  // Each side: (30 + 2 - 2 * 4 - 1) / 2 + 1 = 12.
  const auto out = counter.conv(*strided, "strided", ActivationShape{8, 30, 30});
  EXPECT_EQ(out, (ActivationShape{16, 12, 12}));
  EXPECT_EQ(counter.layers().back().macs, 16 * 12 * 12 * (8 / 4) * 5 * 5);
  // padding='same' keeps the size; 'valid' pads nothing: (10 - 3) / 1 + 1 = 8.
  const torch::nn::Conv2d same(torch::nn::Conv2dOptions(3, 4, 3).padding(torch::kSame));
  EXPECT_EQ(counter.conv(*same, "same", ActivationShape{3, 10, 10}), (ActivationShape{4, 10, 10}));
  const torch::nn::Conv2d valid(torch::nn::Conv2dOptions(3, 4, 3).padding(torch::kValid));
  EXPECT_EQ(counter.conv(*valid, "valid", ActivationShape{3, 10, 10}), (ActivationShape{4, 8, 8}));
  EXPECT_EQ(counter.layers().size(), 3u);
  EXPECT_EQ(counter.forward_flops(),
            2 * (16 * 12 * 12 * 2 * 25 + 4 * 10 * 10 * 3 * 9 + 4 * 8 * 8 * 3 * 9));
}

TEST(FlopCounter, ALayerHandedTheWrongInputIsAnError) {
  FlopCounter counter;
  const torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 4, 3));
  EXPECT_THROW(counter.conv(*conv, "conv", ActivationShape{2, 10, 10}), std::logic_error);
  EXPECT_THROW(counter.conv(*conv, "conv", ActivationShape{3, 2, 2}), std::invalid_argument);
  const torch::nn::Linear linear(12, 5);
  EXPECT_THROW(counter.linear(*linear, "fc", ActivationShape{12, 2, 1}), std::logic_error);
  EXPECT_EQ(counter.linear(*linear, "fc", ActivationShape{3, 2, 2}), (ActivationShape{5, 1, 1}));
  EXPECT_EQ(counter.forward_flops(), 2 * 12 * 5);
}

}  // namespace
