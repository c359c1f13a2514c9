// Tests of the recipe's record (recipe.h): the book's is every default, the flags text that names
// a recipe, and the check of its values, one line naming the flag.
#include <gtest/gtest.h>

#include <string>

#include "dptrain/core/errors.h"
#include "dptrain/train/recipe.h"
#include "support/test_support.h"

namespace {

using namespace dptrain;

TEST(Recipe, TheBooksIsEveryDefaultAndAnyChangeIsNot) {
  EXPECT_TRUE(is_book_recipe(Recipe{}));
  EXPECT_EQ(recipe_flags(Recipe{}), "the book's recipe");
  const auto changed = [](void (*edit)(Recipe&)) {
    Recipe r;
    edit(r);
    return is_book_recipe(r);
  };
  EXPECT_FALSE(changed([](Recipe& r) { r.sgd.momentum = 0.5; }));
  EXPECT_FALSE(changed([](Recipe& r) { r.sgd.weight_decay = 1e-4; }));
  EXPECT_FALSE(changed([](Recipe& r) { r.schedule.shape = LrShape::kCosine; }));
  EXPECT_FALSE(changed([](Recipe& r) { r.schedule.warmup_epochs = 1; }));
  EXPECT_FALSE(changed([](Recipe& r) { r.label_smoothing = 0.1; }));
  EXPECT_FALSE(changed([](Recipe& r) { r.augment = Augment::kCropFlip; }));
  EXPECT_FALSE(changed([](Recipe& r) { r.clip_grad_norm = 1; }));
  EXPECT_FALSE(changed([](Recipe& r) { r.ema_decay = 0.99; }));
  // The crop's padding matters only with the crop.
  EXPECT_TRUE(changed([](Recipe& r) { r.crop_padding = 4; }));
}

TEST(Recipe, FlagsTextNamesEachPartAsTheDriverSpellsIt) {
  Recipe r;
  r.sgd.momentum = 0.9;
  r.schedule.shape = LrShape::kOneCycle;
  r.schedule.warmup_epochs = 2;
  r.ema_decay = 0.9999;
  EXPECT_EQ(recipe_flags(r), "--momentum 0.9 --lr-schedule onecycle --warmup-epochs 2 --ema 0.9999");
  r = Recipe{};
  r.sgd.weight_decay = 5e-4;
  r.augment = Augment::kCropFlip;
  EXPECT_EQ(recipe_flags(r), "--weight-decay 0.0005 --augment crop-flip --crop-padding 2");
}

TEST(Recipe, ImpossibleValuesAreUsageErrorsNamingTheFlag) {
  const auto refused = [](void (*edit)(Recipe&), const std::string& phrase) {
    Recipe r;
    edit(r);
    dptrain::testing::expect_throws<UsageError>([&] { check_recipe(r); }, {phrase});
  };
  refused([](Recipe& r) { r.sgd.momentum = 1; }, "--momentum 1: expected a number from 0 to below 1");
  refused([](Recipe& r) { r.sgd.nesterov = true; }, "--nesterov needs --momentum above 0");
  refused([](Recipe& r) { r.sgd.weight_decay = -1; }, "--weight-decay -1");
  refused([](Recipe& r) { r.sgd.weight_decay_skip_vectors = true; },
          "--weight-decay-skip-norm-bias needs --weight-decay above 0");
  refused(
      [](Recipe& r) {
        r.schedule.shape = LrShape::kStep;
        r.schedule.step_epochs = 0;
      },
      "--lr-step-epochs 0");
  refused(
      [](Recipe& r) {
        r.schedule.shape = LrShape::kStep;
        r.schedule.step_epochs = 1;
        r.schedule.step_gamma = 2;
      },
      "--lr-step-gamma 2");
  refused([](Recipe& r) { r.label_smoothing = 1; }, "--label-smoothing 1");
  refused([](Recipe& r) { r.crop_padding = -1; }, "--crop-padding -1");
  refused([](Recipe& r) { r.clip_grad_norm = -0.5; }, "--clip-grad-norm -0.5");
  refused([](Recipe& r) { r.ema_decay = 1; }, "--ema 1");
  EXPECT_NO_THROW(check_recipe(Recipe{}));
}

}  // namespace
