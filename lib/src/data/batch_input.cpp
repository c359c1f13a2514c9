// The step's input gathered into reused buffers. See batch_input.h.
#include "dptrain/data/batch_input.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

#include "dptrain/data/data.h"

namespace dptrain {

BatchAssembler::BatchAssembler(int64_t max_batch, const torch::Device& device, bool channels_last)
    : max_batch_(max_batch) {
  TORCH_CHECK(max_batch > 0, "BatchAssembler needs a positive batch size");
  const auto on_device = torch::TensorOptions().device(device);
  pixels_ = torch::empty({max_batch, kImageSide, kImageSide}, on_device.dtype(torch::kUInt8));
  input_ = torch::empty({max_batch, 1, kImageSide, kImageSide},
                        on_device.dtype(torch::kFloat32)
                            .memory_format(channels_last ? at::MemoryFormat::ChannelsLast
                                                         : at::MemoryFormat::Contiguous));
  labels_ = torch::empty({max_batch}, on_device.dtype(torch::kInt64));
}

std::pair<torch::Tensor, torch::Tensor> BatchAssembler::gather(const torch::Tensor& images,
                                                               const torch::Tensor& labels,
                                                               const torch::Tensor& index) {
  const int64_t n = index.size(0);
  TORCH_CHECK(n <= max_batch_, "batch of ", n, " exceeds the assembler's ", max_batch_);
  auto pixels = pixels_.narrow(0, 0, n);  // (n, 28, 28)
  auto x = input_.narrow(0, 0, n);        // (n, 1, 28, 28)
  auto y = labels_.narrow(0, 0, n);       // (n)
  at::index_select_out(pixels, images, 0, index);
  at::index_select_out(y, labels, 0, index);
  // The same two element-wise operations as to_model_input: convert, then divide by 255.
  x.copy_(pixels.unsqueeze(1));
  x.div_(255.0f);
  return {x, y};
}

}  // namespace dptrain
