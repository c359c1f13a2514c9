// CUDA events around sampled training steps. See step_gpu_time.h.
#include "dptrain/train/step_gpu_time.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

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

double median_or_nan(std::vector<double> values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
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
// is dropped and the next spin is longer. The spin lasts 1.5 times the host's queueing time of
// the last timed step (plus a little), so it stays short: ~1 ms for an eager bf16 step of the
// book's batch, microseconds' worth for a graph replay. Only kGpuTimedStepsPerEpoch steps an
// epoch are timed, and their events are read at the epoch's end, after the synchronize that the
// epoch's wall time needs anyway: no step waits for the host. Measured against: nothing yet, as
// no GPU has run it (docs/gpu-check.md); the GPU check sets it beside nvidia-smi's utilisation.

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
  double spin_ms = 2.0;  // the next timed step's spin
  std::chrono::steady_clock::time_point host_began;
  std::vector<std::unique_ptr<Sample>> pending;  // timed since the last take_finished_ms()
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
  const c10::cuda::CUDAGuard on_device(e.device);
  e.pending.push_back(std::make_unique<Events::Sample>());
  e.host_began = std::chrono::steady_clock::now();
  at::cuda::sleep(static_cast<int64_t>(e.spin_ms * e.cycles_per_ms));
  e.pending.back()->start.record(at::cuda::getCurrentCUDAStream(e.device));
}

void StepGpuTimer::end() {
  if (!events_ || events_->pending.empty()) return;
  auto& e = *events_;
  const c10::cuda::CUDAGuard on_device(e.device);
  auto& sample = *e.pending.back();
  sample.end.record(at::cuda::getCurrentCUDAStream(e.device));
  const double host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - e.host_began)
          .count();
  sample.gpu_alone = !sample.start.query();
  // Long enough for the host's pace next time; twice as long as this time's if it fell short.
  e.spin_ms = sample.gpu_alone ? 1.5 * host_ms + 0.05 : 2.0 * std::max(e.spin_ms, host_ms);
  e.spin_ms = std::min(e.spin_ms, 100.0);
}

std::vector<double> StepGpuTimer::take_finished_ms() {
  std::vector<double> ms;
  if (!events_) return ms;
  const c10::cuda::CUDAGuard on_device(events_->device);
  for (const auto& sample : events_->pending) {
    if (sample->gpu_alone && sample->end.query()) {
      ms.push_back(static_cast<double>(sample->start.elapsed_time(sample->end)));
    }
  }
  events_->pending.clear();
  all_ms_.insert(all_ms_.end(), ms.begin(), ms.end());
  return ms;
}

bool StepGpuTimer::active() const { return events_ != nullptr; }

#else  // no CUDA: an inactive timer

struct StepGpuTimer::Events {};

StepGpuTimer::StepGpuTimer(const torch::Device& /*device*/) {}
void StepGpuTimer::begin() {}
void StepGpuTimer::end() {}
std::vector<double> StepGpuTimer::take_finished_ms() { return {}; }
bool StepGpuTimer::active() const { return false; }

#endif

StepGpuTimer::~StepGpuTimer() = default;

}  // namespace dptrain
