// CUDA events around sampled training steps. See step_gpu_time.h.
#include "dptrain/train/step_gpu_time.h"

#include <algorithm>
#include <chrono>  // IWYU pragma: keep (the CUDA branch)
#include <cmath>
#include <cstdint>
#include <utility>  // IWYU pragma: keep (the CUDA branch)
#include <vector>

#if defined(DPTRAIN_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include "cuda_event.h"
#endif

namespace dptrain {

std::vector<int64_t> gpu_timed_steps(int64_t full_batches, int samples) {
  std::vector<int64_t> steps;
  if (full_batches < 1 || samples < 1) return steps;
  // The k-th of `samples` points that cut the epoch into samples + 1 equal parts.
  for (int k = 1; k <= samples; ++k) {
    const int64_t step = full_batches * k / (samples + 1);
    if (steps.empty() || steps.back() != step) steps.push_back(step);
  }
  return steps;
}

// Note [Timing the GPU alone]
// Two events on the step's stream, one before its work and one after, measure the time between
// them on the GPU's clock; but the GPU starts the step's first kernel as soon as it is queued,
// and when the host queues kernels more slowly than the GPU runs them (an eager step is ~700
// launches) the GPU waits for the host between kernels, and that wait would be counted as GPU
// time. So a timed step first queues a spinning kernel (at::cuda::sleep) that holds the stream
// back, then the start event, then the step: while the GPU spins, the host queues the whole
// step, and the GPU then runs it back to back. Whether that held is known without waiting: if
// the start event has not completed when the host has queued the step's last work, the GPU had
// not begun the step, so nothing of the host's pace is in the measurement. If it had, the sample
// is dropped and counted, and the next spin is twice as long, once: a second drop in a row
// turns the timer off for the run (next_timer_spin), since then the step itself waits on the
// host (the GPU drains while the host waits), or queues more launches than CUDA holds pending
// (~1,000), and no spin can help; a longer one would only lengthen the epoch. The runs that wait
// on the host by design (--on-nonfinite skip, Gloo's collectives) and those of several ranks,
// where one rank's wait for a peer's all-reduce would count as GPU time, are not timed at all
// (rank.cpp). The spin lasts 1.5 times the host's queueing time of the last timed step (plus a
// little), at most kMostSpinMs, so it stays short: ~1 ms for an eager bf16 step of the book's
// batch, microseconds' worth for a graph replay. The spins are GPU time inside the epoch's
// seconds when the GPU is the bound: their sum is reported beside them (gpu_spin_ms). Only
// kGpuTimedStepsPerEpoch steps an epoch are timed, and their events are read at the epoch's end,
// after the synchronize that the epoch's wall time needs anyway: no step waits for the host.
// How its figures compare with nvidia-smi's utilisation is the GPU check's to show
// (docs/gpu-check.md, "GPU time against wall time").

TimerSpin next_timer_spin(const TimerSpin& spin, double host_ms, bool kept) {
  TimerSpin next = spin;
  if (spin.off) return next;
  if (kept) {
    next.ms = 1.5 * host_ms + 0.05;  // long enough for the host's pace next time
    next.drops_in_a_row = 0;
  } else if (spin.drops_in_a_row == 0) {
    next.ms = 2.0 * std::max(spin.ms, host_ms);
    next.drops_in_a_row = 1;
  } else {
    next.off = true;
    next.drops_in_a_row = spin.drops_in_a_row + 1;
  }
  next.ms = std::min(next.ms, kMostSpinMs);
  return next;
}

#if defined(DPTRAIN_WITH_CUDA)

namespace {

// The SM clock in cycles per millisecond (the attribute is in kHz), for at::cuda::sleep.
double cycles_per_ms(int device) {
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device) != cudaSuccess || khz <= 0) {
    (void)cudaGetLastError();  // the failed query's error, which the next CUDA call would report
    return 2.0e6;  // 2 GHz: a wrong guess only lengthens the spin (Note [Timing the GPU alone])
  }
  return static_cast<double>(khz);
}

}  // namespace

struct StepGpuTimer::Events {
  struct Sample {
    CudaEvent start{cudaEventDefault};  // cudaEventDefault: with timing
    CudaEvent end{cudaEventDefault};
    bool gpu_alone = false;  // the GPU had not begun the step when the host had queued it all
  };
  explicit Events(int device) : device(device), cycles_per_ms(dptrain::cycles_per_ms(device)) {}

  int device;
  double cycles_per_ms;
  TimerSpin spin;  // the next timed step's spin, or off
  std::chrono::steady_clock::time_point host_began;
  std::vector<std::unique_ptr<Sample>> pending;  // timed since the last take_finished()
  int64_t skipped = 0;  // planned samples not taken since then: the timer was off
  double spun_ms = 0;   // spin queued since then
};

StepGpuTimer::StepGpuTimer(const torch::Device& device) {
  if (device.is_cuda()) {
    const int index = device.has_index() ? device.index() : c10::cuda::current_device();
    const c10::cuda::CUDAGuard on_device(index);
    events_ = std::make_unique<Events>(index);
  }
}

void StepGpuTimer::begin() {
  if (!events_) return;
  auto& e = *events_;
  ++samples_;
  if (e.spin.off) {
    ++e.skipped;
    return;
  }
  const c10::cuda::CUDAGuard on_device(e.device);
  e.pending.push_back(std::make_unique<Events::Sample>());
  e.host_began = std::chrono::steady_clock::now();
  at::cuda::sleep(static_cast<int64_t>(e.spin.ms * e.cycles_per_ms));
  e.spun_ms += e.spin.ms;
  e.pending.back()->start.record(at::cuda::getCurrentCUDAStream(e.device));
}

void StepGpuTimer::end() {
  if (!events_ || events_->pending.empty() || events_->spin.off) return;
  auto& e = *events_;
  const c10::cuda::CUDAGuard on_device(e.device);
  auto& sample = *e.pending.back();
  sample.end.record(at::cuda::getCurrentCUDAStream(e.device));
  const double host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - e.host_began)
          .count();
  sample.gpu_alone = !sample.start.query();
  e.spin = next_timer_spin(e.spin, host_ms, sample.gpu_alone);
}

GpuTimes StepGpuTimer::take_finished() {
  GpuTimes times;
  if (!events_) return times;
  auto& e = *events_;
  const c10::cuda::CUDAGuard on_device(e.device);
  for (const auto& sample : e.pending) {
    if (sample->gpu_alone && sample->end.query()) {
      times.ms.push_back(static_cast<double>(sample->start.elapsed_time(sample->end)));
    } else {
      ++times.dropped;
    }
  }
  times.dropped += e.skipped;
  times.spin_ms = e.spun_ms;
  e.pending.clear();
  e.skipped = 0;
  e.spun_ms = 0;
  dropped_ += times.dropped;
  all_ms_.insert(all_ms_.end(), times.ms.begin(), times.ms.end());
  return times;
}

bool StepGpuTimer::active() const { return events_ != nullptr; }

#else  // no CUDA: an inactive timer

struct StepGpuTimer::Events {};

StepGpuTimer::StepGpuTimer(const torch::Device& /*device*/) {}
void StepGpuTimer::begin() {}
void StepGpuTimer::end() {}
GpuTimes StepGpuTimer::take_finished() { return {}; }
bool StepGpuTimer::active() const { return false; }

#endif

StepGpuTimer::~StepGpuTimer() = default;

}  // namespace dptrain
