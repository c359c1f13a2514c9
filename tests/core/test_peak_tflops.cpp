// Tests of the known GPUs' peaks (peak_tflops.h): the table looked up by CUDA's names, and an
// MFU as a fraction of a plausible peak.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "dptrain/core/peak_tflops.h"

namespace {

using namespace dptrain;

struct TableCase {
  const char* name;
  PeakPrecision precision;
  double tflops;  // NVIDIA's datasheet figure, halved where it is printed with sparsity
};

class PeakTable : public ::testing::TestWithParam<TableCase> {};

TEST_P(PeakTable, GivesTheDenseDatasheetFigure) {
  const auto& c = GetParam();
  const auto peak = table_peak_tflops(c.name, c.precision);
  ASSERT_TRUE(peak.has_value()) << c.name;
  EXPECT_EQ(*peak, c.tflops);
}

INSTANTIATE_TEST_SUITE_P(
    Gpus, PeakTable,
    ::testing::Values(TableCase{"NVIDIA H200", PeakPrecision::kBFloat16, 989.5},  // 1,979 / 2
                      TableCase{"NVIDIA H200", PeakPrecision::kTf32, 494.5},      // 989 / 2
                      TableCase{"NVIDIA H200", PeakPrecision::kFloat32, 67.0},
                      TableCase{"NVIDIA H100 80GB HBM3", PeakPrecision::kBFloat16, 989.5},
                      TableCase{"NVIDIA H100 PCIe", PeakPrecision::kBFloat16, 756.5},
                      TableCase{"NVIDIA A100-SXM4-80GB", PeakPrecision::kBFloat16, 312.0},
                      TableCase{"NVIDIA A100-SXM4-40GB", PeakPrecision::kTf32, 156.0},
                      TableCase{"NVIDIA A100-PCIE-40GB", PeakPrecision::kFloat32, 19.5},
                      TableCase{"NVIDIA L4", PeakPrecision::kTf32, 60.0}));

TEST(PeakTable, ClaimsNothingForANameNotInIt) {
  for (const char* name : {"NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-32GB", "NVIDIA H200 NVL",
                           "nvidia h200", "NVIDIA H200 ", "", "cpu"}) {
    EXPECT_FALSE(table_peak_tflops(name, PeakPrecision::kBFloat16).has_value()) << name;
  }
}

// --peak-tflops 1e-308 would give an MFU of 3e306. An MFU is a fraction of the devices'
// summed peak; a run that outpaces the peak it was given has none (Note [A plausible device's
// peak]).
TEST(DevicePeak, AnMfuIsAFractionFromZeroToOneOrNone) {
  EXPECT_EQ(model_flops_utilization(0.5, 1.0, 2), 0.25);
  EXPECT_EQ(model_flops_utilization(2.0, 1.0, 2), 1.0);
  EXPECT_EQ(model_flops_utilization(0.0, 1.0, 1), 0.0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(model_flops_utilization(2.0000001, 1.0, 2)));
  EXPECT_TRUE(std::isnan(model_flops_utilization(1e-3, kMinPeakTflops, 1)));
  EXPECT_TRUE(std::isnan(model_flops_utilization(nan, 1.0, 1)));
  EXPECT_TRUE(std::isnan(model_flops_utilization(1.0, nan, 1)));
  EXPECT_EQ(kMinPeakTflops, 1e-6);
  EXPECT_EQ(kMaxPeakTflops, 1e5);
  // Every GPU in the table lies between the bounds, at every precision.
  for (const char* name : {"NVIDIA H200", "NVIDIA L4", "NVIDIA A30"}) {
    for (const auto precision :
         {PeakPrecision::kBFloat16, PeakPrecision::kTf32, PeakPrecision::kFloat32}) {
      const double peak = *table_peak_tflops(name, precision);
      EXPECT_TRUE(peak >= kMinPeakTflops && peak <= kMaxPeakTflops) << name << " " << peak;
    }
  }
}

}  // namespace
