// Training-image augmentation: a random crop of the zero-padded image and a horizontal flip,
// drawn for every position of a global batch from the run's seed, the epoch and the step, and
// applied to a replica's shard on its device in a few whole-batch tensor operations. Not here:
// which images form the batch (batching.h) or their conversion to floats (batch_input.h).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace dptrain {

enum class Augment {
  kNone,      // the book's: the images as they are
  kCropFlip,  // random crop with zero padding and horizontal flip
};

// "none", "crop-flip"; nullopt for another name.
std::optional<Augment> augment_from_name(const std::string& name);
const char* augment_name(Augment augment);

// Note [Augmentation draws belong to the global batch]
// The draws of a step are made for the whole global batch from (seed, epoch, step), on the host
// with our own generator (core/random.h), and a replica takes the rows of its shard. So image i
// of the global batch gets the same crop and flip whatever the world size, the device or the
// LibTorch version: a run on one replica and on four trains on the same pixels.
//
// The draws of global step `step` of `epoch`: (count, 3) int64 on the CPU, per image the crop's
// row and column offsets into the padded image, each uniform in 0..2*padding, and 1 to flip
// (probability 1/2) or 0.
torch::Tensor draw_crop_flip(uint64_t seed, int64_t epoch, int64_t step, int64_t count,
                             int64_t padding);

// x: (n, C, H, W) images; draws: (n, 3) int64 on x's device (rows of draw_crop_flip). Returns
// (n, C, H, W), in x's dtype, device and memory format: each image zero-padded by `padding` on
// every side, cropped back to H x W at its offsets, and mirrored left to right where drawn.
// Pixels are copied, never computed, so the result is exact.
torch::Tensor crop_flip(const torch::Tensor& x, const torch::Tensor& draws, int64_t padding);

}  // namespace dptrain
