// Tests of the recipe's flags (app/recipe_flags.h): every flag's exact value, the book's recipe
// by default, one-line errors naming the flag, and --recipe standing for its flags where it is
// given (Note [A preset is the flags it stands for]).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli.h"
#include "dptrain/core/errors.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/train/recipe.h"
#include "support/test_support.h"

namespace {

using namespace dptrain;

TrainOptions parse_train(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"dptrain", "train"};
  for (const auto& arg : args) argv.push_back(arg.c_str());
  argv.push_back(nullptr);
  return parse_command_line(static_cast<int>(argv.size()) - 1, argv.data()).train.options;
}

void expect_train_parse_error(const std::vector<std::string>& args, const std::string& substring) {
  const std::string message =
      dptrain::testing::expect_throws<UsageError>([&] { parse_train(args); }, {substring});
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
}

TEST(RecipeFlags, NoneGivenIsTheBooksRecipe) {
  const Recipe r = parse_train({}).recipe;
  EXPECT_TRUE(is_book_recipe(r));
  EXPECT_EQ(recipe_flags(r), "the book's recipe");
}

TEST(RecipeFlags, EveryFlagsValueIsExact) {
  const Recipe r = parse_train({"--momentum",
                                "0.9",
                                "--nesterov",
                                "--weight-decay",
                                "5e-4",
                                "--weight-decay-skip-norm-bias",
                                "--lr-schedule",
                                "step",
                                "--lr-step-epochs",
                                "3",
                                "--lr-step-gamma",
                                "0.5",
                                "--warmup-epochs",
                                "0.25",
                                "--label-smoothing",
                                "0.1",
                                "--augment",
                                "crop-flip",
                                "--crop-padding",
                                "3",
                                "--clip-grad-norm",
                                "2.5",
                                "--ema",
                                "0.999"})
                       .recipe;
  EXPECT_EQ(r.sgd.momentum, 0.9);
  EXPECT_TRUE(r.sgd.nesterov);
  EXPECT_EQ(r.sgd.weight_decay, 5e-4);
  EXPECT_TRUE(r.sgd.weight_decay_skip_vectors);
  EXPECT_EQ(r.schedule.shape, LrShape::kStep);
  EXPECT_EQ(r.schedule.step_epochs, 3);
  EXPECT_EQ(r.schedule.step_gamma, 0.5);
  EXPECT_EQ(r.schedule.warmup_epochs, 0.25);
  EXPECT_EQ(r.label_smoothing, 0.1);
  EXPECT_EQ(r.augment, Augment::kCropFlip);
  EXPECT_EQ(r.crop_padding, 3);
  EXPECT_EQ(r.clip_grad_norm, 2.5);
  EXPECT_EQ(r.ema_decay, 0.999);
  EXPECT_EQ(recipe_flags(r),
            "--momentum 0.9 --nesterov --weight-decay 0.0005 --weight-decay-skip-norm-bias "
            "--lr-schedule step --lr-step-epochs 3 --lr-step-gamma 0.5 --warmup-epochs 0.25 "
            "--label-smoothing 0.1 --augment crop-flip --crop-padding 3 --clip-grad-norm 2.5 "
            "--ema 0.999");
  for (const char* shape : {"cosine", "onecycle", "constant"}) {
    EXPECT_STREQ(lr_shape_name(parse_train({"--lr-schedule", shape}).recipe.schedule.shape), shape);
  }
}

TEST(RecipeFlags, BadValuesAreOneLineNamingTheFlag) {
  expect_train_parse_error({"--momentum", "1"},
                           "--momentum: '1' is out of range; expected 0 to below 1");
  expect_train_parse_error({"--momentum", "-0.1"}, "--momentum: '-0.1' is out of range");
  expect_train_parse_error({"--momentum", "nan"}, "--momentum: 'nan' is out of range");
  expect_train_parse_error({"--weight-decay", "x"}, "--weight-decay: 'x' is not a number");
  expect_train_parse_error({"--nesterov"}, "--nesterov needs --momentum above 0");
  expect_train_parse_error({"--weight-decay-skip-norm-bias"},
                           "--weight-decay-skip-norm-bias needs --weight-decay above 0");
  expect_train_parse_error(
      {"--lr-schedule", "linear"},
      "--lr-schedule: 'linear' is not one of constant, step, cosine or onecycle");
  expect_train_parse_error({"--lr-schedule", "step"},
                           "--lr-schedule step needs --lr-step-epochs N");
  expect_train_parse_error({"--lr-step-epochs", "2"},
                           "--lr-step-epochs: only with --lr-schedule step");
  expect_train_parse_error({"--lr-schedule", "step", "--lr-step-epochs", "0"},
                           "--lr-step-epochs: '0' is out of range");
  expect_train_parse_error(
      {"--lr-schedule", "step", "--lr-step-epochs", "1", "--lr-step-gamma", "0"},
      "--lr-step-gamma: '0' is out of range");
  expect_train_parse_error({"--warmup-epochs", "inf"}, "--warmup-epochs: 'inf' is out of range");
  expect_train_parse_error({"--label-smoothing", "1"}, "--label-smoothing: '1' is out of range");
  expect_train_parse_error({"--augment", "flip"},
                           "--augment: 'flip' is not one of none or crop-flip");
  expect_train_parse_error({"--crop-padding", "29"}, "--crop-padding: '29' is out of range");
  expect_train_parse_error({"--clip-grad-norm", "-1"}, "--clip-grad-norm: '-1' is out of range");
  expect_train_parse_error({"--ema", "1"}, "--ema: '1' is out of range");
  expect_train_parse_error({"--recipe", "fastest"}, "--recipe: 'fastest' is not one of book, fast");
  expect_train_parse_error({"--recipe=fastest"}, "--recipe: 'fastest' is not one of book, fast");
  // As every other flag: the next flag is no value, and a long value is cut short.
  expect_train_parse_error({"--momentum", "--nesterov"},
                           "--momentum: missing value (got '--nesterov')");
  expect_train_parse_error(
      {"--momentum=" + std::string(300, '9')},
      "--momentum: '9999999999999999999999999999999999999999...' (300 characters)");
  expect_train_parse_error({"--recipe", std::string(300, 'a')}, "(300 characters) is not one of");
}

TEST(RecipeFlags, APresetIsItsFlagsWhereItStands) {
  // Before the preset: overridden by it. After it: overriding it.
  const auto before = parse_train({"--momentum", "0.9", "--width", "8", "--recipe", "book"});
  EXPECT_EQ(before.recipe.sgd.momentum, 0);
  EXPECT_EQ(before.width, 64);
  const auto after =
      parse_train({"--recipe=book", "--momentum", "0.9", "--nesterov", "--width", "8"});
  EXPECT_EQ(after.recipe.sgd.momentum, 0.9);
  EXPECT_TRUE(after.recipe.sgd.nesterov);
  EXPECT_EQ(after.width, 8);
  // A switch given before the book's preset is switched off by it.
  const auto off = parse_train({"--momentum", "0.5", "--nesterov", "--recipe", "book"});
  EXPECT_FALSE(off.recipe.sgd.nesterov);
  EXPECT_TRUE(is_book_recipe(off.recipe));
  const auto book = parse_train({"--recipe", "book"});
  const auto plain = parse_train({});
  EXPECT_EQ(book.width, plain.width);
  EXPECT_EQ(book.batch_size, plain.batch_size);
  EXPECT_EQ(book.epochs, plain.epochs);
  EXPECT_EQ(book.lr, plain.lr);
  EXPECT_EQ(book.amp, plain.amp);
  EXPECT_EQ(book.memory_format, plain.memory_format);
  EXPECT_EQ(book.fused_conv_bias_grad, plain.fused_conv_bias_grad);
}

TEST(RecipeFlags, TheFastPresetIsTheSearchsChoiceAndLaterFlagsOverrideIt) {
  const auto fast = parse_train({"--recipe", "fast"});
  EXPECT_EQ(fast.width, 16);
  EXPECT_EQ(fast.batch_size, 256);
  EXPECT_EQ(fast.epochs, 6);
  EXPECT_EQ(fast.lr, 0.1);
  EXPECT_EQ(fast.memory_format, MemoryFormat::kChannelsLast);
  EXPECT_TRUE(fast.fused_conv_bias_grad);
  EXPECT_EQ(recipe_flags(fast.recipe),
            "--momentum 0.9 --nesterov --weight-decay 0.0005 --weight-decay-skip-norm-bias "
            "--lr-schedule onecycle --warmup-epochs 1 --label-smoothing 0.1");
  const auto longer = parse_train({"--recipe", "fast", "--epochs", "8", "--width", "8"});
  EXPECT_EQ(longer.epochs, 8);
  EXPECT_EQ(longer.width, 8);
  EXPECT_EQ(longer.recipe.sgd.momentum, 0.9);
  EXPECT_EQ(parse_train({"--recipe", "fast", "--memory-format", "contiguous"}).memory_format,
            MemoryFormat::kContiguous);
  EXPECT_FALSE(
      parse_train({"--recipe", "fast", "--conv-bias-grad", "library"}).fused_conv_bias_grad);
  // The book's after the fast one undoes it whole.
  const auto undone = parse_train({"--recipe", "fast", "--recipe", "book"});
  EXPECT_TRUE(is_book_recipe(undone.recipe));
  EXPECT_EQ(undone.memory_format, MemoryFormat::kAuto);
  EXPECT_FALSE(undone.fused_conv_bias_grad);
}

}  // namespace
