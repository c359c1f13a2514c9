// Training-mode BatchNorm, an optional residual sum and a ReLU as one CPU operation with its own
// backward pass: relu(batch_norm(x) + shortcut). Not here: evaluation mode, synchronised
// statistics or CUDA, which keep LibTorch's own kernels (batch_norm.h decides which runs).
#pragma once

#include <torch/types.h>

namespace dptrain {

// Whether batch_norm_add_relu takes these inputs: float32, float64 or bf16 on the CPU, 4-D,
// dense in the contiguous or the channels-last layout, weight and bias of x's type (float32 for
// bf16 x, as autocast leaves the parameters), a shortcut (when defined) of x's shape and type,
// and more than one value per channel.
bool batch_norm_add_relu_applies(const torch::Tensor& x, const torch::Tensor& shortcut,
                                 const torch::Tensor& weight);

// relu(gamma * (x - mean) / sqrt(var + eps) + beta + shortcut) with the batch's mean and biased
// variance per channel, as torch::batch_norm in training mode followed by the sum and the ReLU;
// updates running_mean and running_var in place as that call does (running_var with the
// unbiased variance). Differentiable in x, shortcut, weight and bias; the result has x's layout.
// conv_bias, when defined, is the bias the convolution that made x added to it, and that
// convolution took it detached: its gradient, the sum of x's gradient over N, H and W, is
// summed here in float64 while x's gradient is written (Note [The convolution's bias gradient]).
// x: (N, C, H, W); shortcut: (N, C, H, W) or undefined; weight, bias, running_*, conv_bias: (C)
torch::Tensor batch_norm_add_relu(const torch::Tensor& x, const torch::Tensor& shortcut,
                                  const torch::Tensor& weight, const torch::Tensor& bias,
                                  torch::Tensor& running_mean, torch::Tensor& running_var,
                                  double momentum, double eps,
                                  const torch::Tensor& conv_bias = torch::Tensor());

}  // namespace dptrain
