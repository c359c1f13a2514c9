// The recipe's flags and presets. See recipe_flags.h.
#include "recipe_flags.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cxxopts.hpp>
#include <string>
#include <vector>

#include "cli.h"
#include "dptrain/core/errors.h"
#include "dptrain/data/augment.h"
#include "dptrain/train/lr_schedule.h"
#include "dptrain/train/recipe.h"

namespace dptrain {
namespace {

// A preset: its name, what it is, and the flags it stands for.
struct RecipePreset {
  const char* name;
  const char* what;
  std::vector<std::string> arguments;
};

// The book's sets every flag a preset may set to its default, so that it undoes whatever was
// given before it.
// clang-format off
const std::vector<RecipePreset> kRecipePresets{
    {"book",
     "every default",
     {"--width", "64", "--batch-size", "256", "--epochs", "10", "--lr", "0.1", "--amp", "off",
      "--momentum", "0", "--nesterov=false", "--weight-decay", "0",
      "--weight-decay-skip-norm-bias=false", "--lr-schedule", "constant", "--warmup-epochs", "0",
      "--label-smoothing", "0", "--augment", "none", "--crop-padding", "2", "--clip-grad-norm",
      "0", "--ema", "0", "--memory-format", "auto", "--conv-bias-grad", "library"}},
    // Chosen on a validation split of 5,000 images on two CPU cores (AMD EPYCs, one with
    // AVX-512, one with AVX2 only): bench/results/2026-12-07-cpu-recipe-search-width8.md,
    // -round2.md and -round3.md. Width 8 stops near 0.929 however long it trains; width 16 is
    // the narrowest that passed 0.93. Channels-last: the faster layout on every device, which
    // `auto` keeps from the book's run on AVX2 CPUs (Note [Why auto stays contiguous on AVX2]).
    // The fused bias gradient: a few percent of the step on the CPU, rounding apart the same
    // (Note [The convolution's bias gradient]).
    {"fast",
     "width 16, 6 epochs, Nesterov momentum, one-cycle, channels-last, fused bias gradients; "
     "chosen on a validation split for two CPU cores",
     {"--width", "16", "--batch-size", "256", "--epochs", "6", "--lr", "0.1", "--amp", "off",
      "--momentum", "0.9", "--nesterov=true", "--weight-decay", "0.0005",
      "--weight-decay-skip-norm-bias=true", "--lr-schedule", "onecycle", "--warmup-epochs", "1",
      "--label-smoothing", "0.1", "--augment", "none", "--crop-padding", "2", "--clip-grad-norm",
      "0", "--ema", "0", "--memory-format", "channels-last", "--conv-bias-grad", "fused"}},
};
// clang-format on

// A number from `low` up, below `high` (or at most, with `high_included`), as the user typed it.
double parse_number_flag(const std::string& flag, const std::string& text, double low, double high,
                         bool high_included, const std::string& expected) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ||
      end != text.c_str() + text.size()) {
    throw UsageError("--" + flag + ": " + quote_argument(text) + " is not a number");
  }
  if (!std::isfinite(value) || value < low || value > high || (!high_included && value == high)) {
    throw UsageError("--" + flag + ": " + quote_argument(text) + " is out of range; expected " +
                     expected);
  }
  return value;
}

}  // namespace

// clang-format off
void add_recipe_flags(cxxopts::Options& options) {
  std::string presets;
  for (const auto& preset : kRecipePresets) {
    presets += std::string(presets.empty() ? "" : "; ") + preset.name + ": " + preset.what;
  }
  options.add_options("Recipe")
      ("recipe", "a named preset of the flags below and others (" + presets + "); flags after "
                 "it override it", cxxopts::value<std::string>(), "NAME")
      ("momentum", "SGD momentum (0: none, the book's)",
       cxxopts::value<std::string>()->default_value("0"), "M")
      ("nesterov", "Nesterov's momentum (needs --momentum)",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
      ("weight-decay", "L2 weight decay added to the gradient, as torch.optim.SGD",
       cxxopts::value<std::string>()->default_value("0"), "WD")
      ("weight-decay-skip-norm-bias", "no weight decay on biases and BatchNorm's weights",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
      ("lr-schedule", "the learning rate per step: constant, step, cosine or onecycle (linear "
                      "decay to zero after the warm-up)",
       cxxopts::value<std::string>()->default_value("constant"), "NAME")
      ("warmup-epochs", "rise linearly to --lr over this many epochs' steps (may be fractional)",
       cxxopts::value<std::string>()->default_value("0"), "E")
      ("lr-step-epochs", "--lr-schedule step: epochs between decays",
       cxxopts::value<std::string>(), "N")
      ("lr-step-gamma", "--lr-schedule step: the factor of each decay",
       cxxopts::value<std::string>()->default_value("0.1"), "G")
      ("label-smoothing", "label smoothing of the training loss",
       cxxopts::value<std::string>()->default_value("0"), "E")
      ("augment", "training images: none, or crop-flip (random crop of the zero-padded image, "
                  "horizontal flip)", cxxopts::value<std::string>()->default_value("none"), "NAME")
      ("crop-padding", "--augment crop-flip: pixels of padding around each image",
       cxxopts::value<std::string>()->default_value("2"), "P")
      ("clip-grad-norm", "clip the averaged gradient's 2-norm to this (0: never)",
       cxxopts::value<std::string>()->default_value("0"), "C")
      ("ema", "evaluate and save an exponential moving average of the weights with this decay "
              "(0: the weights themselves)", cxxopts::value<std::string>()->default_value("0"),
       "DECAY");
}
// clang-format on

Recipe read_recipe_flags(const cxxopts::ParseResult& result) {
  const auto text = [&](const char* flag) { return flag_text(result, flag); };
  const auto below_one = [&](const char* flag) {
    return parse_number_flag(flag, text(flag), 0, 1, false, "0 to below 1");
  };
  Recipe r;
  r.sgd.momentum = below_one("momentum");
  r.sgd.nesterov = result["nesterov"].as<bool>();
  r.sgd.weight_decay = below_one("weight-decay");
  r.sgd.weight_decay_skip_vectors = result["weight-decay-skip-norm-bias"].as<bool>();
  r.schedule.shape = *lr_shape_from_name(parse_choice_flag(
      "lr-schedule", text("lr-schedule"), {"constant", "step", "cosine", "onecycle"}));
  r.schedule.warmup_epochs =
      parse_number_flag("warmup-epochs", text("warmup-epochs"), 0, 1e6, true, "0 to 1000000");
  const bool step = r.schedule.shape == LrShape::kStep;
  if (result.count("lr-step-epochs")) {
    const std::string epochs = text("lr-step-epochs");
    if (!step) throw UsageError("--lr-step-epochs: only with --lr-schedule step");
    r.schedule.step_epochs = parse_integer_flag("lr-step-epochs", epochs, 1, 1000000);
  } else if (step) {
    throw UsageError("--lr-schedule step needs --lr-step-epochs N, the epochs between decays");
  }
  r.schedule.step_gamma = parse_number_flag("lr-step-gamma", text("lr-step-gamma"), 0, 1, true,
                                            "a factor above 0, at most 1");
  if (r.schedule.step_gamma == 0) {
    throw UsageError("--lr-step-gamma: '0' is out of range; expected a factor above 0, at most 1");
  }
  r.label_smoothing = below_one("label-smoothing");
  r.augment =
      *augment_from_name(parse_choice_flag("augment", text("augment"), {"none", "crop-flip"}));
  r.crop_padding = parse_integer_flag("crop-padding", text("crop-padding"), 0, 28);
  r.clip_grad_norm = parse_number_flag("clip-grad-norm", text("clip-grad-norm"), 0, 1e30, true,
                                       "a norm from 0 (never) up");
  r.ema_decay = below_one("ema");
  check_recipe(r);
  return r;
}

std::vector<std::string> recipe_preset_arguments(const std::string& name) {
  if (name.empty()) throw UsageError("--recipe: empty value");
  std::string names;
  for (const auto& preset : kRecipePresets) {
    if (name == preset.name) return preset.arguments;
    names += std::string(names.empty() ? "" : ", ") + preset.name;
  }
  throw UsageError("--recipe: " + quote_argument(name) + " is not one of " + names);
}

}  // namespace dptrain
