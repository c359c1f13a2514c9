// The figures a run produces: each epoch's (printed, recorded in metrics files, kept in
// checkpoints; epoch_figures.def lists them and says where each goes), the progress inside one,
// the whole run's and an evaluation's. Plain data, free of LibTorch: who computes them is
// train.h, who formats them is report.h and metrics.h.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace dptrain {

// Sums over a pass of data, over all ranks: cross-entropy, correct predictions, examples.
struct Totals {
  double loss_sum = 0;
  double correct = 0;
  double count = 0;
};

// What the sums mean: the mean loss and the accuracy (over at least one example), and the count.
struct Means {
  double loss = 0;
  double accuracy = 0;
  double count = 0;
};

inline Means means_of(const Totals& totals) {
  const double count = totals.count > 1.0 ? totals.count : 1.0;
  return {totals.loss_sum / count, totals.correct / count, totals.count};
}

// "No figure": a figure that could not be measured (written as a missing value, left out of
// TensorBoard).
constexpr double kNoFigure = std::numeric_limits<double>::quiet_NaN();

// The columns of epoch_figures.def that say where a figure goes; the enumerators are the
// table's own words.
enum class EpochFigureKept { since_v1, since_v3, not_kept };
enum class EpochFigureWritten { nowhere, metrics, metrics_tensorboard };

constexpr bool writes_metrics(EpochFigureWritten written) {
  return written != EpochFigureWritten::nowhere;
}
constexpr bool writes_tensorboard(EpochFigureWritten written) {
  return written == EpochFigureWritten::metrics_tensorboard;
}

// A row of epoch_figures.def, for code that walks the table rather than a struct.
struct EpochFigure {
  const char* name;
  const char* of;  // "stats", "derived" or "run"
  const char* type;
  const char* unit;
  EpochFigureKept kept;
  EpochFigureWritten written;
};

inline constexpr EpochFigure kEpochFigures[] = {
#define DPTRAIN_EPOCH_FIGURE(name, of, type, initial, unit, kept, written) \
  {#name, #of, #type, unit, EpochFigureKept::kept, EpochFigureWritten::written},
#include "dptrain/train/epoch_figures.def"
#undef DPTRAIN_EPOCH_FIGURE
};

// One epoch's figures as train measures them: the rows of epoch_figures.def whose `of` is
// stats, in its order, with its initial values. What they mean:
// - epoch (1-based) of epochs; the steps trained in it (a step skipped as non-finite counts);
// - the mean cross-entropy and the accuracy over the examples of the epoch's trained steps (a
//   step skipped as non-finite adds none), and those examples per training second: all three
//   NaN for an epoch in which no step trained, 0/0 being no figure (Note [An epoch without a
//   trained step] in rank.cpp); the test loss and accuracy; the validation set's
//   (FashionMnist::validation, evaluated as the test set), NaN without one;
// - seconds: training only, devices synchronised; eval_seconds: the epoch's evaluations, test
//   and validation, devices synchronised;
// - skipped_steps: of `steps`, those skipped with a non-finite gradient (--on-nonfinite skip) in
//   this run: a resumed epoch's steps before its checkpoint are not known (the epoch line shows
//   it);
// - gpu_ms_per_step: the median GPU milliseconds of the epoch's timed steps on the reporting
//   rank, from CUDA events (step_gpu_time.h); NaN on the CPU, or when no step could be timed;
// - gpu_samples_dropped, gpu_spin_ms: where the steps were timed, the epoch's samples dropped
//   (the GPU began the step before the host had queued it, or the timer was off after two drops
//   in a row) and the milliseconds of spin queued before the timed steps, which are inside
//   `seconds` when the GPU is the bound; NaN where nothing is timed (the CPU, several ranks,
//   --on-nonfinite skip, Gloo);
// - how well the epoch used the machine (model/flops.h): tflops, the model's training FLOPs for
//   the epoch's images over its training seconds, summed over all ranks; mfu, that figure over
//   the devices' summed peak (--peak-tflops, or the table for known GPUs), NaN where no peak is
//   known; peak_host_bytes, the process's peak resident set so far; peak_device_bytes, on CUDA
//   the caching allocator's peak bytes on the reporting rank's device (NaN on the CPU).
struct EpochStats {
#define DPTRAIN_EPOCH_FIGURE(name, of, type, initial, unit, kept, written) \
  DPTRAIN_EPOCH_STATS_MEMBER_##of(type, name, initial)
#define DPTRAIN_EPOCH_STATS_MEMBER_stats(type, name, initial) type name = initial;
#define DPTRAIN_EPOCH_STATS_MEMBER_derived(type, name, initial)
#define DPTRAIN_EPOCH_STATS_MEMBER_run(type, name, initial)
#include "dptrain/train/epoch_figures.def"
#undef DPTRAIN_EPOCH_STATS_MEMBER_run
#undef DPTRAIN_EPOCH_STATS_MEMBER_derived
#undef DPTRAIN_EPOCH_STATS_MEMBER_stats
#undef DPTRAIN_EPOCH_FIGURE
};

// The epoch's training milliseconds per step, the wall-clock pace set beside gpu_ms_per_step;
// NaN when no step is counted.
inline double wall_ms_per_step(const EpochStats& stats) {
  return stats.steps > 0 ? stats.seconds * 1000.0 / static_cast<double>(stats.steps)
                         : std::numeric_limits<double>::quiet_NaN();
}

// Where an epoch is, for a progress bar: read from this process's first replica every
// TrainOptions::progress_every steps (reading makes the host wait for the device).
struct ProgressStats {
  int64_t epoch = 0;  // 1-based
  int64_t epochs = 0;
  int64_t step = 0;  // steps done in this epoch
  int64_t steps_in_epoch = 0;
  int64_t images = 0;       // global examples trained on in this epoch so far
  double seconds = 0;       // since this epoch (or its resumed part) started
  double running_loss = 0;  // this replica's shard: mean loss and accuracy so far this epoch
  double running_acc = 0;
};

// What train() returns (train.h).
struct TrainResult {
  std::vector<EpochStats> epochs;    // every finished epoch, those before a resume included
  std::vector<std::string> devices;  // every rank's device, in rank order
  int world_size = 1;
  int64_t parameter_count = 0;
  std::optional<std::string> resumed_from;  // the checkpoint the run started from
  std::optional<std::string> last_checkpoint;
  int stopped_by = 0;               // the signal that stopped the run early, or 0
  // Steps this run took (a resumed run's earlier ones not counted): 0 for a resume with nothing
  // left to train, whose `epochs` are all the checkpoint's and none this run's measure.
  int64_t steps_run = 0;
  int64_t skipped_steps = 0;        // steps left out under NonFinite::kSkip
  int64_t graph_replays = 0;        // --cuda-graph: steps replayed from the CUDA graph, not eager
  std::vector<double> gpu_step_ms;  // every timed step's GPU milliseconds (the reporting rank)
  int64_t gpu_samples = 0;          // the steps sampled for timing, kept or dropped
  int64_t gpu_samples_dropped = 0;  // of them, those dropped (step_gpu_time.h)
  int64_t graph_nodes = -1;         // --cuda-graph: the captured step's nodes; -1 when not known
};

// What evaluate_weights() returns (train.h).
struct EvalResult {
  double test_loss = 0;
  double test_acc = 0;
  int64_t examples = 0;
  std::vector<std::string> devices;  // every rank's device, in rank order
  // Every test image's logits in test-set order, (examples, classes) row-major float32, when
  // evaluate_weights was asked for them; empty otherwise.
  std::vector<float> logits;
};

}  // namespace dptrain
