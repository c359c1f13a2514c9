// How a run speaks to its caller without printing: the step's figures and the callbacks the
// first replica of each process calls (after a step, a progress interval, an epoch, a checkpoint,
// at the start and for notices). Plain data and std::function, free of the run's code.
// Not here: the epoch's and the run's figures (epoch_stats.h) or the run itself (train.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/train/epoch_stats.h"

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

// The running training loss, every TrainOptions::loss_every global steps (--tensorboard-every):
// the mean cross-entropy over this replica's shard of the steps since the last report, or since
// the run's start. The steps add their loss on the device; only a report reads it, so the host
// waits for the device once per report, not once per step.
struct LossStats {
  int64_t epoch = 0;        // 1-based, the epoch of the reporting step
  int64_t global_step = 0;  // steps done in all, the reporting one included
  int64_t steps = 0;        // steps the mean covers (a skipped step counts, adds nothing)
  double loss = 0;
};
using LossCallback = std::function<void(const LossStats&)>;

struct TrainCallbacks {
  EpochCallback on_epoch;
  StepCallback on_step;
  ProgressCallback on_progress;
  LossCallback on_loss;  // called only where TrainOptions::loss_every > 0
  std::function<void(const std::string& path)> on_checkpoint;  // after each checkpoint written
  // Something the user should know that is no error: a checkpoint skipped by --resume and why,
  // the files --fresh removed. Called before the world is up, on the calling thread.
  std::function<void(const std::string& text)> on_notice;
  // Once the world is up, before the first step: every rank's device, and the epochs already
  // done and the global step the run starts after (from the checkpoint a resumed run starts at,
  // named by `resumed_from`; none and 0 otherwise).
  std::function<void(const std::vector<std::string>& devices, const std::vector<EpochStats>& done,
                     int64_t start_step, const std::optional<std::string>& resumed_from)>
      on_start;
};

}  // namespace dptrain
