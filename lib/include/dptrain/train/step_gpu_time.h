// How long the GPU works on a training step, beside how long the step takes on the wall clock:
// CUDA events around a few sampled steps per epoch, read at the epoch's end, where the device is
// synchronised anyway. A GPU time close to the wall time means the GPU is the bound; one far
// below it means the host is (launches, waits), which decides whether the next speed-up is a
// fused kernel or fewer launches. Note [Timing the GPU alone] in step_gpu_time.cpp says how the
// host's own time is kept out of the measurement, what is dropped and what the spins cost. Not
// here: the wall time (rank.cpp's epoch seconds), which runs are timed (rank.cpp), or reporting
// either (report.h, metrics.h).
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

// The spin that holds the stream back before a timed step (Note [Timing the GPU alone]).
constexpr double kFirstSpinMs = 2.0;
// The longest spin: 1.5 times the ~5-10 ms an eager step of ~700 launches takes to queue, and
// short beside an epoch, so that spins never add more than a few tens of ms an epoch.
constexpr double kMostSpinMs = 20.0;
struct TimerSpin {
  double ms = kFirstSpinMs;  // the next timed step's spin
  int drops_in_a_row = 0;
  bool off = false;  // two drops in a row: no spin and no sample for the rest of the run
};

// The spin after a timed step whose host queueing took `host_ms` and whose sample was `kept`:
// 1.5 times host_ms (plus a little) after a kept sample; twice the longer of the last spin and
// host_ms after a first drop; off after a second drop in a row. Never over kMostSpinMs.
TimerSpin next_timer_spin(const TimerSpin& spin, double host_ms, bool kept);

// What an epoch's timed steps gave, once the device has finished them.
struct GpuTimes {
  std::vector<double> ms;  // the kept samples' GPU milliseconds
  int64_t dropped = 0;     // samples planned but not kept (the GPU began first, or the timer off)
  double spin_ms = 0;      // milliseconds of spin queued before the timed steps
};

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
  // of the steps timed since the last call whose measurement held the GPU's time alone (added
  // to all_ms()), how many planned samples were dropped and how long the spins were.
  GpuTimes take_finished();

  // Every measurement taken so far in this run, in order, and the samples planned and dropped.
  const std::vector<double>& all_ms() const { return all_ms_; }
  int64_t samples() const { return samples_; }
  int64_t dropped() const { return dropped_; }

 private:
  struct Events;
  std::unique_ptr<Events> events_;
  std::vector<double> all_ms_;
  int64_t samples_ = 0;  // begin() calls on an active timer
  int64_t dropped_ = 0;
};

}  // namespace dptrain
