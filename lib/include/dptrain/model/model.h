// The book's ResNet-18 for 28x28 inputs (D2L, "Training on Multiple GPUs", concise version):
// a 3x3 stem without max-pool, four stages of two residual blocks, global average pool, linear.
// Module names match the book's PyTorch code, so state dicts line up name for name.
// Not here: how replicas are made or synchronised (see distributed.h).
#pragma once

#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dptrain/model/batch_norm.h"
#include "dptrain/model/flops.h"
#include "dptrain/model/memory_format.h"

namespace dptrain {

// Shape legend: N batch, C channels, H/W height/width, K classes.

struct ResNetOptions {
  int64_t num_classes = 10;      // Fashion-MNIST has ten classes
  int64_t in_channels = 1;       // grey-scale images
  int64_t width = 64;            // channels of the first stage; stages use width x {1, 2, 4, 8}
  bool fused_batch_norm = true;  // BatchNormOptions::fused for every BatchNorm
  // The gradient of each convolution's bias that feeds a BatchNorm, from that BatchNorm's fused
  // backward where it runs (Note [The convolution's bias gradient]); false: from the convolution
  // library (oneDNN, cuDNN), as the book's PyTorch computes it.
  bool fused_conv_bias_grad = false;
};

// One residual block (D2L 8.6): conv3x3-BN-ReLU-conv3x3-BN, plus a shortcut that is the identity
// or, when the shape changes, a 1x1 convolution with the same stride.
class ResidualBlockImpl : public torch::nn::Module {
 public:
  ResidualBlockImpl(int64_t in_channels, int64_t out_channels, bool use_1x1conv, int64_t stride,
                    bool fused_batch_norm = true, bool fused_conv_bias_grad = false);

  // x: (N, C_in, H, W) -> (N, C_out, H / stride, W / stride)
  torch::Tensor forward(const torch::Tensor& x);
  // forward()'s convolutions for one image of shape `in`, recorded in `counter` under
  // `name`.conv1 etc. (Note [Walking the module tree] in flops.h); returns the output's shape.
  ActivationShape count_flops(FlopCounter& counter, const std::string& name,
                              const ActivationShape& in) const;

 private:
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::Conv2d conv3_{nullptr};  // the projection shortcut; null for the identity
  BatchNorm bn1_{nullptr};
  BatchNorm bn2_{nullptr};
  bool fused_conv_bias_grad_ = false;
};
TORCH_MODULE(ResidualBlock);

// A stage of residual blocks; every stage but the first halves H and W and projects the shortcut.
torch::nn::Sequential make_resnet_stage(int64_t in_channels, int64_t out_channels,
                                        int64_t num_blocks, bool first_stage,
                                        bool fused_batch_norm = true,
                                        bool fused_conv_bias_grad = false);

class ResNetImpl : public torch::nn::Module {
 public:
  explicit ResNetImpl(const ResNetOptions& options);

  // x: (N, C_in, 28, 28) float in [0, 1] -> logits (N, K)
  torch::Tensor forward(const torch::Tensor& x);
  // forward()'s convolutions and linear layer for one image of shape `in`, recorded in
  // `counter`; returns the logits' shape (K, 1, 1).
  ActivationShape count_flops(FlopCounter& counter, const ActivationShape& in) const;

  const ResNetOptions& options() const { return options_; }

 private:
  ResNetOptions options_;
  torch::nn::Conv2d stem_conv_{nullptr};  // book name "0"
  BatchNorm stem_bn_{nullptr};            // book name "1"
  torch::nn::Sequential stage1_{nullptr}, stage2_{nullptr}, stage3_{nullptr}, stage4_{nullptr};
  torch::nn::Sequential fc_{nullptr};  // Flatten, Linear, as in the book
};
TORCH_MODULE(ResNet);

// The reference initialisation: every conv and linear weight ~ Normal(0, 0.01), biases 0,
// BatchNorm gamma 1 and beta 0, running statistics reset. The normals come from our own
// generator (not LibTorch's), so the same seed gives the same bits on every LibTorch version
// and every device.
void init_reference_weights(torch::nn::Module& model, uint64_t seed);

int64_t count_parameters(const torch::nn::Module& model);

// Every convolution and linear layer of `model`, in the order its forward pass runs them, for one
// image of in_height x in_width (flops.h, Note [Counting FLOPs]). Throws std::invalid_argument for
// an input a layer shrinks to nothing, std::logic_error if a convolution or linear layer of the
// module tree was not reached (a layer added to forward() but not to count_flops).
std::vector<LayerFlops> count_layer_flops(const ResNetImpl& model, int64_t in_height,
                                          int64_t in_width);

// One image's forward FLOPs (2 x the multiply-accumulates of count_layer_flops); a trained image
// costs kTrainingPassesPerImage times as much. Full width at 28x28: 911,601,664.
int64_t forward_flops_per_image(const ResNetImpl& model, int64_t in_height, int64_t in_width);

// Whether training a model of `options` on `device` in `layout` takes the bias gradients of the
// convolutions that feed a BatchNorm from that BatchNorm's fused backward: asked for
// (fused_conv_bias_grad), the BatchNorm fused, the CPU, channels-last, and each replica's
// BatchNorm on its own batch (not synchronised). The model decides call by call from the tensors
// themselves (Note [The convolution's bias gradient]); this is the same rule from the settings,
// for what a run says of itself.
bool fuses_conv_bias_gradients(const ResNetOptions& options, const torch::Device& device,
                               MemoryFormat layout, bool synchronised_batch_norm);

// Re-lays every 4-D parameter and buffer of `model` out channels-last (N, H, W, C in memory),
// values unchanged. Convolutions on channels-last tensors run faster on CPU (oneDNN) and on
// tensor-core GPUs; the results differ from contiguous ones by float rounding only.
void convert_to_channels_last(torch::nn::Module& model);

// ---- What a file of the model holds -----------------------------------------------------
// The facts a reader of checkpoints and model files needs before it builds a model: how wide a
// model can be, how many elements it has at most, its tensors' table and its stem's name.

// What any dptrain could build: a file claiming more is refused (checkpoint.cpp bounds a file's
// size by the model it claims, and reads a plain file's width from its stem).
constexpr int64_t kMaxWidth = 4096;
constexpr int64_t kMaxClassesOrChannels = 65536;

// The elements of the book's ResNet-18 at width w: about 2729 w^2 in the convolutions
// (11,175,818 at w = 64), plus terms linear in w (BatchNorm, the stem, the linear layer), bounded
// generously; each argument clamped to what any dptrain could build. A checkpoint's size bounds
// start from it.
inline uint64_t model_elements_bound(int64_t width, int64_t num_classes, int64_t in_channels) {
  const auto w = static_cast<uint64_t>(std::clamp<int64_t>(width, 1, kMaxWidth));
  const auto k = static_cast<uint64_t>(std::clamp<int64_t>(num_classes, 1, kMaxClassesOrChannels));
  const auto c = static_cast<uint64_t>(std::clamp<int64_t>(in_channels, 1, kMaxClassesOrChannels));
  return 2800 * w * w + 64 * w * (16 + k + c) + 4 * k;
}

// The stem convolution's weight, (width, in_channels, 3, 3), by its book name: a plain state
// dict's width is its first dimension.
constexpr char kStemWeight[] = "0.weight";

// One tensor of the model: its name (named_parameters, then named_buffers), dtype and shape.
struct TensorSpec {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
};
struct ModelTensorSpecs {
  std::vector<TensorSpec> tensors;  // the model's order: its parameters, then its buffers
  std::map<std::string, const TensorSpec*> by_name;
};
// The tensors of the model of `options`, from a model built once (the last options asked for are
// kept): the names are the model's own, never a copy. Safe to call from several threads.
std::shared_ptr<const ModelTensorSpecs> model_tensor_specs(const ResNetOptions& options);

}  // namespace dptrain
