// Test helpers that need the train layer; see train_support.h.
#include "support/train_support.h"

#include "dptrain/train/checked_world.h"
#include "dptrain/train/checkpoint.h"

namespace dptrain::testing {

TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const TrainCallbacks& callbacks) {
  return dptrain::train(data, check_world(options, world), callbacks);
}

TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const EpochCallback& on_epoch, const StepCallback& on_step) {
  TrainCallbacks callbacks;
  callbacks.on_epoch = on_epoch;
  callbacks.on_step = on_step;
  return train(data, options, world, callbacks);
}

EvalResult evaluate_weights(const FashionMnist& data, const TrainOptions& options,
                            const WorldPlan& world,
                            const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                            const std::string& name) {
  return dptrain::evaluate_weights(data, check_world(options, world), weights, options.width,
                                   name);
}

void load_model_file(ResNet& model, const std::string& path) {
  load_model_tensors(*model, read_checkpoint(path, "--model").tensors, path);
}

}  // namespace dptrain::testing
