// Tests of the device peaks (device_peak.h): the table looked up by CUDA's names, the column a
// run's precision picks, --peak-tflops over the table, nothing claimed on the CPU, and the peak
// memory readings.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "dptrain/train/device_peak.h"

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

TEST(PeakPrecision, BfloatUnderAmpElseTf32WhereAllowedElseFp32) {
  EXPECT_EQ(peak_precision(Amp::kBFloat16, true), PeakPrecision::kBFloat16);
  EXPECT_EQ(peak_precision(Amp::kBFloat16, false), PeakPrecision::kBFloat16);
  EXPECT_EQ(peak_precision(Amp::kOff, true), PeakPrecision::kTf32);
  EXPECT_EQ(peak_precision(Amp::kOff, false), PeakPrecision::kFloat32);
  EXPECT_EQ(peak_precision_name(PeakPrecision::kTf32), "TF32");
}

TEST(DevicePeak, TheCpuHasNoneUnlessTheFlagGivesIt) {
  TrainOptions options;
  EXPECT_TRUE(std::isnan(device_peak_tflops(options, torch::kCPU)));
  options.amp = Amp::kBFloat16;
  EXPECT_TRUE(std::isnan(device_peak_tflops(options, torch::kCPU)));
  options.peak_tflops = 2.5;
  EXPECT_EQ(device_peak_tflops(options, torch::kCPU), 2.5);
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

TEST(DevicePeak, TheFlagWinsOverTheTableOnAGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  TrainOptions options;
  options.peak_tflops = 123.0;
  EXPECT_EQ(device_peak_tflops(options, torch::Device(torch::kCUDA, 0)), 123.0);
}

// The peak is read after the block is freed (a block this large is its own mapping, which free
// returns to the system): a reading of the resident size now, not of the peak, falls short.
TEST(PeakMemory, HostPeakCoversMemoryTouchedAndTheCpuHasNoDevicePeak) {
  const double before = peak_host_bytes();
  ASSERT_GT(before, 0);
  // 64 MiB more than the peak so far, written so that every page is resident.
  const size_t bytes = static_cast<size_t>(before) + (64u << 20);
  {
    std::unique_ptr<char[]> block(new char[bytes]);
    std::memset(block.get(), 1, bytes);
    asm volatile("" : : "r"(block.get()) : "memory");  // the writes happen, the block is not elided
    EXPECT_EQ(block[bytes - 1], 1);
  }
  EXPECT_GE(peak_host_bytes(), static_cast<double>(bytes));
  EXPECT_TRUE(std::isnan(peak_device_bytes(torch::kCPU)));
}

TEST(PeakMemory, ADevicePeakCoversATensorAllocatedThere) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const torch::Device gpu(torch::kCUDA, 0);
  const auto tensor = torch::ones({64 << 20}, torch::dtype(torch::kUInt8).device(gpu));
  EXPECT_GE(peak_device_bytes(gpu), static_cast<double>(64 << 20));
  EXPECT_EQ(tensor.sum().item<int64_t>(), int64_t{64} << 20);
}

}  // namespace
