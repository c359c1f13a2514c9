// Tests of the book's ResNet-18 (model.h): shapes, parameter counts against an independent
// count from the architecture, the book's layer names, the reference initialisation, and what a
// file of the model holds (its tensor table, element bound and stem).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "dptrain/model/model.h"

namespace {

using namespace dptrain;

// The parameter count written out from the architecture, independently of the module code.
int64_t expected_parameters(int64_t width, int64_t in_channels, int64_t classes) {
  const auto conv = [](int64_t in, int64_t out, int64_t k) { return in * out * k * k + out; };
  const auto bn = [](int64_t c) { return 2 * c; };
  const auto block = [&](int64_t in, int64_t out, bool projection) {
    return conv(in, out, 3) + conv(out, out, 3) + (projection ? conv(in, out, 1) : 0) + 2 * bn(out);
  };
  int64_t total = conv(in_channels, width, 3) + bn(width);
  total += 2 * block(width, width, false);
  for (int64_t c = width; c < 8 * width; c *= 2)
    total += block(c, 2 * c, true) + block(2 * c, 2 * c, false);
  return total + 8 * width * classes + classes;
}

class ResNetWidth : public ::testing::TestWithParam<int64_t> {};

TEST_P(ResNetWidth, OutputShapeAndParameterCount) {
  const int64_t width = GetParam();
  ResNet model(ResNetOptions{10, 1, width});
  EXPECT_EQ(count_parameters(*model), expected_parameters(width, 1, 10));
  torch::NoGradGuard no_grad;
  model->eval();
  const auto logits = model->forward(torch::rand({3, 1, 28, 28}));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10}));
}

INSTANTIATE_TEST_SUITE_P(Widths, ResNetWidth, ::testing::Values(64, 8));

TEST(ResNet, BookParameterCountAtWidth64) {
  // The figure DEVELOPERS.md gives for the book's model with one input channel.
  ResNet model(ResNetOptions{10, 1, 64});
  EXPECT_EQ(count_parameters(*model), 11175818);
}

TEST(ResNet, OtherClassesAndInputChannels) {
  ResNet model(ResNetOptions{7, 3, 4});
  EXPECT_EQ(count_parameters(*model), expected_parameters(4, 3, 7));
  torch::NoGradGuard no_grad;
  model->eval();
  EXPECT_EQ(model->forward(torch::rand({2, 3, 28, 28})).sizes(), (std::vector<int64_t>{2, 7}));
}

TEST(ResNet, NamesFollowTheBook) {
  ResNet model(ResNetOptions{10, 1, 8});
  std::set<std::string> names;
  for (const auto& item : model->named_parameters()) names.insert(item.key());
  for (const auto& item : model->named_buffers()) names.insert(item.key());
  for (const char* name :
       {"0.weight", "0.bias", "1.weight", "1.running_mean", "1.running_var",
        "resnet_block1.0.conv1.weight", "resnet_block1.1.bn2.bias", "resnet_block2.0.conv3.weight",
        "resnet_block4.1.conv2.bias", "fc.1.weight", "fc.1.bias"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
  }
  // Only the first block of stages 2-4 projects its shortcut.
  EXPECT_EQ(names.count("resnet_block1.0.conv3.weight"), 0u);
  EXPECT_EQ(names.count("resnet_block2.1.conv3.weight"), 0u);
}

TEST(ResNet, RejectsNonPositiveOptions) {
  EXPECT_THROW(ResNet(ResNetOptions{10, 1, 0}), c10::Error);
  EXPECT_THROW(ResNet(ResNetOptions{0, 1, 8}), c10::Error);
}

// Asked for, the BatchNorm fused, the CPU, channels-last, not synchronised: each one needed.
TEST(ConvBiasGradients, FusedOnlyWhereEveryConditionHolds) {
  ResNetOptions fused;
  fused.fused_conv_bias_grad = true;
  const torch::Device cpu(torch::kCPU);
  const auto cl = MemoryFormat::kChannelsLast;
  EXPECT_TRUE(fuses_conv_bias_gradients(fused, cpu, cl, false));
  ResNetOptions library = fused;
  library.fused_conv_bias_grad = false;
  EXPECT_FALSE(fuses_conv_bias_gradients(library, cpu, cl, false));
  ResNetOptions unfused_batch_norm = fused;
  unfused_batch_norm.fused_batch_norm = false;
  EXPECT_FALSE(fuses_conv_bias_gradients(unfused_batch_norm, cpu, cl, false));
  EXPECT_FALSE(fuses_conv_bias_gradients(fused, torch::Device(torch::kCUDA, 0), cl, false));
  EXPECT_FALSE(fuses_conv_bias_gradients(fused, cpu, MemoryFormat::kContiguous, false));
  EXPECT_FALSE(fuses_conv_bias_gradients(fused, cpu, MemoryFormat::kAuto, false));
  EXPECT_FALSE(fuses_conv_bias_gradients(fused, cpu, cl, /*synchronised_batch_norm=*/true));
}

// ---- Residual blocks ------------------------------------------------------------

struct BlockCase {
  int64_t in, out;
  bool projection;
  int64_t stride;
  int64_t out_side;
};

class ResidualBlockShape : public ::testing::TestWithParam<BlockCase> {};

TEST_P(ResidualBlockShape, MapsShapes) {
  const auto c = GetParam();
  ResidualBlock block(c.in, c.out, c.projection, c.stride);
  const auto y = block->forward(torch::rand({2, c.in, 28, 28}));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, c.out, c.out_side, c.out_side}));
  EXPECT_GE(y.min().item<float>(), 0.0f);  // the block ends in a ReLU
  bool has_projection = false;
  for (const auto& item : block->named_parameters()) {
    has_projection |= item.key().rfind("conv3.", 0) == 0;
  }
  EXPECT_EQ(has_projection, c.projection);
}

INSTANTIATE_TEST_SUITE_P(Blocks, ResidualBlockShape,
                         ::testing::Values(BlockCase{8, 8, false, 1, 28},
                                           BlockCase{8, 16, true, 2, 14},
                                           BlockCase{4, 6, true, 1, 28}));

TEST(ResidualBlock, IdentityShortcutAddsInput) {
  // With every conv weight and bias zero, BN outputs beta = 0, so the block is relu(x).
  ResidualBlock block(4, 4, false, 1);
  torch::NoGradGuard no_grad;
  for (auto& p : block->named_parameters()) {
    if (p.key().find("conv") != std::string::npos) p.value().zero_();
  }
  const auto x = torch::randn({2, 4, 6, 6});
  EXPECT_TRUE(torch::equal(block->forward(x), torch::relu(x)));
}

// ---- Initialisation -----------------------------------------------------------------

TEST(ReferenceInit, WeightsNormalBiasesZeroBatchNormIdentity) {
  ResNet model(ResNetOptions{10, 1, 64});
  init_reference_weights(*model, /*seed=*/0);
  std::vector<torch::Tensor> weights;
  for (const auto& item : model->named_parameters()) {
    const auto& key = item.key();
    const auto& value = item.value();
    const bool is_bn = key.rfind("1.", 0) == 0 || key.find(".bn") != std::string::npos;
    if (is_bn) {
      const float expected = key.substr(key.size() - 6) == "weight" ? 1.0f : 0.0f;
      EXPECT_TRUE(torch::all(value == expected).item<bool>()) << key;
    } else if (key.substr(key.size() - 4) == "bias") {
      EXPECT_TRUE(torch::all(value == 0).item<bool>()) << key;
    } else {
      weights.push_back(value.detach().flatten());
    }
  }
  const auto all = torch::cat(weights).to(torch::kFloat64);
  ASSERT_GT(all.numel(), 11000000);
  // 11 million samples: the standard error of the mean is 3e-6, of the std about 2e-6.
  EXPECT_NEAR(all.mean().item<double>(), 0.0, 2e-5);
  EXPECT_NEAR(all.std().item<double>(), 0.01, 2e-5);
  // Fourth moment of a normal is 3 sigma^4: catches a uniform distribution of the same std.
  EXPECT_NEAR((all.pow(4).mean() / std::pow(0.01, 4)).item<double>(), 3.0, 0.02);
  for (const auto& item : model->named_buffers()) {
    if (item.key().find("running_var") != std::string::npos) {
      EXPECT_TRUE(torch::all(item.value() == 1).item<bool>());
    }
  }
}

TEST(ReferenceInit, SameSeedSameBitsOtherSeedOtherBits) {
  ResNet a(ResNetOptions{10, 1, 8}), b(ResNetOptions{10, 1, 8}), c(ResNetOptions{10, 1, 8});
  init_reference_weights(*a, 5);
  init_reference_weights(*b, 5);
  init_reference_weights(*c, 6);
  const auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  bool any_differs = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i], pb[i]));
    any_differs |= !torch::equal(pa[i], pc[i]);
  }
  EXPECT_TRUE(any_differs);
}

TEST(ReferenceInit, PinnedFirstWeights) {
  // Our generator makes the initial weights independent of the LibTorch version; these values
  // pin that (SplitMix64 seed 0, Box-Muller), so a change to either is noticed.
  ResNet model(ResNetOptions{10, 1, 8});
  init_reference_weights(*model, 0);
  const auto first = model->named_parameters()["0.weight"].flatten();
  const auto expected =
      torch::tensor({-1.883908361e-02f, 8.645068854e-03f, 2.276079264e-03f, -4.211268388e-04f});
  EXPECT_TRUE(torch::equal(first.narrow(0, 0, 4), expected)) << first.narrow(0, 0, 4);
}

// ---- What a file of the model holds -------------------------------------------------------

// The tensor table is the model's own, in its order; the element bound holds every width's
// tensors (and the book model's 11,175,818 parameters within 4%); the stem's weight gives the
// width.
TEST(ModelTensorSpecs, AreTheModelsTensorsAndTheBoundHoldsThem) {
  for (const int64_t width : {int64_t{1}, int64_t{4}, int64_t{8}, int64_t{64}}) {
    SCOPED_TRACE("width " + std::to_string(width));
    const ResNetOptions options{10, 1, width};
    const auto specs = model_tensor_specs(options);
    ResNet model(options);
    std::vector<std::string> names;
    int64_t elements = 0;
    for (const auto& item : model->named_parameters()) names.push_back(item.key());
    for (const auto& item : model->named_buffers()) names.push_back(item.key());
    ASSERT_EQ(specs->tensors.size(), names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const auto& spec = specs->tensors[i];
      EXPECT_EQ(spec.name, names[i]);
      EXPECT_EQ(specs->by_name.at(names[i]), &spec);
      int64_t numel = 1;
      for (const int64_t d : spec.shape) numel *= d;
      elements += numel;
    }
    EXPECT_LE(static_cast<uint64_t>(elements), model_elements_bound(width, 10, 1));
    EXPECT_EQ(specs->by_name.at(kStemWeight)->shape, (std::vector<int64_t>{width, 1, 3, 3}));
    EXPECT_EQ(model_tensor_specs(options), specs);  // kept, not built again
  }
  EXPECT_LE(model_elements_bound(64, 10, 1), uint64_t{11175818} * 104 / 100);
  // Arguments past what any dptrain builds are clamped, so the bound never overflows.
  EXPECT_EQ(model_elements_bound(INT64_MAX, INT64_MAX, INT64_MAX),
            model_elements_bound(kMaxWidth, kMaxClassesOrChannels, kMaxClassesOrChannels));
}

}  // namespace
