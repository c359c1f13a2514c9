// The exponential moving average of a model's weights (--ema): a second model whose parameters
// and floating-point buffers follow the trained one's after every step, evaluated and saved in
// its place. Not here: when it is updated, evaluated or checkpointed (rank.cpp).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>

namespace dptrain {

// Note [The averaged weights' decay]
// After global step t (0-based), averaged = d * averaged + (1 - d) * weights, computed as
// averaged.lerp_(weights, 1 - d) (PyTorch's own EMA, torch.optim.swa_utils'
// get_ema_multi_avg_fn, does the same), with d = min(decay, (1 + t) / (10 + t)): the warm-up of
// TensorFlow's ExponentialMovingAverage and timm's ModelEmaV3, so that the average of a short run
// does not hold on to the random initial weights (at decay 0.999, 0.999^2000 = 0.14 of them
// would remain after 2,000 steps). t is the global step, so a resumed run continues with the
// same d. Integer buffers (BatchNorm's num_batches_tracked) are copied.
double weight_average_decay(double decay, int64_t global_step);

// One update of `averaged` towards `weights` (the same architecture, parameters and buffers in
// the same order) at decay `d`.
void update_weight_average(torch::nn::Module& averaged, const torch::nn::Module& weights, double d);

// Copies every parameter and buffer of `from` into `to` (the same architecture).
void copy_weights(torch::nn::Module& to, const torch::nn::Module& from);

}  // namespace dptrain
