// The residual blocks' projection shortcut: a 1x1 convolution with a stride, run on the CPU as a
// subsample followed by a unit-stride 1x1 convolution, because oneDNN's own strided 1x1 backward
// corrupts the heap (Note [The strided 1x1 convolution on the CPU]). Not here: the rest of the
// block (model.h).
#pragma once

#include <torch/nn/modules/conv.h>
#include <torch/types.h>

#include <cstdint>

namespace dptrain {

// x[:, :, ::stride, ::stride] in x's own memory layout, as a new dense tensor. Its backward
// scatters the gradient into one zero tensor of x's shape, in x's layout.
// x: (N, C, H, W) -> (N, C, ceil(H / stride), ceil(W / stride))
torch::Tensor subsample(const torch::Tensor& x, int64_t stride);

// conv(x) for a 1x1 convolution without padding, whatever its stride; on the CPU computed as
// conv's unit-stride convolution of subsample(x, stride), with the same weight and bias.
// x: (N, C_in, H, W) -> (N, C_out, ceil(H / stride), ceil(W / stride))
torch::Tensor project(torch::nn::Conv2dImpl& conv, const torch::Tensor& x);

}  // namespace dptrain
