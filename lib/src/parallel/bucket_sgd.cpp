// SGD with momentum and weight decay, and gradient clipping, on the reducer's buckets. See
// bucket_sgd.h.
#include "dptrain/parallel/bucket_sgd.h"

#include <c10/util/Optional.h>

#include <cmath>
#include <cstddef>
#include <sstream>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/parallel/reducer.h"

namespace dptrain {

void check_sgd_options(const SgdOptions& options) {
  const auto bad = [](const char* what, double value, const char* expected) {
    std::ostringstream message;
    message << "SGD: " << what << " " << value << " is out of range; expected " << expected;
    throw UsageError(message.str());
  };
  if (!std::isfinite(options.momentum) || options.momentum < 0 || options.momentum >= 1) {
    bad("momentum", options.momentum, "0 <= momentum < 1");
  }
  if (!std::isfinite(options.weight_decay) || options.weight_decay < 0) {
    bad("weight decay", options.weight_decay, "a finite number >= 0");
  }
  if (options.nesterov && options.momentum == 0) {
    throw UsageError("SGD: Nesterov momentum needs momentum > 0");
  }
}

BucketSgd::BucketSgd(const Reducer& reducer, SgdOptions options)
    : reducer_(reducer), options_(options) {
  check_sgd_options(options_);
  if (options_.weight_decay == 0 || !options_.weight_decay_skip_vectors) return;
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < reducer_.num_buckets(); ++b) {
    decay_masks_.push_back(torch::zeros_like(reducer_.parameter_bucket(b)));
  }
  for (size_t k = 0; k < reducer_.num_parameters(); ++k) {
    if (reducer_.parameter(k).dim() <= 1) continue;
    reducer_.slice_of(k, decay_masks_[reducer_.bucket_of(k)]).fill_(1);
  }
}

void BucketSgd::step(double lr) {
  torch::NoGradGuard no_grad;
  const bool first = options_.momentum != 0 && momentum_.empty();
  for (size_t b = 0; b < reducer_.num_buckets(); ++b) {
    const torch::Tensor& parameters = reducer_.parameter_bucket(b);
    torch::Tensor direction = reducer_.bucket(b);
    if (options_.weight_decay != 0) {
      direction = direction.add(decay_masks_.empty() ? parameters : parameters * decay_masks_[b],
                                options_.weight_decay);
    }
    if (options_.momentum != 0) {
      if (first) {
        momentum_.push_back(direction.clone());
      } else {
        momentum_[b].mul_(options_.momentum).add_(direction, /*alpha=1 - dampening=*/1.0);
      }
      direction = options_.nesterov ? direction.add(momentum_[b], options_.momentum) : momentum_[b];
    }
    parameters.add_(direction, -lr);
  }
}

torch::Tensor BucketSgd::momentum_buffer(size_t k) const {
  TORCH_CHECK(has_momentum(), "no momentum buffers before the first step with momentum");
  return reducer_.slice_of(k, momentum_[reducer_.bucket_of(k)]);
}

void BucketSgd::load_momentum(const std::vector<torch::Tensor>& buffers) {
  TORCH_CHECK(options_.momentum != 0, "momentum buffers given to SGD without momentum");
  TORCH_CHECK(buffers.size() == reducer_.num_parameters(), "momentum buffers: ", buffers.size(),
              " for ", reducer_.num_parameters(), " parameters");
  torch::NoGradGuard no_grad;
  if (momentum_.empty()) {
    for (size_t b = 0; b < reducer_.num_buckets(); ++b) {
      momentum_.push_back(torch::zeros_like(reducer_.parameter_bucket(b)));
    }
  }
  for (size_t k = 0; k < buffers.size(); ++k) momentum_buffer(k).copy_(buffers[k]);
}

torch::Tensor clip_gradient_norm(const Reducer& reducer, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;  // () each, in the parameters' order as clip_grad_norm_
  for (size_t k = 0; k < reducer.num_parameters(); ++k) {
    norms.push_back(reducer.slice_of(k, reducer.bucket(reducer.bucket_of(k))).norm(2));
  }
  const auto total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2);  // ()
  const auto scale = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);  // ()
  for (size_t b = 0; b < reducer.num_buckets(); ++b) reducer.bucket(b).mul_(scale);
  return total;
}

}  // namespace dptrain
