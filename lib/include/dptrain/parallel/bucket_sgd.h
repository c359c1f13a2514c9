// SGD with momentum, Nesterov momentum and weight decay, and gradient-norm clipping, applied to a
// Reducer's flat buckets: one update per bucket, element for element torch::optim::SGD's and
// torch::nn::utils::clip_grad_norm_'s arithmetic. Not here: the learning rate's schedule
// (train/lr_schedule.h) or how the gradients got there (reducer.h).
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <vector>

#include "dptrain/parallel/reducer.h"

namespace dptrain {

// The defaults are the book's plain SGD: p -= lr * grad.
struct SgdOptions {
  double momentum = 0;      // 0: no momentum buffer at all
  bool nesterov = false;    // Nesterov's momentum (Sutskever et al. 2013); needs momentum > 0
  double weight_decay = 0;  // L2: weight_decay * p added to the gradient, as torch::optim::SGD
  // Parameters of at most one dimension (every bias, BatchNorm's weight and bias) get no weight
  // decay: the usual exclusion (Goyal et al. 2017, timm's filter_bias_and_bn).
  bool weight_decay_skip_vectors = false;
};

// A UsageError naming the first option out of range: momentum outside [0, 1), a negative or
// non-finite weight decay, Nesterov without momentum.
void check_sgd_options(const SgdOptions& options);

// Note [Fused SGD is torch::optim::SGD]
// torch::optim::SGD (dampening 0) takes, per parameter, d = g + wd * p; on the first step
// buf = d, then buf = momentum * buf + d; d = d + momentum * buf (Nesterov) or d = buf; and
// p -= lr * d. Every one of those is element-wise, so the same calls on a flat bucket give each
// element the same bits as on its parameter (tests/parallel/test_bucket_sgd.cpp holds them to
// torch::equal). The alignment gaps between parameters are zeros and stay zeros. A parameter
// excluded from weight decay sees g + wd * (p * 0) = g, exactly.
class BucketSgd {
 public:
  // The reducer (which owns the parameters' flat storage) must outlive this. Options out of
  // range are a UsageError (check_sgd_options).
  BucketSgd(const Reducer& reducer, SgdOptions options);

  // One update of every parameter from its reduced gradient (.grad, the bucket views).
  void step(double lr);

  const SgdOptions& options() const { return options_; }
  // Whether the momentum buffers exist: after the first step with momentum > 0.
  bool has_momentum() const { return !momentum_.empty(); }
  // Parameter k's momentum buffer, a view into its bucket's (the parameter's shape and strides).
  torch::Tensor momentum_buffer(size_t k) const;
  // A resume: every parameter's buffer, `buffers[k]` of parameter k's shape, copied in.
  void load_momentum(const std::vector<torch::Tensor>& buffers);

 private:
  const Reducer& reducer_;
  SgdOptions options_;
  std::vector<torch::Tensor> decay_masks_;  // per bucket, 1 where decayed; empty: decay all
  std::vector<torch::Tensor> momentum_;     // per bucket, laid out like it; empty before a step
};

// torch::nn::utils::clip_grad_norm_(parameters, max_norm) on the reduced gradients: the 2-norm of
// the parameters' gradient norms, then every gradient times min(1, max_norm / (norm + 1e-6)),
// computed on the device so that the host never waits. Returns the norm before clipping, ().
torch::Tensor clip_gradient_norm(const Reducer& reducer, double max_norm);

}  // namespace dptrain
