// Crop-and-flip augmentation of training batches. See augment.h.
#include "dptrain/data/augment.h"

#include <cstdint>
#include <optional>
#include <string>

#include "dptrain/core/random.h"

namespace dptrain {
namespace {

// Keeps the augmentation's streams apart from the weights' and the data order's.
constexpr uint64_t kAugmentStream = 0x61756700;  // "aug"

}  // namespace

std::optional<Augment> augment_from_name(const std::string& name) {
  if (name == "none") return Augment::kNone;
  if (name == "crop-flip") return Augment::kCropFlip;
  return std::nullopt;
}

const char* augment_name(Augment augment) {
  return augment == Augment::kCropFlip ? "crop-flip" : "none";
}

torch::Tensor draw_crop_flip(uint64_t seed, int64_t epoch, int64_t step, int64_t count,
                             int64_t padding) {
  TORCH_CHECK(count >= 0 && padding >= 0, "draw_crop_flip: count ", count, ", padding ", padding);
  Rng rng(derive_seed(derive_seed(derive_seed(seed, kAugmentStream), static_cast<uint64_t>(epoch)),
                      static_cast<uint64_t>(step)));
  auto draws = torch::empty({count, 3}, torch::kInt64);
  auto* out = draws.data_ptr<int64_t>();
  const auto offsets = static_cast<uint64_t>(2 * padding + 1);
  for (int64_t i = 0; i < count; ++i) {
    out[3 * i] = static_cast<int64_t>(rng.next_below(offsets));
    out[3 * i + 1] = static_cast<int64_t>(rng.next_below(offsets));
    out[3 * i + 2] = static_cast<int64_t>(rng.next_u64() >> 63);
  }
  return draws;
}

torch::Tensor crop_flip(const torch::Tensor& x, const torch::Tensor& draws, int64_t padding) {
  TORCH_CHECK(x.dim() == 4, "crop_flip: images must be (n, C, H, W), got ", x.sizes());
  TORCH_CHECK(draws.dim() == 2 && draws.size(0) == x.size(0) && draws.size(1) == 3,
              "crop_flip: draws must be (", x.size(0), ", 3), got ", draws.sizes());
  const int64_t n = x.size(0), height = x.size(2), width = x.size(3);
  const auto index = torch::TensorOptions().dtype(torch::kInt64).device(x.device());
  const auto padded = torch::constant_pad_nd(x, {padding, padding, padding, padding}, 0);
  const auto rows = draws.select(1, 0).unsqueeze(1) + torch::arange(height, index);  // (n, H)
  const auto across = torch::arange(width, index);                                   // (W)
  const auto flipped = draws.select(1, 2).unsqueeze(1).to(torch::kBool);             // (n, 1)
  const auto columns =
      draws.select(1, 1).unsqueeze(1) + torch::where(flipped, (width - 1) - across, across);
  // (n, C, H, W): image b's channel c at padded[b, c, rows[b, i], columns[b, j]].
  const auto batch = torch::arange(n, index).view({n, 1, 1, 1});
  const auto channel = torch::arange(x.size(1), index).view({1, -1, 1, 1});
  const auto out =
      padded.index({batch, channel, rows.view({n, 1, height, 1}), columns.view({n, 1, 1, width})});
  // x's own strides: with one channel, contiguous() would call the NCHW result channels-last
  // as it is, and oneDNN, reading NCHW strides, would give the stem an NCHW output its BatchNorm
  // does not fuse.
  return torch::empty_like(x).copy_(out);
}

}  // namespace dptrain
