// The projection shortcut without oneDNN's strided 1x1 kernels. See projection.h.
#include "dptrain/model/projection.h"

#include <torch/autograd.h>
#include <torch/nn/functional/conv.h>

#include <cstdint>

namespace dptrain {

// Note [The strided 1x1 convolution on the CPU]
// oneDNN's strided 1x1 convolution backward writes outside its buffers with two threads and a
// batch that does not divide evenly; most likely in the step that first copies the strided input
// into a dense buffer ("reduce to unit stride"), which a unit stride never takes. Below 16
// channels, at batches such as 3, 7 and 31, glibc aborts on a corrupted heap, the process dies
// with SIGSEGV, or the weight's gradient comes back as garbage (2.2e21 at the book's stage-2
// shortcut, width 4, batch 31); in Debian's LibTorch 1.13 and in PyPI's 2.11, channels-last and
// contiguous alike, and oneDNN's AVX2 kernels (ONEDNN_MAX_CPU_ISA=AVX2) fail even at batch 256.
// Subsampling first and convolving at unit stride gives the same sums (each output reads one
// input pixel), and no shape of the sweep fails that way, on either LibTorch, layout or ISA
// (scripts/repro/strided_1x1_heap.py; the sweep's shapes, trials, CPU and date:
// bench/results/2026-12-01-cpu-notes.md). CUDA runs cuDNN, not oneDNN, so there the convolution
// keeps its stride.
namespace {

class Subsample : public torch::autograd::Function<Subsample> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               int64_t stride) {
    const auto layout = x.suggest_memory_format();
    ctx->saved_data["sizes"] = x.sizes().vec();
    ctx->saved_data["channels_last"] = layout == at::MemoryFormat::ChannelsLast;
    ctx->saved_data["stride"] = stride;
    return strided_view(x, stride).contiguous(layout);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const auto layout = ctx->saved_data["channels_last"].toBool() ? at::MemoryFormat::ChannelsLast
                                                                  : at::MemoryFormat::Contiguous;
    const auto& grad = grad_outputs[0];  // (N, C, H', W')
    // One zero tensor of the input's shape, the subsampled pixels copied in: autograd's own
    // backward of two slices would build two.
    auto grad_input = torch::zeros(sizes, grad.options().memory_format(layout));  // (N, C, H, W)
    strided_view(grad_input, ctx->saved_data["stride"].toInt()).copy_(grad);
    return {grad_input, torch::Tensor()};
  }

 private:
  static torch::Tensor strided_view(const torch::Tensor& x, int64_t stride) {
    return x.slice(/*dim=*/2, 0, x.size(2), stride).slice(/*dim=*/3, 0, x.size(3), stride);
  }
};

}  // namespace

torch::Tensor subsample(const torch::Tensor& x, int64_t stride) {
  TORCH_CHECK(x.dim() == 4, "subsample expects (N, C, H, W), got ", x.sizes());
  TORCH_CHECK(stride >= 1, "subsample needs a positive stride, got ", stride);
  return Subsample::apply(x, stride);
}

torch::Tensor project(torch::nn::Conv2dImpl& conv, const torch::Tensor& x) {
  const auto stride = conv.options.stride();
  TORCH_CHECK(
      conv.weight.size(2) == 1 && conv.weight.size(3) == 1 && stride->at(0) == stride->at(1),
      "project() takes a 1x1 convolution with one stride, got a kernel of ", conv.weight.sizes(),
      " and stride ", stride);
  if (!x.device().is_cpu() || stride->at(0) == 1) return conv.forward(x);
  return torch::nn::functional::conv2d(subsample(x, stride->at(0)), conv.weight,
                                       torch::nn::functional::Conv2dFuncOptions().bias(conv.bias));
}

}  // namespace dptrain
