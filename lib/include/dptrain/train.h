// The training run: one replica per device, each a rank of the same world; per step, every
// replica takes its shard of the global batch, the reducer all-reduces the gradients during
// backward, and every replica takes the same SGD step. Evaluation after every epoch.
// Not here: parsing flags (app/) or formatting output (report.h).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/data.h"
#include "dptrain/distributed.h"
#include "dptrain/reducer.h"
#include "dptrain/rendezvous.h"

namespace dptrain {

struct TrainOptions {
  int64_t epochs = 10;
  int64_t batch_size = 256;  // the global batch, split over all replicas
  double lr = 0.1;
  uint64_t seed = 0;    // initial weights and data order
  int64_t width = 64;   // ResNet base channel count
  int64_t threads = 0;  // intra-op CPU threads for the whole process; 0 = all cores
  Backend backend = Backend::kGloo;
  bool sync_bn = false;  // all-reduce BatchNorm batch statistics over replicas
  int64_t bucket_bytes = kDefaultBucketBytes;
  int64_t check_replicas_every = 0;  // verify bit-identical replicas every N steps; 0 = never
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Stop after this many steps in total (for tests and benchmarks); 0 = run every epoch fully.
  int64_t max_steps = 0;
  std::optional<std::string> save_model;  // rank 0 writes the final weights here (torch::save)
};

// Where this process stands: all replicas in this process (one thread per device), or one rank
// of a multi-process world launched by torchrun or Slurm.
struct WorldPlan {
  std::vector<torch::Device> local_devices;  // one replica per entry
  int first_rank = 0;                        // global rank of local_devices[0]
  int world_size = 1;
  bool multi_process = false;
  LaunchEnvironment launch;  // multi-process only: where the ranks meet
};

struct EpochStats {
  int64_t epoch = 0;  // 1-based
  int64_t epochs = 0;
  double train_loss = 0;  // mean cross-entropy over the epoch's training examples
  double train_acc = 0;
  double test_loss = 0;
  double test_acc = 0;
  double seconds = 0;  // training only, devices synchronised
  double images_per_second = 0;
  int64_t steps = 0;
};

struct TrainResult {
  std::vector<EpochStats> epochs;
  std::vector<std::string> devices;  // every rank's device, in rank order
  int world_size = 1;
  int64_t parameter_count = 0;
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

// Checks that `options` can run on `world` (batch size, backend against devices) without
// touching data or devices; throws UsageError. train() checks the same.
void check_world(const TrainOptions& options, const WorldPlan& world);

// Runs the whole training. Returns the first local replica's result; every rank's figures are
// the same, as they are all-reduced. Throws UsageError, DataError or CollectiveError.
TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const EpochCallback& on_epoch = nullptr, const StepCallback& on_step = nullptr);

}  // namespace dptrain
