// One rank of a world: its plan (where it runs, how it meets the others, where it starts) and
// its two jobs, training and evaluating saved weights. train.cpp starts the ranks, a thread each
// where a process has several, and they meet through the plan's store.
// Not here: how the world is planned (world_plan.h), checked (checked_world.h), joined
// (joined_world.h) or started (train.cpp). Internal to lib/src/train/.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "dptrain/data/data.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/parallel/joined_world.h"
#include "dptrain/train/callbacks.h"
#include "dptrain/train/checkpoint_types.h"
#include "dptrain/train/epoch_stats.h"
#include "dptrain/train/options.h"

namespace dptrain {

// Everything one rank needs to know to run.
struct RankPlan {
  int rank = 0;
  int world_size = 1;
  torch::Device device{torch::kCPU};
  // The layout of its replica: the options' choice resolved for `device` (run_world), never kAuto.
  MemoryFormat memory_format = MemoryFormat::kContiguous;
  int threads = 1;
  c10::intrusive_ptr<c10d::Store> store;  // null for a world of one
  bool loopback = true;
  bool first_local = true;            // the first replica of this process: it calls the callbacks
  const Checkpoint* start = nullptr;  // the checkpoint a resumed training starts from
  std::string start_name;             // where `start` came from, for messages
  // The replica's width: --width when training, the file's when evaluating its weights; and for
  // the memory messages, that file ("the weights of F"), or empty when --width set it.
  int64_t width = 0;
  std::string width_from;
  // The weights to begin with instead of the seed's (a checkpoint's, or those to evaluate).
  const std::vector<std::pair<std::string, torch::Tensor>>* weights = nullptr;
  LocalReplicas* local = nullptr;  // this process's replicas, when there are several
  std::string settings;            // settings_text of what every rank must agree on
  std::string train_digest;        // dataset_digest of the training set, for checkpoints
  bool collect_logits = false;     // evaluate_rank: also return every test image's logits
};

// The training of one rank (rank.cpp); every rank's figures are the same, as they are
// all-reduced.
TrainResult run_rank(const FashionMnist& data, const TrainOptions& options, const RankPlan& plan,
                     const TrainCallbacks& callbacks);

// One rank's evaluation of `plan.weights` on its shard of the test set.
EvalResult evaluate_rank(const FashionMnist& data, const TrainOptions& options,
                         const RankPlan& plan);

}  // namespace dptrain
