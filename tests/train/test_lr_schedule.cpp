// Tests of the learning-rate schedule (lr_schedule.h): the factor of every shape against the
// formula of Note [The schedule's factor] worked by hand, and the book's constant rate untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "dptrain/train/lr_schedule.h"

namespace {

using namespace dptrain;

constexpr int64_t kSteps = 10;  // steps per epoch
constexpr int64_t kEpochs = 4;  // 40 steps in all

TEST(LrSchedule, ConstantWithoutWarmupIsTheBaseItself) {
  const LrSchedule constant;
  EXPECT_TRUE(lr_is_constant(constant));
  for (const int64_t s : {0, 1, 39, 1000}) {
    EXPECT_EQ(lr_at(0.1, constant, s, kSteps, kEpochs), 0.1);  // the same double, no arithmetic
  }
}

TEST(LrSchedule, WarmupRisesLinearlyToTheBase) {
  LrSchedule warm{LrShape::kConstant, /*warmup_epochs=*/0.5, 0, 0.1};  // 5 steps
  EXPECT_FALSE(lr_is_constant(warm));
  EXPECT_DOUBLE_EQ(lr_at(0.2, warm, 0, kSteps, kEpochs), 0.2 * 1 / 5);
  EXPECT_DOUBLE_EQ(lr_at(0.2, warm, 3, kSteps, kEpochs), 0.2 * 4 / 5);
  EXPECT_DOUBLE_EQ(lr_at(0.2, warm, 4, kSteps, kEpochs), 0.2);
  EXPECT_DOUBLE_EQ(lr_at(0.2, warm, 39, kSteps, kEpochs), 0.2);
}

TEST(LrSchedule, StepDecaysEveryStepEpochs) {
  const LrSchedule step{LrShape::kStep, 0, /*step_epochs=*/2, /*step_gamma=*/0.5};
  EXPECT_DOUBLE_EQ(lr_at(1.0, step, 0, kSteps, kEpochs), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(1.0, step, 19, kSteps, kEpochs), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(1.0, step, 20, kSteps, kEpochs), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(1.0, step, 39, kSteps, kEpochs), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(1.0, step, 40, kSteps, kEpochs), 0.25);
}

TEST(LrSchedule, CosineAfterWarmupFallsToZeroAtTheEnd) {
  const LrSchedule cosine{LrShape::kCosine, /*warmup_epochs=*/1, 0, 0.1};  // W = 10, T - W = 30
  EXPECT_DOUBLE_EQ(lr_at(0.4, cosine, 9, kSteps, kEpochs), 0.4);
  EXPECT_DOUBLE_EQ(lr_at(0.4, cosine, 10, kSteps, kEpochs), 0.4);
  EXPECT_DOUBLE_EQ(lr_at(0.4, cosine, 25, kSteps, kEpochs), 0.2);  // halfway: cos(pi/2) = 0
  EXPECT_DOUBLE_EQ(lr_at(0.4, cosine, 20, kSteps, kEpochs), 0.4 * 0.5 * (1 + std::cos(M_PI / 3)));
  EXPECT_NEAR(lr_at(0.4, cosine, 40, kSteps, kEpochs), 0.0, 1e-17);
}

TEST(LrSchedule, OneCycleIsTriangular) {
  const LrSchedule one{LrShape::kOneCycle, /*warmup_epochs=*/1, 0, 0.1};  // up 10, down 30
  EXPECT_DOUBLE_EQ(lr_at(0.3, one, 0, kSteps, kEpochs), 0.03);
  EXPECT_DOUBLE_EQ(lr_at(0.3, one, 10, kSteps, kEpochs), 0.3);
  EXPECT_DOUBLE_EQ(lr_at(0.3, one, 25, kSteps, kEpochs), 0.3 * 15 / 30);
  EXPECT_DOUBLE_EQ(lr_at(0.3, one, 39, kSteps, kEpochs), 0.3 * 1 / 30);
  EXPECT_EQ(lr_at(0.3, one, 41, kSteps, kEpochs), 0.0);  // past the end: never negative
}

TEST(LrSchedule, WarmupLongerThanTheRunIsCutAtItsEnd) {
  const LrSchedule warm{LrShape::kCosine, /*warmup_epochs=*/10, 0, 0.1};  // W = T = 40
  EXPECT_DOUBLE_EQ(lr_at(1.0, warm, 0, kSteps, kEpochs), 1.0 / 40);
  EXPECT_DOUBLE_EQ(lr_at(1.0, warm, 39, kSteps, kEpochs), 1.0);
}

TEST(LrSchedule, NamesRoundTrip) {
  for (const auto shape :
       {LrShape::kConstant, LrShape::kStep, LrShape::kCosine, LrShape::kOneCycle}) {
    EXPECT_EQ(lr_shape_from_name(lr_shape_name(shape)), shape);
  }
  EXPECT_EQ(lr_shape_from_name("linear"), std::nullopt);
}

}  // namespace
