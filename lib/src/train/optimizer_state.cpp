// The optimizer's state in checkpoints. See optimizer_state.h.
#include "optimizer_state.h"

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/model/model.h"
#include "dptrain/parallel/bucket_sgd.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_types.h"

namespace dptrain {
namespace {

// `prefix`'s part of a checkpoint's state, under the model's names; empty when it has none.
std::vector<std::pair<std::string, torch::Tensor>> state_part(const Checkpoint& checkpoint,
                                                              const std::string& prefix) {
  std::vector<std::pair<std::string, torch::Tensor>> part;
  for (const auto& [name, tensor] : checkpoint.state) {
    if (name.rfind(prefix, 0) == 0) part.emplace_back(name.substr(prefix.size()), tensor);
  }
  return part;
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> optimizer_state(const ResNet& model,
                                                                   const BucketSgd& sgd,
                                                                   const ResNet& averaged) {
  std::vector<std::pair<std::string, torch::Tensor>> state;
  if (sgd.has_momentum()) {
    size_t k = 0;
    for (const auto& item : model->named_parameters()) {
      state.emplace_back(kMomentumPrefix + item.key(),
                         sgd.momentum_buffer(k++).detach().to(torch::kCPU).contiguous().clone());
    }
  }
  if (averaged) {
    for (auto& [name, tensor] : model_tensors(*averaged)) {
      state.emplace_back(kAveragePrefix + name, std::move(tensor));
    }
  }
  return state;
}

void load_optimizer_state(const Checkpoint& start, const std::string& name, const ResNet& model,
                          BucketSgd& sgd, ResNet& averaged) {
  const auto momentum = state_part(start, kMomentumPrefix);
  if (!momentum.empty()) {
    if (sgd.options().momentum == 0) {
      throw DataError("checkpoint " + name + ": holds momentum buffers, and its recipe has none");
    }
    std::map<std::string, torch::Tensor> by_name(momentum.begin(), momentum.end());
    std::vector<torch::Tensor> buffers;
    for (const auto& item : model->named_parameters()) {
      const auto found = by_name.find(item.key());
      if (found == by_name.end()) {
        throw DataError("checkpoint " + name + ": has no tensor '" + kMomentumPrefix + item.key() +
                        "', the momentum buffer its recipe keeps");
      }
      buffers.push_back(found->second);
    }
    sgd.load_momentum(buffers);
  }
  if (averaged) load_model_tensors(*averaged, state_part(start, kAveragePrefix), name + " (ema.)");
}

}  // namespace dptrain
