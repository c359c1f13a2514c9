// The learning rate of every step: a linear warm-up, then constant, step decay, cosine or the
// one-cycle (triangular) decay, as a pure function of the global step. Not here: the update that
// uses it (parallel/bucket_sgd.h) or the flags that choose it (app/cli.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dptrain {

enum class LrShape {
  kConstant,  // the book's
  kStep,      // times `step_gamma` every `step_epochs` epochs
  kCosine,    // half a cosine from the base rate to zero (Loshchilov & Hutter 2017)
  kOneCycle,  // linear decay to zero after the warm-up: the triangular one-cycle (Smith 2018)
};

// "constant", "step", "cosine", "onecycle"; nullopt for another name.
std::optional<LrShape> lr_shape_from_name(const std::string& name);
const char* lr_shape_name(LrShape shape);

// The defaults are the book's constant rate.
struct LrSchedule {
  LrShape shape = LrShape::kConstant;
  double warmup_epochs = 0;  // linear warm-up over this many epochs' steps (may be fractional)
  int64_t step_epochs = 0;   // kStep: epochs between decays, > 0
  double step_gamma = 0.1;   // kStep: the factor of each decay
};

// Note [The schedule's factor]
// With S steps per epoch, T = epochs * S steps in all and W = round(warmup_epochs * S) warm-up
// steps (at most T), global step s (0-based) takes base * f(s), where f(s) = (s + 1) / W while
// s < W, and after it 1 (constant), gamma^floor(s / (step_epochs * S)) (step),
// (1 + cos(pi * (s - W) / (T - W))) / 2 (cosine) or (T - s) / (T - W) (one-cycle). PyTorch
// writes it as LambdaLR(optimizer, f) stepped after every step (bench/recipe_peer.py does).
// A constant schedule without warm-up returns `base` itself, untouched by any arithmetic, so the
// book's run keeps its bits.
double lr_at(double base, const LrSchedule& schedule, int64_t step, int64_t steps_per_epoch,
             int64_t epochs);

// Whether the rate never changes (constant, no warm-up): a CUDA graph may then bake it in.
bool lr_is_constant(const LrSchedule& schedule);

}  // namespace dptrain
