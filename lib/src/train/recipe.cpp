// The training recipe's record. See recipe.h.
#include "dptrain/train/recipe.h"

#include <cmath>
#include <sstream>
#include <string>

#include "dptrain/core/errors.h"
#include "dptrain/data/augment.h"
#include "dptrain/train/lr_schedule.h"

namespace dptrain {
namespace {

// A double as the user would type it back (0.9, 5e-4), exactly: the shortest form that reads
// back as the same double.
std::string shortest(double value) {
  for (int digits = 1; digits <= 17; ++digits) {
    std::ostringstream out;
    out.precision(digits);
    out << value;
    if (std::stod(out.str()) == value) return out.str();
  }
  return std::to_string(value);
}

void require(bool ok, const std::string& flag, double value, const std::string& expected) {
  if (!ok) {
    throw UsageError(flag + " " + shortest(value) + ": expected " + expected);
  }
}

}  // namespace

bool is_book_recipe(const Recipe& r) {
  return r.sgd.momentum == 0 && !r.sgd.nesterov && r.sgd.weight_decay == 0 &&
         !r.sgd.weight_decay_skip_vectors && r.schedule.shape == LrShape::kConstant &&
         r.schedule.warmup_epochs == 0 && r.label_smoothing == 0 && r.augment == Augment::kNone &&
         r.clip_grad_norm == 0 && r.ema_decay == 0;
}

std::string recipe_flags(const Recipe& r) {
  if (is_book_recipe(r)) return "the book's recipe";
  std::string flags;
  const auto add = [&flags](const std::string& flag) {
    flags += (flags.empty() ? "" : " ") + flag;
  };
  if (r.sgd.momentum != 0) add("--momentum " + shortest(r.sgd.momentum));
  if (r.sgd.nesterov) add("--nesterov");
  if (r.sgd.weight_decay != 0) add("--weight-decay " + shortest(r.sgd.weight_decay));
  if (r.sgd.weight_decay_skip_vectors) add("--weight-decay-skip-norm-bias");
  if (r.schedule.shape != LrShape::kConstant) {
    add(std::string("--lr-schedule ") + lr_shape_name(r.schedule.shape));
  }
  if (r.schedule.shape == LrShape::kStep) {
    add("--lr-step-epochs " + std::to_string(r.schedule.step_epochs) + " --lr-step-gamma " +
        shortest(r.schedule.step_gamma));
  }
  if (r.schedule.warmup_epochs != 0) add("--warmup-epochs " + shortest(r.schedule.warmup_epochs));
  if (r.label_smoothing != 0) add("--label-smoothing " + shortest(r.label_smoothing));
  if (r.augment != Augment::kNone) {
    add(std::string("--augment ") + augment_name(r.augment) + " --crop-padding " +
        std::to_string(r.crop_padding));
  }
  if (r.clip_grad_norm != 0) add("--clip-grad-norm " + shortest(r.clip_grad_norm));
  if (r.ema_decay != 0) add("--ema " + shortest(r.ema_decay));
  return flags;
}

void check_recipe(const Recipe& r) {
  require(std::isfinite(r.sgd.momentum) && r.sgd.momentum >= 0 && r.sgd.momentum < 1, "--momentum",
          r.sgd.momentum, "a number from 0 to below 1");
  if (r.sgd.nesterov && r.sgd.momentum == 0) {
    throw UsageError("--nesterov needs --momentum above 0 (Nesterov's momentum is a momentum)");
  }
  require(std::isfinite(r.sgd.weight_decay) && r.sgd.weight_decay >= 0 && r.sgd.weight_decay < 1,
          "--weight-decay", r.sgd.weight_decay, "a number from 0 to below 1");
  if (r.sgd.weight_decay_skip_vectors && r.sgd.weight_decay == 0) {
    throw UsageError("--weight-decay-skip-norm-bias needs --weight-decay above 0");
  }
  require(std::isfinite(r.schedule.warmup_epochs) && r.schedule.warmup_epochs >= 0 &&
              r.schedule.warmup_epochs <= 1e6,
          "--warmup-epochs", r.schedule.warmup_epochs, "a number of epochs from 0 to 10^6");
  if (r.schedule.shape == LrShape::kStep) {
    require(r.schedule.step_epochs >= 1 && r.schedule.step_epochs <= 1000000, "--lr-step-epochs",
            static_cast<double>(r.schedule.step_epochs), "a whole number of epochs from 1 to 10^6");
    require(std::isfinite(r.schedule.step_gamma) && r.schedule.step_gamma > 0 &&
                r.schedule.step_gamma <= 1,
            "--lr-step-gamma", r.schedule.step_gamma, "a factor above 0, at most 1");
  }
  require(std::isfinite(r.label_smoothing) && r.label_smoothing >= 0 && r.label_smoothing < 1,
          "--label-smoothing", r.label_smoothing, "a number from 0 to below 1");
  require(r.crop_padding >= 0 && r.crop_padding <= 28, "--crop-padding",
          static_cast<double>(r.crop_padding), "a whole number of pixels from 0 to 28");
  require(std::isfinite(r.clip_grad_norm) && r.clip_grad_norm >= 0, "--clip-grad-norm",
          r.clip_grad_norm, "a finite norm >= 0 (0: no clipping)");
  require(std::isfinite(r.ema_decay) && r.ema_decay >= 0 && r.ema_decay < 1, "--ema", r.ema_decay,
          "a decay from 0 (off) to below 1");
}

}  // namespace dptrain
