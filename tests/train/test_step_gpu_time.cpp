// The GPU time of sampled steps (step_gpu_time.h): which steps are timed and the median, on any
// machine; on a GPU, that a timed kernel's time is measured and that the host's own slowness is
// kept out of it (Note [Timing the GPU alone]). The GPU tests skip without one.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/train/step_gpu_time.h"

#if defined(DPTRAIN_WITH_CUDA)
#include <ATen/cuda/Sleep.h>
#include <torch/cuda.h>
#endif

namespace dptrain {
namespace {

using Steps = std::vector<int64_t>;

TEST(StepGpuTime, TimedStepsCutTheFullBatchesIntoEqualParts) {
  EXPECT_EQ(gpu_timed_steps(235, 3), (Steps{58, 117, 176}));  // the book's epoch at batch 256
  EXPECT_EQ(gpu_timed_steps(4, 3), (Steps{1, 2, 3}));
  EXPECT_EQ(gpu_timed_steps(2, 3), (Steps{0, 1}));  // never the same step twice
  EXPECT_EQ(gpu_timed_steps(1, 3), (Steps{0}));
  EXPECT_EQ(gpu_timed_steps(0, 3), Steps{});  // an epoch of one small batch: nothing typical
  EXPECT_EQ(gpu_timed_steps(10, 0), Steps{});
  EXPECT_EQ(gpu_timed_steps(10, 1), (Steps{5}));
}

TEST(StepGpuTime, MedianOfOddEvenAndNone) {
  EXPECT_TRUE(std::isnan(median_or_nan({})));
  EXPECT_EQ(median_or_nan({3, 1, 2}), 2);
  EXPECT_EQ(median_or_nan({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median_or_nan({7}), 7);
}

TEST(StepGpuTime, ACpuTimerTimesNothing) {
  StepGpuTimer timer{torch::Device(torch::kCPU)};
  EXPECT_FALSE(timer.active());
  timer.begin();
  timer.end();
  EXPECT_TRUE(timer.take_finished_ms().empty());
  EXPECT_TRUE(timer.all_ms().empty());
}

#if defined(DPTRAIN_WITH_CUDA)

const torch::Device kGpu0(torch::kCUDA, 0);

// GPU milliseconds of at::cuda::sleep(cycles), timed by the host around a synchronised run.
double sleep_ms(int64_t cycles) {
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  at::cuda::sleep(cycles);
  torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// A step that is one spinning kernel of known length is measured as that length.
TEST(StepGpuTime, AKernelsTimeIsMeasured) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t cycles = int64_t{1} << 25;  // ~17 ms at 2 GHz
  sleep_ms(cycles);                         // the kernel loaded
  const double expected = sleep_ms(cycles);
  StepGpuTimer timer(kGpu0);
  ASSERT_TRUE(timer.active());
  timer.begin();
  at::cuda::sleep(cycles);
  timer.end();
  torch::cuda::synchronize();
  const auto ms = timer.take_finished_ms();
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_GT(ms[0], 0.7 * expected) << "host-timed " << expected << " ms";
  EXPECT_LT(ms[0], 1.1 * expected) << "host-timed " << expected << " ms";
  EXPECT_EQ(timer.all_ms(), ms);
}

// A step whose host is slow (20 ms between its kernels' launches): the first attempt's spin
// (2 ms) is too short and its sample is dropped; the next spin covers the host, and the GPU
// time then leaves the host's 20 ms out.
TEST(StepGpuTime, TheHostsPaceIsKeptOut) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t short_kernel = int64_t{1} << 16;  // ~33 us at 2 GHz
  sleep_ms(short_kernel);
  StepGpuTimer timer(kGpu0);
  const auto slow_step = [&] {
    timer.begin();
    at::cuda::sleep(short_kernel);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    at::cuda::sleep(short_kernel);
    timer.end();
  };
  slow_step();
  torch::cuda::synchronize();
  EXPECT_TRUE(timer.take_finished_ms().empty()) << "the 2 ms spin cannot cover a 20 ms host";
  slow_step();
  torch::cuda::synchronize();
  const auto ms = timer.take_finished_ms();
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_LT(ms[0], 5.0) << "the host's 20 ms leaked into the GPU time";
}

#endif

}  // namespace
}  // namespace dptrain
