// BatchNorm2d, per replica or synchronised over replicas. See batch_norm.h.
#include "dptrain/model/batch_norm.h"

#include <torch/autograd.h>
#include <torch/nn/init.h>

#include <cstdint>

#include "dptrain/model/fused_batch_norm.h"
#include "dptrain/parallel/distributed.h"

namespace dptrain {
namespace {

// Note [Synchronised BatchNorm]
// Each replica sums x and x^2 per channel over its shard and the sums are all-reduced, which
// gives the global mean and variance. The all-reduce is an autograd function whose backward is
// again an all-reduce of the incoming gradients: every replica's loss depends on the global sums,
// so the gradient with respect to one replica's local sums is the sum over replicas. Everything
// else is ordinary differentiable tensor code, so autograd derives the rest of the backward pass.
// With a world of one the same formulas run, which is what makes N replicas match one replica
// on the whole global batch up to float rounding.
class AllReduceSum : public torch::autograd::Function<AllReduceSum> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               int64_t communicator_address) {
    ctx->saved_data["communicator"] = communicator_address;
    auto output = input.clone();
    as_communicator(communicator_address)->allreduce_sum(output, "sync-bn statistics");
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto grad = grad_outputs[0].contiguous().clone();
    as_communicator(ctx->saved_data["communicator"].toInt())
        ->allreduce_sum(grad, "sync-bn statistics gradient");
    return {grad, torch::Tensor()};
  }

 private:
  static Communicator* as_communicator(int64_t address) {
    return reinterpret_cast<Communicator*>(static_cast<intptr_t>(address));
  }
};

}  // namespace

BatchNormImpl::BatchNormImpl(const BatchNormOptions& options) : options_(options) {
  TORCH_CHECK(options.num_features > 0, "BatchNorm needs a positive number of features");
  const int64_t c = options.num_features;
  weight = register_parameter("weight", torch::ones({c}));
  bias = register_parameter("bias", torch::zeros({c}));
  running_mean = register_buffer("running_mean", torch::zeros({c}));
  running_var = register_buffer("running_var", torch::ones({c}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
}

void BatchNormImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  weight.fill_(1);
  bias.zero_();
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

torch::Tensor BatchNormImpl::forward(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 4, "BatchNorm expects (N, C, H, W), got ", x.sizes());
  if (!is_training()) {
    return torch::batch_norm(x, weight, bias, running_mean, running_var, /*training=*/false,
                             options_.momentum, options_.eps, /*cudnn_enabled=*/true);
  }
  {
    torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  if (sync_ != nullptr) return forward_synchronised(x);
  // The same call torch::nn::BatchNorm2d makes, so the numerics are PyTorch's own.
  return torch::batch_norm(x, weight, bias, running_mean, running_var, /*training=*/true,
                           options_.momentum, options_.eps, /*cudnn_enabled=*/true);
}

bool BatchNormImpl::may_fuse() const {
  return options_.fused && is_training() && sync_ == nullptr;
}

bool BatchNormImpl::fuses(const torch::Tensor& x, const torch::Tensor& shortcut) const {
  // Fused only in the channels-last layout, where it is faster than LibTorch's kernels at the
  // book's shapes on LibTorch 1.13 and 2.11; contiguous, its per-plane loops are not vectorised
  // and are slower than LibTorch's (bench/results/2026-12-01-cpu-fused-batch-norm.md).
  return may_fuse() && x.defined() && x.is_contiguous(at::MemoryFormat::ChannelsLast) &&
         batch_norm_add_relu_applies(x, shortcut, weight);
}

torch::Tensor BatchNormImpl::forward_add_relu(const torch::Tensor& x, const torch::Tensor& shortcut,
                                              const torch::Tensor& conv_bias) {
  const bool fused = fuses(x, shortcut);
  TORCH_CHECK(fused || !conv_bias.defined(),
              "BatchNorm::forward_add_relu takes a conv_bias only where it fuses");
  if (fused) {
    {
      torch::NoGradGuard no_grad;
      num_batches_tracked.add_(1);
    }
    return batch_norm_add_relu(x, shortcut, weight, bias, running_mean, running_var,
                               options_.momentum, options_.eps, conv_bias);
  }
  // In place: BatchNorm's backward needs its input, not its output.
  auto y = forward(x);
  if (shortcut.defined()) y += shortcut;
  return y.relu_();
}

torch::Tensor BatchNormImpl::forward_synchronised(const torch::Tensor& x) {
  const int64_t c = options_.num_features;
  // The statistics are summed in float64: var = E[x^2] - mean^2 cancels catastrophically in
  // float32 when a channel's mean is large against its spread, which the book's small initial
  // weights produce in the stem, and then N replicas' regrouped float32 sums would no longer
  // match one replica's. The normalisation itself runs in the input's precision.
  const auto xd = x.to(torch::kFloat64);  // (N, C, H, W)
  const auto local_count = static_cast<double>(x.numel() / c);
  // (2C + 1): per-channel sums of x and x^2, and the element count, summed over all replicas.
  auto stats = torch::cat(
      {xd.sum({0, 2, 3}), (xd * xd).sum({0, 2, 3}), torch::full({1}, local_count, xd.options())});
  stats = AllReduceSum::apply(stats, static_cast<int64_t>(reinterpret_cast<intptr_t>(sync_)));
  // The count stays a tensor: reading it on the host would make every layer wait for the
  // device. It is at least 16 (the global batch times a 4x4 map, at the smallest), so the
  // unbiased correction count / (count - 1) is always defined.
  const auto count = stats.narrow(0, 2 * c, 1).detach();                  // (1)
  auto mean = stats.narrow(0, 0, c) / count;                              // (C)
  auto var = (stats.narrow(0, c, c) / count - mean * mean).clamp_min(0);  // (C), biased
  {
    torch::NoGradGuard no_grad;
    const double m = options_.momentum;
    running_mean.mul_(1 - m).add_(mean.detach().to(running_mean.scalar_type()), m);
    running_var.mul_(1 - m).add_(
        (var.detach() * (count / (count - 1))).to(running_var.scalar_type()),
        m);  // unbiased
  }
  // Centred before scaling, as PyTorch's own kernel does: written as x * scale + shift, the
  // backward pass would form sum(grad * x) in float32, which cancels as badly as the variance.
  const auto dtype = x.scalar_type();
  const auto centred = x - mean.to(dtype).view({1, c, 1, 1});  // (N, C, H, W)
  const auto inverse_std =
      torch::rsqrt(var + options_.eps).to(dtype).view({1, c, 1, 1});  // (1, C, 1, 1)
  return centred * inverse_std * weight.view({1, c, 1, 1}) + bias.view({1, c, 1, 1});
}

void set_batch_norm_sync(torch::nn::Module& model, Communicator* communicator) {
  for (auto& module : model.modules(/*include_self=*/true)) {
    if (auto* bn = module->as<BatchNormImpl>()) bn->set_sync(communicator);
  }
}

}  // namespace dptrain
