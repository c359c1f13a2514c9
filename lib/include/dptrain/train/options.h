// What a training run is asked to do: the plain options the driver fills from flags and every
// layer of the run reads, and the one check of how they fit together that needs nothing else.
// Not here: checks against the world (checked_world.h) or the flags themselves (app/cli.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/model/autocast.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/parallel/bucket_size.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/train/recipe.h"

namespace dptrain {

// What to do with a step whose all-reduced gradient holds a NaN or an infinity.
enum class NonFinite {
  kStop,  // stop with an error naming the epoch and step; the last good checkpoint is kept
  kSkip,  // leave the weights and BatchNorm statistics as they were (every rank agrees)
};

struct TrainOptions {
  int64_t epochs = 10;
  int64_t batch_size = 256;  // the global batch, split over all replicas
  double lr = 0.1;           // the base rate; recipe.schedule gives each step's
  // Momentum, weight decay, the schedule, label smoothing, augmentation, clipping, the weights'
  // average: all the book's (none) by default (recipe.h).
  Recipe recipe;
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
  // The gradient of each convolution bias that feeds a BatchNorm from the fused BatchNorm's
  // backward, where that runs (ResNetOptions::fused_conv_bias_grad); changes that gradient by
  // float rounding, so opt-in.
  bool fused_conv_bias_grad = false;
  // One device's dense peak in TFLOP/s at the run's precision (--peak-tflops), the denominator of
  // EpochStats::mfu; unset takes NVIDIA's figure for known GPUs and claims none on CPUs
  // (model/numerics.h).
  std::optional<double> peak_tflops;
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
  int64_t loss_every = 0;      // global steps between running-loss callbacks (on_loss); 0 = none
};

// Checks that --resume and --fresh come with a checkpoint directory and not together;
// throws UsageError. Its one caller is check_world (checked_world.h), which the driver runs before
// the data load, so that a mistake costs none.
void check_checkpoint_options(const TrainOptions& options);

}  // namespace dptrain
