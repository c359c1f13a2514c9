// BatchNorm2d with the same parameters, buffers and numerics as torch::nn::BatchNorm2d, plus an
// optional synchronised mode: batch statistics (and their gradients) summed over all replicas, so
// that N replicas normalise exactly as one replica would on the whole global batch.
// Not here: how the sums travel between replicas (Communicator, distributed.h).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "dptrain/parallel/data_parallel.h"
#include "dptrain/parallel/distributed.h"

namespace dptrain {

struct BatchNormOptions {
  int64_t num_features = 0;
  double eps = 1e-5;      // PyTorch's default, as in the book
  double momentum = 0.1;  // weight of the newest batch in the running statistics
  // Training-mode forward_add_relu on the CPU as one fused operation (fused_batch_norm.h);
  // false keeps LibTorch's separate kernels everywhere.
  bool fused = true;
};

class BatchNormImpl : public torch::nn::Module, public SynchronisedAcrossReplicas {
 public:
  explicit BatchNormImpl(const BatchNormOptions& options);
  explicit BatchNormImpl(int64_t num_features, bool fused = true)
      : BatchNormImpl(BatchNormOptions{num_features, 1e-5, 0.1, fused}) {}

  // x: (N, C, H, W) -> (N, C, H, W)
  torch::Tensor forward(const torch::Tensor& x);

  // relu(forward(x) + shortcut), or relu(forward(x)) with an undefined shortcut. In training
  // mode on the CPU, per replica, with x channels-last: one fused operation (Note [Fusing
  // BatchNorm, the shortcut and the ReLU]); elsewhere those three steps, the sum and the ReLU in
  // place.
  // conv_bias, only where fuses(x, shortcut): the bias of the convolution that made x, which
  // that convolution took detached; its gradient then comes from the fused backward
  // (batch_norm_add_relu, fused_batch_norm.h).
  // x, shortcut: (N, C, H, W) -> (N, C, H, W); conv_bias: (C) or undefined
  torch::Tensor forward_add_relu(const torch::Tensor& x, const torch::Tensor& shortcut,
                                 const torch::Tensor& conv_bias = torch::Tensor());

  // Whether forward_add_relu(x, shortcut) runs the fused operation; may_fuse(): whether it would
  // for some x (fused, training, per replica), asked before x exists.
  bool fuses(const torch::Tensor& x, const torch::Tensor& shortcut) const;
  bool may_fuse() const;

  // With a communicator of several ranks, training-mode statistics are summed over them. The
  // communicator must outlive the module; nullptr returns to per-replica statistics.
  // DataParallel with sync_batch_norm calls it.
  void set_sync(Communicator* communicator) override { sync_ = communicator; }

  void reset_parameters();  // gamma 1, beta 0, running mean 0, running var 1, counter 0

  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  torch::Tensor forward_synchronised(const torch::Tensor& x);

  BatchNormOptions options_;
  Communicator* sync_ = nullptr;
};
TORCH_MODULE(BatchNorm);

// Applies set_sync to every BatchNorm inside `model`.
void set_batch_norm_sync(torch::nn::Module& model, Communicator* communicator);

}  // namespace dptrain
