// How long the GPU works on a training step, beside how long the step takes on the wall clock:
// CUDA events around a few sampled steps per epoch, read at the epoch's end, where the device is
// synchronised anyway. A GPU time close to the wall time means the GPU is the bound; one far
// below it means the host is (launches, waits), which decides whether the next speed-up is a
// fused kernel or fewer launches. Note [Timing the GPU alone] in step_gpu_time.cpp says how the
// host's own time is kept out of the measurement. Not here: the wall time (rank.cpp's epoch
// seconds) or reporting either (report.h, metrics.h).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace dptrain {

// Steps timed per epoch: few, since each timed step holds its stream back for a moment.
constexpr int kGpuTimedStepsPerEpoch = 3;

// The steps of an epoch (0-based, ascending, distinct) whose GPU time is sampled: `samples`
// spread evenly over its first `full_batches` steps (the full batches; an epoch's last, smaller
// batch is not a typical step). Empty when full_batches < 1 or samples < 1.
std::vector<int64_t> gpu_timed_steps(int64_t full_batches, int samples);

// The median of `values`, NaN when empty.
double median_or_nan(std::vector<double> values);

// Times steps on one CUDA device; on any other device it is inactive and every call does
// nothing. Not thread-safe: one per rank, used by that rank's thread.
class StepGpuTimer {
 public:
  explicit StepGpuTimer(const torch::Device& device);
  ~StepGpuTimer();
  StepGpuTimer(const StepGpuTimer&) = delete;
  StepGpuTimer& operator=(const StepGpuTimer&) = delete;

  // Whether this timer can time steps (a CUDA device, in a build with CUDA).
  bool active() const;

  // Around one step: begin() on the host before the step's work is queued on the device's
  // current stream, end() after all of it is. Never inside a CUDA graph's capture.
  void begin();
  void end();

  // Once the device has finished every timed step (after a synchronize): the GPU milliseconds
  // of the steps timed since the last call whose measurement held the GPU's time alone; they
  // are added to all_ms(). Empty when none.
  std::vector<double> take_finished_ms();

  // Every measurement taken so far in this run, in order.
  const std::vector<double>& all_ms() const { return all_ms_; }

 private:
  struct Events;
  std::unique_ptr<Events> events_;
  std::vector<double> all_ms_;
};

}  // namespace dptrain
