// The weights' exponential moving average. See weight_average.h.
#include "dptrain/train/weight_average.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dptrain {
namespace {

// Every parameter then every buffer, in the module's order.
std::vector<torch::Tensor> tensors_of(const torch::nn::Module& module) {
  auto tensors = module.parameters();
  for (const auto& b : module.buffers()) tensors.push_back(b);
  return tensors;
}

}  // namespace

double weight_average_decay(double decay, int64_t global_step) {
  const auto t = static_cast<double>(global_step);
  return std::min(decay, (1.0 + t) / (10.0 + t));
}

void update_weight_average(torch::nn::Module& averaged, const torch::nn::Module& weights,
                           double d) {
  torch::NoGradGuard no_grad;
  const auto to = tensors_of(averaged);
  const auto from = tensors_of(weights);
  TORCH_CHECK(to.size() == from.size(), "weight average: ", to.size(), " tensors for ",
              from.size());
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i].is_floating_point()) {
      to[i].lerp_(from[i], 1.0 - d);
    } else {
      to[i].copy_(from[i]);
    }
  }
}

void copy_weights(torch::nn::Module& to, const torch::nn::Module& from) {
  torch::NoGradGuard no_grad;
  const auto a = tensors_of(to);
  const auto b = tensors_of(from);
  TORCH_CHECK(a.size() == b.size(), "copy_weights: ", a.size(), " tensors for ", b.size());
  for (size_t i = 0; i < a.size(); ++i) a[i].copy_(b[i]);
}

}  // namespace dptrain
