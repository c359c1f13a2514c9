// The GPU time of sampled steps (step_gpu_time.h): which steps are timed and the median, on any
// machine; on a GPU, that a timed kernel's time is measured and that the host's own slowness is
// kept out of it (Note [Timing the GPU alone]). The GPU tests skip without one.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
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

TEST(StepGpuTime, ACpuTimerTimesNothing) {
  StepGpuTimer timer{torch::Device(torch::kCPU)};
  EXPECT_FALSE(timer.active());
  timer.begin();
  timer.end();
  const auto times = timer.take_finished();
  EXPECT_TRUE(times.ms.empty());
  EXPECT_EQ(times.dropped, 0);
  EXPECT_EQ(times.spin_ms, 0);
  EXPECT_TRUE(timer.all_ms().empty());
  EXPECT_EQ(timer.samples(), 0);
}

// Note [Timing the GPU alone]: a kept sample sizes the next spin to the host's pace; a drop
// doubles it once; a second drop in a row turns the timer off; no spin is over kMostSpinMs.
TEST(StepGpuTime, TheSpinStopsEscalatingAfterOneDrop) {
  const TimerSpin first;
  EXPECT_EQ(first.ms, kFirstSpinMs);
  EXPECT_FALSE(first.off);
  const auto kept = next_timer_spin(first, /*host_ms=*/4.0, /*kept=*/true);
  EXPECT_DOUBLE_EQ(kept.ms, 6.05);
  EXPECT_EQ(kept.drops_in_a_row, 0);
  const auto dropped = next_timer_spin(first, /*host_ms=*/3.0, /*kept=*/false);
  EXPECT_DOUBLE_EQ(dropped.ms, 6.0);  // twice the longer of the spin (2) and the host (3)
  EXPECT_EQ(dropped.drops_in_a_row, 1);
  EXPECT_FALSE(dropped.off);
  const auto again = next_timer_spin(dropped, /*host_ms=*/3.0, /*kept=*/false);
  EXPECT_TRUE(again.off);
  EXPECT_EQ(next_timer_spin(again, 1.0, true).off, true) << "off stays off";
  // A kept sample after one drop clears the count.
  const auto recovered = next_timer_spin(dropped, /*host_ms=*/2.0, /*kept=*/true);
  EXPECT_EQ(recovered.drops_in_a_row, 0);
  EXPECT_DOUBLE_EQ(recovered.ms, 3.05);
  // Never over the cap: a slow host (a step that waits on the GPU) or a long drop.
  EXPECT_EQ(next_timer_spin(first, 500.0, true).ms, kMostSpinMs);
  EXPECT_EQ(next_timer_spin(first, 500.0, false).ms, kMostSpinMs);
  // A step that waits on the host drops every sample: the spins sum to at most two.
  TimerSpin spin;
  double spun = 0;
  for (int step = 0; step < 30 && !spin.off; ++step) {
    spun += spin.ms;
    spin = next_timer_spin(spin, /*host_ms=*/spin.ms + 30.0, /*kept=*/false);
  }
  EXPECT_TRUE(spin.off);
  EXPECT_DOUBLE_EQ(spun, kFirstSpinMs + kMostSpinMs);
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
  const auto times = timer.take_finished();
  ASSERT_EQ(times.ms.size(), 1u);
  EXPECT_GT(times.ms[0], 0.7 * expected) << "host-timed " << expected << " ms";
  EXPECT_LT(times.ms[0], 1.1 * expected) << "host-timed " << expected << " ms";
  EXPECT_EQ(times.dropped, 0);
  EXPECT_EQ(times.spin_ms, kFirstSpinMs);
  EXPECT_EQ(timer.all_ms(), times.ms);
}

// A step whose host is slow (8 ms between its kernels' launches, an eager step's pace): the
// first attempt's spin (2 ms) is too short and its sample is dropped; the next spin covers the
// host, and the GPU time then leaves the host's 8 ms out.
TEST(StepGpuTime, TheHostsPaceIsKeptOut) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t short_kernel = int64_t{1} << 16;  // ~33 us at 2 GHz
  sleep_ms(short_kernel);
  StepGpuTimer timer(kGpu0);
  const auto slow_step = [&] {
    timer.begin();
    at::cuda::sleep(short_kernel);
    std::this_thread::sleep_for(std::chrono::milliseconds(8));
    at::cuda::sleep(short_kernel);
    timer.end();
  };
  slow_step();
  torch::cuda::synchronize();
  const auto first = timer.take_finished();
  EXPECT_TRUE(first.ms.empty()) << "the 2 ms spin cannot cover an 8 ms host";
  EXPECT_EQ(first.dropped, 1);
  slow_step();
  torch::cuda::synchronize();
  const auto second = timer.take_finished();
  ASSERT_EQ(second.ms.size(), 1u);
  EXPECT_EQ(second.dropped, 0);
  EXPECT_LT(second.ms[0], 4.0) << "the host's 8 ms leaked into the GPU time";
  EXPECT_EQ(timer.samples(), 2);
  EXPECT_EQ(timer.dropped(), 1);
}

// A step that waits for the GPU inside it (as --on-nonfinite skip's host read does) can never
// be timed: every sample is dropped and counted, and after two spins the timer stops spinning
// instead of doubling towards its cap.
TEST(StepGpuTime, AStepThatWaitsOnTheHostIsDroppedWithoutLongSpins) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t short_kernel = int64_t{1} << 16;
  sleep_ms(short_kernel);
  StepGpuTimer timer(kGpu0);
  for (int step = 0; step < 6; ++step) {
    timer.begin();
    at::cuda::sleep(short_kernel);
    torch::cuda::synchronize();  // the step waits on the host
    at::cuda::sleep(short_kernel);
    timer.end();
  }
  torch::cuda::synchronize();
  const auto times = timer.take_finished();
  EXPECT_TRUE(times.ms.empty());
  EXPECT_EQ(times.dropped, 6);
  EXPECT_GE(times.spin_ms, kFirstSpinMs);
  EXPECT_LE(times.spin_ms, kFirstSpinMs + kMostSpinMs) << "more than two spins";
  EXPECT_EQ(timer.dropped(), 6);
}

#endif

}  // namespace
}  // namespace dptrain
