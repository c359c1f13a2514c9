// The settings the ranks compare at the rendezvous (run_configuration.h; the comparison is
// check_same_settings, joined_world.h): every setting that shapes the run is in them, the text
// is exact, and the first difference is named.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/parallel/joined_world.h"
#include "dptrain/train/options.h"
#include "dptrain/train/run_configuration.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

std::string text_of(const TrainOptions& options, const std::string& train = "16 images") {
  return settings_text(run_settings(options, train, "8 images", "the beginning"));
}

TEST(RunSettings, SameOptionsAgree) {
  const TrainOptions options;
  EXPECT_NO_THROW(check_same_settings({text_of(options), text_of(options), text_of(options)}));
  EXPECT_NO_THROW(check_same_settings({text_of(options)}));
}

// Each setting that changes the model, the data order or the step changes the text, and the
// message names it with both values, as a user would type them.
TEST(RunSettings, EachDifferenceIsNamedWithBothValues) {
  const TrainOptions base;
  struct Change {
    void (*apply)(TrainOptions&);
    const char* message;  // what check_same_settings must say
  };
  const Change changes[] = {
      {[](TrainOptions& o) { o.lr = 0.2; },
       "rank 2 was started with --lr 0.2, rank 0 with --lr 0.1"},
      {[](TrainOptions& o) { o.lr = std::nextafter(0.1, 1.0); },
       "--lr 0.10000000000000002, rank 0 with --lr 0.1"},
      {[](TrainOptions& o) { o.width = 8; }, "--width 8, rank 0 with --width 64"},
      {[](TrainOptions& o) { o.batch_size = 512; },
       "--batch-size 512, rank 0 with --batch-size 256"},
      {[](TrainOptions& o) { o.seed = 3; }, "--seed 3, rank 0 with --seed 0"},
      {[](TrainOptions& o) { o.sync_bn = true; }, "--sync-bn on, rank 0 with --sync-bn off"},
      {[](TrainOptions& o) { o.amp = Amp::kBFloat16; }, "--amp bf16, rank 0 with --amp off"},
      {[](TrainOptions& o) { o.fused_conv_bias_grad = true; },
       "--conv-bias-grad fused, rank 0 with --conv-bias-grad library"},
      // NCCL: whether a collective is captured in a graph must be the same on every rank.
      {[](TrainOptions& o) { o.cuda_graph = true; },
       "--cuda-graph on, rank 0 with --cuda-graph off"},
      {[](TrainOptions& o) { o.epochs = 3; }, "--epochs 3"},
      {[](TrainOptions& o) { o.bucket_bytes = 1024 * 1024; }, "--bucket-mb 1, rank 0 with"},
      {[](TrainOptions& o) { o.on_nonfinite = NonFinite::kSkip; }, "--on-nonfinite skip"},
      {[](TrainOptions& o) { o.resume = true; }, "--resume on, rank 0 with --resume off"},
      // Outputs only rank 0 writes, given to another rank alone, are not ignored.
      {[](TrainOptions& o) { o.save_model = "m.pt"; },
       "--save-model given, rank 0 with --save-model none"},
      {[](TrainOptions& o) { o.driver_outputs = {"--metrics"}; },
       "--metrics on, rank 0 with --metrics off"},
      {[](TrainOptions& o) { o.driver_outputs = {"--plot"}; }, "--plot on, rank 0 with --plot off"},
      {[](TrainOptions& o) { o.driver_outputs = {"--tensorboard"}; },
       "--tensorboard on, rank 0 with --tensorboard off"},
  };
  for (const auto& change : changes) {
    TrainOptions other = base;
    change.apply(other);
    SCOPED_TRACE(change.message);
    testing::expect_throws<UsageError>(
        [&] {
          check_same_settings({text_of(base), text_of(base), text_of(other)});
        },
        {change.message, "every rank needs the same flags and data"});
  }
}

TEST(RunSettings, DataAndStartAreCompared) {
  const TrainOptions options;
  testing::expect_throws<UsageError>(
      [&] {
        check_same_settings({text_of(options), text_of(options, "16 images, SHA-256 ab")});
      },
      {"rank 1 was started with the training set 16 images, SHA-256 ab, rank 0 with the "
       "training set 16 images"});
  const auto at = [&](const std::string& start) {
    return settings_text(run_settings(options, "16 images", "8 images", start));
  };
  testing::expect_throws<UsageError>(
      [&] {
        check_same_settings({at("epoch 2"), at("the beginning")});
      },
      {"rank 1 was started with the start the beginning, rank 0 with the start epoch 2"});
}

// A peer of another build, whose settings have other names or another count, is named as such.
TEST(RunSettings, ForeignSettingsAreNamed) {
  const TrainOptions options;
  testing::expect_throws<UsageError>(
      [&] {
        check_same_settings({text_of(options), text_of(options) + "--new-flag=1\n"});
      },
      {"--new-flag 1, rank 0 with --new-flag (not set: another dptrain?)"});
}

}  // namespace
}  // namespace dptrain
