// Counting the arithmetic a model costs per image from its layers: every convolution and linear
// layer with its own hyperparameters, at the spatial sizes propagated from the input. Not here:
// the walk over the book's ResNet-18 (count_layer_flops in model.h, beside its forward), how fast
// a run went or what a device can do (the epoch's TFLOP/s and MFU, core/peak_tflops.h).
#pragma once

#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dptrain {

// Note [Counting FLOPs]
// 2 FLOPs per multiply-accumulate of the convolutions and of the linear layer; bias adds,
// BatchNorm, ReLU, the shortcut's sum and the pooling are not counted. This is the convention of
// model FLOPs utilisation (PaLM, Chowdhery et al. 2022, appendix B; llm.c; torchtitan): the
// matrix arithmetic the model needs, whatever the kernels actually execute, so that MFU compares
// runs and devices on the same work. A trained image costs 3x its forward pass (the backward pass
// computes the gradients of the inputs and of the weights, each as costly as the forward, Kaplan
// et al. 2020, section 2.1; the stem's input gradient, which autograd skips, is counted all the
// same, as the convention does); an evaluated image costs 1x. At full width and 28x28 the book's
// ResNet-18 costs 455,800,832 multiply-accumulates: 0.912 GFLOP forward, 2.73 GFLOP trained.

// One image's activation between layers: (C, H, W); a linear layer's output is (features, 1, 1).
struct ActivationShape {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  bool operator==(const ActivationShape& other) const {
    return channels == other.channels && height == other.height && width == other.width;
  }
};

// One convolution or linear layer's share of one image's forward pass.
struct LayerFlops {
  std::string name;     // its path in the state dict, e.g. "resnet_block2.0.conv1", "fc.1"
  ActivationShape out;  // its output for one image
  int64_t macs = 0;     // multiply-accumulates
};

// Note [Walking the module tree]
// Each module that runs convolutions counts them beside its own forward(), in the same order and
// on the same inputs (ResidualBlockImpl::count_flops, ResNetImpl::count_flops in model.cpp),
// calling this counter once per layer. The counter reads each layer's own options (kernel,
// stride, padding, dilation, groups, features) and checks that the input it is handed fits the
// layer, so that the sizes propagated from the input are those the forward pass would see.
class FlopCounter {
 public:
  // `conv` applied to `in`: its multiply-accumulates recorded under `name`; returns its output.
  // Throws std::invalid_argument where the output would be empty (an input too small),
  // std::logic_error where `in` does not fit the layer (a walk that strayed from the forward).
  ActivationShape conv(const torch::nn::Conv2dImpl& conv, const std::string& name,
                       const ActivationShape& in);
  // `linear` applied to `in` flattened (C x H x W features): in_features x out_features.
  ActivationShape linear(const torch::nn::LinearImpl& linear, const std::string& name,
                         const ActivationShape& in);

  const std::vector<LayerFlops>& layers() const { return layers_; }
  // 2 x the multiply-accumulates recorded: one image's forward pass.
  int64_t forward_flops() const;

 private:
  std::vector<LayerFlops> layers_;
};

// A trained image: forward + backward = 3 forward passes (Note [Counting FLOPs]).
constexpr int64_t kTrainingPassesPerImage = 3;

}  // namespace dptrain
