// The training run: one replica per device, each a rank of the same world; per step, every
// replica takes its shard of the global batch, the reducer all-reduces the gradients during
// backward, and every replica takes the same SGD step. Evaluation after every epoch.
// Not here: parsing flags (app/), formatting output (report.h), the callbacks (callbacks.h).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/data/data.h"
#include "dptrain/train/callbacks.h"
#include "dptrain/train/checked_world.h"
#include "dptrain/train/epoch_stats.h"

namespace dptrain {

// Runs the whole training. Returns the first local replica's result; every rank's figures are
// the same, as they are all-reduced. Throws UsageError, DataError or CollectiveError.
TrainResult train(const FashionMnist& data, const CheckedWorld& run,
                  const TrainCallbacks& callbacks = {});

// Evaluates the given weights (checkpoint tensors, named as in the model) on the test set,
// sharded over the replicas of the world as after each training epoch, in a model of `width`
// (the file records it). Uses the threads, timeout, memory format and autocast of the options.
// `name` says where the weights came from in messages ("checkpoint PATH: has no tensor ...").
// `with_logits`: the result also holds every test image's logits (EvalResult::logits).
EvalResult evaluate_weights(const FashionMnist& data, const CheckedWorld& run,
                            const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                            int64_t width, const std::string& name = "in memory",
                            bool with_logits = false);

}  // namespace dptrain
