// Test helpers that need the train layer: training and evaluating as the driver does, and
// reading a saved model back. Includes the data and parallel helpers, which such tests use too.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dptrain/model/model.h"
#include "dptrain/train/checkpoint_types.h"
#include "dptrain/train/train.h"
#include "support/data_support.h"
#include "support/parallel_support.h"

namespace dptrain::testing {

// The tests' train() and evaluate_weights(): the world checked (check_world), then the run, as
// the driver does; on_step is the per-step callback, which makes the host wait every step.
TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const TrainCallbacks& callbacks);
TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const EpochCallback& on_epoch = nullptr, const StepCallback& on_step = nullptr);
EvalResult evaluate_weights(const FashionMnist& data, const TrainOptions& options,
                            const WorldPlan& world,
                            const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                            const std::string& name = "in memory");

// Loads a --save-model file (the checkpoint format) into `model`, which must have its width.
void load_model_file(ResNet& model, const std::string& path);

// The first bytes of a version 3 file of `checkpoint`'s run state whose one tensor, "huge",
// claims `data_bytes` bytes (a multiple of 8): truncate(2) the file to the returned size plus
// `data_bytes` for a sparse file as long as its header says, which no reader should read.
std::vector<uint8_t> header_claiming(Checkpoint checkpoint, uint64_t data_bytes);

// Runs the binary on `train_args` plus a --checkpoint-dir of its own and --log-every 1, sends
// `signal_number` once a step is logged, and expects a stop request's end: exit 128 + the
// signal, the line "dptrain: stopped by signal N; resume from DIR", and one checkpoint saved.
void expect_signal_stops_and_saves(int signal_number, std::vector<std::string> train_args);

}  // namespace dptrain::testing
