// The training run: one replica per device, each a rank of the same world; per step, every
// replica takes its shard of the global batch, the reducer all-reduces the gradients during
// backward, and every replica takes the same SGD step. Evaluation after every epoch.
// Not here: parsing flags (app/) or formatting output (report.h).
#pragma once

#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/data/data.h"
#include "dptrain/errors.h"
#include "dptrain/model/autocast.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/reducer.h"
#include "dptrain/parallel/rendezvous.h"
#include "dptrain/parallel/world_plan.h"
#include "dptrain/train/epoch_stats.h"

namespace dptrain {

// What to do with a step whose all-reduced gradient holds a NaN or an infinity.
enum class NonFinite {
  kStop,  // stop with an error naming the epoch and step; the last good checkpoint is kept
  kSkip,  // leave the weights and BatchNorm statistics as they were (every rank agrees)
};

struct TrainOptions {
  int64_t epochs = 10;
  int64_t batch_size = 256;  // the global batch, split over all replicas
  double lr = 0.1;
  uint64_t seed = 0;    // initial weights and data order
  int64_t width = 64;   // ResNet base channel count
  int64_t threads = 0;  // intra-op CPU threads for the whole process; 0 = default_intra_op_threads
  Backend backend = Backend::kGloo;
  // A world of one still creates its process group, so that the backend really runs (the CLI
  // sets it when --backend is given); otherwise one replica communicates with nobody.
  bool process_group_for_one = false;
  bool sync_bn = false;  // all-reduce BatchNorm batch statistics over replicas
  // The fast path. The layout and cuDNN's benchmark mode change results by float rounding
  // only, so they are on by default where they are safe; bfloat16 autocast changes them more and
  // is opt-in. kAuto: channels-last on CUDA and where oneDNN runs AVX-512, else contiguous
  // (memory_format.h).
  MemoryFormat memory_format = MemoryFormat::kAuto;
  bool cudnn_benchmark = true;  // let cuDNN time its algorithms for each shape (CUDA only)
  Amp amp = Amp::kOff;          // autocast the forward pass
  // Capture each full batch's whole step in one CUDA graph after a few eager steps, and replay
  // it (cuda_graph_step.h): one GPU per process, NCCL or none; refused elsewhere (check_world).
  bool cuda_graph = false;
  int64_t bucket_bytes = kDefaultBucketBytes;
  int64_t check_replicas_every = 0;  // verify bit-identical replicas every N steps; 0 = never
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Stop after this many steps in total (for tests and benchmarks); 0 = run every epoch fully.
  int64_t max_steps = 0;
  // Rank 0 writes the final weights here, in the checkpoint format (checkpoint.h).
  std::optional<std::string> save_model;
  // The flags of the files the driver writes on rank 0 (e.g. "--metrics", "--plot"): compared
  // across the ranks like the other settings, so that one given to another rank alone is named.
  std::vector<std::string> driver_outputs;

  // Checkpoints (checkpoint.h): rank 0 writes one into this directory every `checkpoint_every`
  // epochs, after the last epoch, when a stop is requested, and, if `checkpoint_every_steps` is
  // not 0, inside an epoch after every that many steps in all (global steps).
  std::optional<std::string> checkpoint_dir;
  int64_t checkpoint_every = 1;
  int64_t checkpoint_every_steps = 0;
  // Start from the checkpoint at the latest position in checkpoint_dir, if any (an empty or
  // missing directory starts from the beginning). A checkpoint file that cannot be read is
  // named and left alone: with no readable one, or with one this run would later write over,
  // the run is refused (UsageError) unless `fresh`.
  bool resume = false;
  // Start from the beginning in a checkpoint_dir that already holds checkpoints, removing them
  // first. Without it (and without `resume`) such a directory is refused: its checkpoints would
  // be overwritten.
  bool fresh = false;
  // Set to a signal number (by a signal handler) to stop: the ranks agree on it at the next
  // step boundary, write a checkpoint, and train() returns with TrainResult::stopped_by set.
  const std::atomic<int>* stop_signal = nullptr;
  NonFinite on_nonfinite = NonFinite::kStop;
  int64_t progress_every = 0;  // steps between progress callbacks; 0 = none
};

struct StepStats {
  int64_t epoch = 0;  // 1-based
  int64_t step = 0;   // 1-based, within the epoch
  int64_t steps_in_epoch = 0;
  double shard_loss = 0;  // mean cross-entropy over this rank's shard of the global batch
};

// Called after each epoch, by the first replica of each process (so by global rank 0 for
// replicas in threads, and by every rank under a launcher).
using EpochCallback = std::function<void(const EpochStats&)>;
// Called after each step, by the same replica as the EpochCallback. Reading the loss makes the host
// wait for the device, so leave it null where speed matters.
using StepCallback = std::function<void(const StepStats&)>;

using ProgressCallback = std::function<void(const ProgressStats&)>;

struct TrainCallbacks {
  EpochCallback on_epoch;
  StepCallback on_step;
  ProgressCallback on_progress;
  std::function<void(const std::string& path)> on_checkpoint;  // after each checkpoint written
  // Something the user should know that is no error: a checkpoint skipped by --resume and why,
  // the files --fresh removed. Called before the world is up, on the calling thread.
  std::function<void(const std::string& text)> on_notice;
  // Once the world is up, before the first step: every rank's device, and the epochs already
  // done (from the checkpoint a resumed run starts at, named by `resumed_from`).
  std::function<void(const std::vector<std::string>& devices, const std::vector<EpochStats>& done,
                     const std::optional<std::string>& resumed_from)>
      on_start;
};

// Checks that `options` can run on `world` (batch size, backend against devices) without
// touching data or devices; throws UsageError. train() checks the same.
void check_world(const TrainOptions& options, const WorldPlan& world);

// Checks that --resume and --fresh come with a checkpoint directory and not together;
// throws UsageError. train() checks the same. Inline: the command-line parser calls it too, and
// is built (and fuzzed) without the training code.
inline void check_checkpoint_options(const TrainOptions& options) {
  if (options.resume && !options.checkpoint_dir) {
    throw UsageError("--resume needs --checkpoint-dir, where the checkpoints are");
  }
  if (options.fresh && !options.checkpoint_dir) {
    throw UsageError("--fresh needs --checkpoint-dir, whose checkpoints it removes");
  }
  if (options.checkpoint_every_steps > 0 && !options.checkpoint_dir) {
    throw UsageError("--checkpoint-every-steps needs --checkpoint-dir, where the checkpoints go");
  }
  if (options.fresh && options.resume) {
    throw UsageError("--fresh and --resume exclude each other: start over, or continue");
  }
}

// Checks the placements every rank learns at the rendezvous (gather_placements) against the
// backend: NCCL refuses two ranks on one GPU ("Duplicate GPU detected" deep inside its first
// collective), so that is a UsageError here naming both ranks, the host and the device.
void check_placements(const std::vector<RankPlacement>& placements, Backend backend);

// Runs the whole training. Returns the first local replica's result; every rank's figures are
// the same, as they are all-reduced. Throws UsageError, DataError or CollectiveError.
TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const TrainCallbacks& callbacks);
TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const EpochCallback& on_epoch = nullptr, const StepCallback& on_step = nullptr);

// Throws UsageError unless OMP_NUM_THREADS (`value`; null or empty: unset) is a whole number
// from 1 to `most_threads` (the usable cores, or the local replicas where more), as --threads
// must be. check_world runs it.
void check_omp_num_threads(const char* value, int cores, int64_t most_threads);

// The intra-op threads of this process: --threads, else OMP_NUM_THREADS, else the physical cores.
int intra_op_thread_count(const TrainOptions& options);
// Sets them now, before the first parallel region (the data load) sizes LibTorch's OpenMP pool
// from the environment. After check_world.
void start_intra_op_threads(const TrainOptions& options);

// Evaluates the given weights (checkpoint tensors, named as in the model) on the test set,
// sharded over the replicas of `world` as after each training epoch. Uses the width, threads,
// timeout, memory format and autocast of `options`. `name` says where the weights came from in
// messages ("checkpoint PATH: has no tensor ...").
EvalResult evaluate_weights(const FashionMnist& data, const TrainOptions& options,
                            const WorldPlan& world,
                            const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                            const std::string& name = "in memory");

}  // namespace dptrain
