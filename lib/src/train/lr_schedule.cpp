// The learning rate per step. See lr_schedule.h.
#include "dptrain/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

namespace dptrain {

std::optional<LrShape> lr_shape_from_name(const std::string& name) {
  if (name == "constant") return LrShape::kConstant;
  if (name == "step") return LrShape::kStep;
  if (name == "cosine") return LrShape::kCosine;
  if (name == "onecycle") return LrShape::kOneCycle;
  return std::nullopt;
}

const char* lr_shape_name(LrShape shape) {
  switch (shape) {
    case LrShape::kConstant:
      return "constant";
    case LrShape::kStep:
      return "step";
    case LrShape::kCosine:
      return "cosine";
    case LrShape::kOneCycle:
      return "onecycle";
  }
  return "constant";
}

bool lr_is_constant(const LrSchedule& schedule) {
  return schedule.shape == LrShape::kConstant && schedule.warmup_epochs == 0;
}

double lr_at(double base, const LrSchedule& schedule, int64_t step, int64_t steps_per_epoch,
             int64_t epochs) {
  if (lr_is_constant(schedule)) return base;
  constexpr double kPi = 3.14159265358979323846;
  const int64_t total = std::max<int64_t>(1, epochs * steps_per_epoch);
  const auto warmup = std::min<int64_t>(
      total, std::llround(schedule.warmup_epochs * static_cast<double>(steps_per_epoch)));
  if (step < warmup) return base * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const auto after = static_cast<double>(step - warmup);  // steps since the warm-up
  const auto span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  switch (schedule.shape) {
    case LrShape::kConstant:
      return base;
    case LrShape::kStep: {
      const int64_t every = std::max<int64_t>(1, schedule.step_epochs * steps_per_epoch);
      return base * std::pow(schedule.step_gamma, static_cast<double>(step / every));
    }
    case LrShape::kCosine:
      return base * 0.5 * (1.0 + std::cos(kPi * std::min(after / span, 1.0)));
    case LrShape::kOneCycle:
      return base * std::max(0.0, static_cast<double>(total - step) / span);
  }
  return base;
}

}  // namespace dptrain
