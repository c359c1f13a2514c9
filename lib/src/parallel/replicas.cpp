// Replica consistency: broadcast, buffer averaging, checksums. See replicas.h.
#include "dptrain/parallel/replicas.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "dptrain/core/errors.h"
#include "dptrain/parallel/distributed.h"

namespace dptrain {

void broadcast_from_rank0(torch::nn::Module& model, Communicator& communicator) {
  if (communicator.world_size() == 1) return;
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    communicator.broadcast(item.value(), /*root=*/0, "broadcast of parameter " + item.key());
  }
  for (auto& item : model.named_buffers()) {
    communicator.broadcast(item.value(), /*root=*/0, "broadcast of buffer " + item.key());
  }
}

void average_buffers(torch::nn::Module& model, Communicator& communicator) {
  if (communicator.world_size() == 1) return;
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_buffers()) {
    auto& buffer = item.value();
    if (!buffer.is_floating_point()) continue;  // num_batches_tracked is the same everywhere
    communicator.allreduce_sum(buffer, "averaging of buffer " + item.key());
    buffer.div_(communicator.world_size());
  }
}

int64_t parameter_checksum(const torch::nn::Module& model) {
  // FNV-1a over the raw bytes: any differing bit changes it (with overwhelming probability).
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const auto& p : model.parameters()) {
    const auto host = p.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const uint8_t*>(host.data_ptr());
    const auto count = static_cast<size_t>(host.numel()) * host.element_size();
    for (size_t i = 0; i < count; ++i) {
      hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
    }
  }
  return static_cast<int64_t>(hash >> 1);  // 63 bits, so that negating it cannot overflow
}

void check_replicas_identical(const torch::nn::Module& model, Communicator& communicator,
                              int64_t step) {
  if (!communicator.has_process_group()) return;
  const std::string what = "replica checksum at step " + std::to_string(step);
  communicator.wait_host(what);  // the checksum reads the weights on the host
  const int64_t checksum = parameter_checksum(model);
  // max(h) and max(-h) = -min(h) in one all-reduce: the ranks agree iff they are equal. On the
  // weights' device, since NCCL takes CUDA tensors only.
  const auto device = model.parameters().front().device();
  auto extremes = torch::tensor({checksum, -checksum}, torch::kInt64).to(device);
  communicator.allreduce_max(extremes, what);
  const auto host = extremes.to(torch::kCPU);
  const int64_t highest = host[0].item<int64_t>();
  const int64_t lowest = -host[1].item<int64_t>();
  if (highest != lowest) {
    throw CollectiveError("rank " + std::to_string(communicator.rank()) +
                          ": replicas diverged at step " + std::to_string(step) +
                          ": parameter checksums differ (this rank " + std::to_string(checksum) +
                          ", lowest " + std::to_string(lowest) + ", highest " +
                          std::to_string(highest) + ")");
  }
}

}  // namespace dptrain
