// The book's ResNet-18 and its reference initialisation.
#include "dptrain/model/model.h"

#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/conv.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/random.h"
#include "dptrain/model/batch_norm.h"
#include "dptrain/model/flops.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/model/projection.h"

namespace dptrain {
namespace {

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  // The book's convolutions keep their bias (nn.Conv2d's default), which the 11,175,818
  // parameter count includes.
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(true));
}

// relu(bn(conv(x)) + shortcut), the shortcut undefined for none. With fused_bias_grad, where the
// BatchNorm fuses, the convolution runs with its bias detached (the same call, so the same bits)
// and the fused backward gives the bias its gradient (Note [The convolution's bias gradient]).
torch::Tensor conv_batch_norm_relu(torch::nn::Conv2dImpl& conv, BatchNormImpl& bn,
                                   const torch::Tensor& x, const torch::Tensor& shortcut,
                                   bool fused_bias_grad) {
  // oneDNN writes a channels-last output where the input or the weight is channels-last (as
  // LibTorch decides), and only such an output can be fused; elsewhere (CUDA, the contiguous
  // layout, --sync-bn, evaluation) the convolution is not run twice.
  if (fused_bias_grad && conv.bias.defined() && conv.bias.requires_grad() &&
      at::GradMode::is_enabled() && bn.may_fuse() && x.device().is_cpu() &&
      (x.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
       conv.weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast)) {
    const auto& o = conv.options;
    const auto y = torch::nn::functional::conv2d(x, conv.weight,
                                                 torch::nn::functional::Conv2dFuncOptions()
                                                     .bias(conv.bias.detach())
                                                     .stride(o.stride())
                                                     .padding(o.padding())
                                                     .dilation(o.dilation())
                                                     .groups(o.groups()));
    if (bn.fuses(y, shortcut)) return bn.forward_add_relu(y, shortcut, conv.bias);
    // Not fused after all (a type or shape the fused BatchNorm does not take): the library's
    // gradient, from the convolution run again with its bias.
  }
  return bn.forward_add_relu(conv.forward(x), shortcut);
}

}  // namespace

// ---- ResidualBlock ----------------------------------------------------------

ResidualBlockImpl::ResidualBlockImpl(int64_t in_channels, int64_t out_channels, bool use_1x1conv,
                                     int64_t stride, bool fused_batch_norm,
                                     bool fused_conv_bias_grad)
    : fused_conv_bias_grad_(fused_conv_bias_grad) {
  conv1_ = register_module("conv1", conv(in_channels, out_channels, /*kernel=*/3, stride,
                                         /*padding=*/1));
  conv2_ = register_module("conv2", conv(out_channels, out_channels, /*kernel=*/3,
                                         /*stride=*/1, /*padding=*/1));
  if (use_1x1conv) {
    conv3_ = register_module("conv3", conv(in_channels, out_channels, /*kernel=*/1, stride,
                                           /*padding=*/0));
  }
  bn1_ = register_module("bn1", BatchNorm(out_channels, fused_batch_norm));
  bn2_ = register_module("bn2", BatchNorm(out_channels, fused_batch_norm));
}

torch::Tensor ResidualBlockImpl::forward(const torch::Tensor& x) {
  // BatchNorm, the shortcut's sum and the ReLU are one step (fused on the CPU): the book's
  // relu(bn(conv(x)) + shortcut).
  const bool fused = fused_conv_bias_grad_;
  // (N, C_out, H', W') each
  const auto y = conv_batch_norm_relu(*conv1_, *bn1_, x, torch::Tensor(), fused);
  const auto shortcut = conv3_ ? project(*conv3_, x) : x;
  return conv_batch_norm_relu(*conv2_, *bn2_, y, shortcut, fused);
}

ActivationShape ResidualBlockImpl::count_flops(FlopCounter& counter, const std::string& name,
                                               const ActivationShape& in) const {
  const auto y = counter.conv(*conv1_, name + ".conv1", in);
  const auto shortcut = conv3_ ? counter.conv(*conv3_, name + ".conv3", in) : in;
  const auto out = counter.conv(*conv2_, name + ".conv2", y);
  if (!(out == shortcut)) {
    throw std::logic_error("count_flops: " + name + "'s main path and shortcut differ in shape");
  }
  return out;
}

torch::nn::Sequential make_resnet_stage(int64_t in_channels, int64_t out_channels,
                                        int64_t num_blocks, bool first_stage, bool fused_batch_norm,
                                        bool fused_conv_bias_grad) {
  torch::nn::Sequential stage;
  for (int64_t i = 0; i < num_blocks; ++i) {
    if (i == 0 && !first_stage) {
      stage->push_back(ResidualBlock(in_channels, out_channels, /*use_1x1conv=*/true,
                                     /*stride=*/2, fused_batch_norm, fused_conv_bias_grad));
    } else {
      stage->push_back(ResidualBlock(out_channels, out_channels, /*use_1x1conv=*/false,
                                     /*stride=*/1, fused_batch_norm, fused_conv_bias_grad));
    }
  }
  return stage;
}

// ---- ResNet -----------------------------------------------------------------

ResNetImpl::ResNetImpl(const ResNetOptions& options) : options_(options) {
  TORCH_CHECK(options.width > 0 && options.num_classes > 0 && options.in_channels > 0,
              "ResNet options must be positive: width ", options.width, ", classes ",
              options.num_classes, ", input channels ", options.in_channels);
  const int64_t w = options.width;
  // The book's nn.Sequential names the stem's layers "0" (conv), "1" (BN) and "2" (ReLU).
  stem_conv_ = register_module("0", conv(options.in_channels, w, /*kernel=*/3, /*stride=*/1,
                                         /*padding=*/1));
  const bool fused = options.fused_batch_norm;
  const bool bias_grad = options.fused_conv_bias_grad;
  stem_bn_ = register_module("1", BatchNorm(w, fused));
  constexpr int64_t kBlocksPerStage = 2;  // ResNet-18: 4 stages x 2 blocks x 2 convs + 2
  stage1_ =
      register_module("resnet_block1", make_resnet_stage(w, w, kBlocksPerStage,
                                                         /*first_stage=*/true, fused, bias_grad));
  stage2_ = register_module("resnet_block2",
                            make_resnet_stage(w, 2 * w, kBlocksPerStage, false, fused, bias_grad));
  stage3_ = register_module(
      "resnet_block3", make_resnet_stage(2 * w, 4 * w, kBlocksPerStage, false, fused, bias_grad));
  stage4_ = register_module(
      "resnet_block4", make_resnet_stage(4 * w, 8 * w, kBlocksPerStage, false, fused, bias_grad));
  fc_ = register_module("fc", torch::nn::Sequential(torch::nn::Flatten(),
                                                    torch::nn::Linear(8 * w, options.num_classes)));
}

torch::Tensor ResNetImpl::forward(const torch::Tensor& x) {
  auto y = conv_batch_norm_relu(*stem_conv_, *stem_bn_, x, torch::Tensor(),
                                options_.fused_conv_bias_grad);                  // (N, w, 28, 28)
  y = stage1_->forward(y);                                                       // (N, w, 28, 28)
  y = stage2_->forward(y);                                                       // (N, 2w, 14, 14)
  y = stage3_->forward(y);                                                       // (N, 4w, 7, 7)
  y = stage4_->forward(y);                                                       // (N, 8w, 4, 4)
  y = torch::adaptive_avg_pool2d(y, {1, 1});                                     // (N, 8w, 1, 1)
  return fc_->forward(y);                                                        // (N, K)
}

ActivationShape ResNetImpl::count_flops(FlopCounter& counter, const ActivationShape& in) const {
  auto y = counter.conv(*stem_conv_, "0", in);
  for (const auto& [name, stage] :
       {std::pair{"resnet_block1", &stage1_}, std::pair{"resnet_block2", &stage2_},
        std::pair{"resnet_block3", &stage3_}, std::pair{"resnet_block4", &stage4_}}) {
    for (size_t i = 0; i < (*stage)->size(); ++i) {
      y = (*stage)->at<ResidualBlockImpl>(i).count_flops(
          counter, std::string(name) + "." + std::to_string(i), y);
    }
  }
  y = ActivationShape{y.channels, 1, 1};  // adaptive_avg_pool2d(y, {1, 1})
  // fc: Flatten, then the Linear registered as "1".
  return counter.linear(fc_->at<torch::nn::LinearImpl>(1), "fc.1", y);
}

// ---- Initialisation -----------------------------------------------------------

void init_reference_weights(torch::nn::Module& model, uint64_t seed) {
  torch::NoGradGuard no_grad;
  Rng rng(seed);
  // Module order is registration order, so the same seed fills the same weights on every rank.
  for (auto& module : model.modules(/*include_self=*/true)) {
    if (auto* bn = module->as<BatchNormImpl>()) {
      bn->reset_parameters();
      continue;
    }
    const bool is_conv = module->as<torch::nn::Conv2dImpl>() != nullptr;
    const bool is_linear = module->as<torch::nn::LinearImpl>() != nullptr;
    if (!is_conv && !is_linear) continue;
    for (auto& item : module->named_parameters(/*recurse=*/false)) {
      auto& tensor = item.value();
      if (item.key() == "weight") {
        auto values = torch::empty(tensor.sizes(), torch::kFloat32);
        fill_normal(rng, values.data_ptr<float>(), static_cast<size_t>(values.numel()),
                    /*mean=*/0.0, /*stddev=*/0.01);
        tensor.copy_(values);
      } else {
        tensor.zero_();
      }
    }
  }
}

namespace {

// The counter after count_flops' walk over `model` for one image, checked to have reached every
// convolution and linear layer of the module tree: the one count both figures below read.
FlopCounter counted_flops(const ResNetImpl& model, int64_t in_height, int64_t in_width) {
  FlopCounter counter;
  model.count_flops(counter, ActivationShape{model.options().in_channels, in_height, in_width});
  size_t layers = 0;
  for (const auto& module : model.modules(/*include_self=*/false)) {
    if (module->as<torch::nn::Conv2dImpl>() || module->as<torch::nn::LinearImpl>()) ++layers;
  }
  if (layers != counter.layers().size()) {
    throw std::logic_error("count_layer_flops: the model has " + std::to_string(layers) +
                           " convolution and linear layers but count_flops reached " +
                           std::to_string(counter.layers().size()));
  }
  return counter;
}

}  // namespace

std::vector<LayerFlops> count_layer_flops(const ResNetImpl& model, int64_t in_height,
                                          int64_t in_width) {
  return counted_flops(model, in_height, in_width).layers();
}

int64_t forward_flops_per_image(const ResNetImpl& model, int64_t in_height, int64_t in_width) {
  return counted_flops(model, in_height, in_width).forward_flops();
}

int64_t count_parameters(const torch::nn::Module& model) {
  int64_t total = 0;
  for (const auto& p : model.parameters()) total += p.numel();
  return total;
}

bool fuses_conv_bias_gradients(const ResNetOptions& options, const torch::Device& device,
                               MemoryFormat layout, bool synchronised_batch_norm) {
  return options.fused_conv_bias_grad && options.fused_batch_norm && device.is_cpu() &&
         layout == MemoryFormat::kChannelsLast && !synchronised_batch_norm;
}

void convert_to_channels_last(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
  }
  for (auto& b : model.buffers()) {
    if (b.dim() == 4) b.set_data(b.data().contiguous(at::MemoryFormat::ChannelsLast));
  }
}

// ---- What a file of the model holds ------------------------------------------------------

std::shared_ptr<const ModelTensorSpecs> model_tensor_specs(const ResNetOptions& options) {
  static std::mutex mutex;
  static std::pair<ResNetOptions, std::shared_ptr<const ModelTensorSpecs>> last{{}, nullptr};
  const std::lock_guard<std::mutex> lock(mutex);
  const ResNetOptions& had = last.first;
  if (last.second != nullptr && had.width == options.width &&
      had.num_classes == options.num_classes && had.in_channels == options.in_channels &&
      had.fused_batch_norm == options.fused_batch_norm) {
    return last.second;
  }
  torch::NoGradGuard no_grad;
  ResNet model(options);
  auto specs = std::make_shared<ModelTensorSpecs>();
  for (const auto& item : model->named_parameters()) {
    specs->tensors.push_back({item.key(), item.value().scalar_type(), item.value().sizes().vec()});
  }
  for (const auto& item : model->named_buffers()) {
    specs->tensors.push_back({item.key(), item.value().scalar_type(), item.value().sizes().vec()});
  }
  for (const auto& t : specs->tensors) specs->by_name[t.name] = &t;
  last = {options, specs};
  return specs;
}

}  // namespace dptrain
