// Assembles the model input of one step from the data set already on the device: gathers the
// shard's images and labels by index into buffers that are allocated once and reused, so the
// data path allocates nothing per step. Not here: which indices (batching.h) or loading (data.h).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>

namespace dptrain {

class BatchAssembler {
 public:
  // Buffers for up to `max_batch` examples on `device`; the float input is laid out
  // channels-last when `channels_last` is set (see convert_to_channels_last).
  BatchAssembler(int64_t max_batch, const torch::Device& device, bool channels_last);

  // images: (N, 28, 28) uint8, labels: (N) int64, index: (n) int64 on the same device, n at most
  // max_batch. Returns x: (n, 1, 28, 28) float in [0, 1], bit-identical to to_model_input, and
  // y: (n) int64. Both are views of the buffers: valid until the next call.
  std::pair<torch::Tensor, torch::Tensor> gather(const torch::Tensor& images,
                                                 const torch::Tensor& labels,
                                                 const torch::Tensor& index);

 private:
  int64_t max_batch_;
  torch::Tensor pixels_;  // (max_batch, 28, 28) uint8
  torch::Tensor input_;   // (max_batch, 1, 28, 28) float
  torch::Tensor labels_;  // (max_batch) int64
};

}  // namespace dptrain
