// The training run: one replica per device, each a rank of the same world; per step, every
// replica takes its shard of the global batch, the reducer all-reduces the gradients during
// backward, and every replica takes the same SGD step. Evaluation after every epoch.
// Not here: parsing flags (app/) or formatting output (report.h).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/data/data.h"
#include "dptrain/train/checked_world.h"
#include "dptrain/train/epoch_stats.h"
#include "dptrain/train/options.h"

namespace dptrain {

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

// Runs the whole training. Returns the first local replica's result; every rank's figures are
// the same, as they are all-reduced. Throws UsageError, DataError or CollectiveError.
TrainResult train(const FashionMnist& data, const CheckedWorld& run,
                  const TrainCallbacks& callbacks = {});

// Evaluates the given weights (checkpoint tensors, named as in the model) on the test set,
// sharded over the replicas of the world as after each training epoch, in a model of `width`
// (the file records it). Uses the threads, timeout, memory format and autocast of the options.
// `name` says where the weights came from in messages ("checkpoint PATH: has no tensor ...").
EvalResult evaluate_weights(const FashionMnist& data, const CheckedWorld& run,
                            const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                            int64_t width, const std::string& name = "in memory");

}  // namespace dptrain
