// Counting one layer's FLOPs from its options. See flops.h, Note [Counting FLOPs].
#include "dptrain/model/flops.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <variant>

namespace dptrain {
namespace {

std::string describe(const ActivationShape& s) {
  return "(" + std::to_string(s.channels) + ", " + std::to_string(s.height) + ", " +
         std::to_string(s.width) + ")";
}

}  // namespace

ActivationShape FlopCounter::conv(const torch::nn::Conv2dImpl& conv, const std::string& name,
                                  const ActivationShape& in) {
  const auto& o = conv.options;
  if (o.transposed() || o.in_channels() != in.channels) {
    throw std::logic_error("FlopCounter: " + name + " takes " + std::to_string(o.in_channels()) +
                           " channels" + (o.transposed() ? " transposed" : "") + " but gets " +
                           describe(in));
  }
  // The padding is a variant of explicit sizes, kValid and kSame: LibTorch 1.13's own
  // c10::variant, std::variant since 2.1. The unqualified get_if finds c10's by argument-
  // dependent lookup where the variant is c10's; std's is the one ordinary lookup sees.
  using std::get_if;
  const auto* explicit_padding = get_if<torch::ExpandingArray<2>>(&o.padding());
  const bool same = get_if<torch::enumtype::kSame>(&o.padding()) != nullptr;
  int64_t size[2] = {in.height, in.width};
  for (int i = 0; i < 2; ++i) {
    const int64_t kernel = (*o.kernel_size())[i];
    const int64_t stride = (*o.stride())[i];
    const int64_t dilation = (*o.dilation())[i];
    const int64_t padding = explicit_padding ? (**explicit_padding)[i] : 0;  // kValid: none
    // nn.Conv2d's output size, floor((in + 2 p - d (k - 1) - 1) / s) + 1; kSame keeps the input's
    // (LibTorch allows it with stride 1 only).
    if (!same) size[i] = (size[i] + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1;
    if (size[i] <= 0 || in.height <= 0 || in.width <= 0) {
      throw std::invalid_argument("FlopCounter: " + name + " leaves no output of an input " +
                                  describe(in));
    }
  }
  const ActivationShape out{o.out_channels(), size[0], size[1]};
  // Each output element sums (C_in / groups) x k_h x k_w products.
  const int64_t per_output =
      o.in_channels() / o.groups() * (*o.kernel_size())[0] * (*o.kernel_size())[1];
  layers_.push_back({name, out, out.channels * out.height * out.width * per_output});
  return out;
}

ActivationShape FlopCounter::linear(const torch::nn::LinearImpl& linear, const std::string& name,
                                    const ActivationShape& in) {
  const int64_t in_features = linear.options.in_features();
  const int64_t out_features = linear.options.out_features();
  if (in.channels * in.height * in.width != in_features) {
    throw std::logic_error("FlopCounter: " + name + " takes " + std::to_string(in_features) +
                           " features but gets " + describe(in));
  }
  const ActivationShape out{out_features, 1, 1};
  layers_.push_back({name, out, in_features * out_features});
  return out;
}

int64_t FlopCounter::forward_flops() const {
  int64_t macs = 0;
  for (const auto& layer : layers_) macs += layer.macs;
  return 2 * macs;
}

}  // namespace dptrain
