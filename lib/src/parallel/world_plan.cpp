// Planning this process's replicas and backend. See world_plan.h.
#include "dptrain/parallel/world_plan.h"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/devices.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/rendezvous.h"

namespace dptrain {

namespace {

// Under a launcher: the one device of local rank `launch.local_rank`, from those named.
torch::Device device_of_local_rank(const std::vector<torch::Device>& named,
                                   const LaunchEnvironment& launch, int cuda_devices) {
  const auto local = static_cast<size_t>(launch.local_rank);
  if (named.empty()) {
    if (cuda_devices == 0) return torch::Device(torch::kCPU);
    if (launch.local_rank < cuda_devices) {
      return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(launch.local_rank));
    }
    throw UsageError(launch.launcher + " local rank " + std::to_string(launch.local_rank) +
                     " has no GPU: this machine has " + std::to_string(cuda_devices));
  }
  if (named.size() == 1 && named[0].is_cpu()) return named[0];
  if (local < named.size()) return named[local];
  throw UsageError("--devices lists " + std::to_string(named.size()) +
                   " device(s) but this is local rank " + std::to_string(local));
}

// Note [A bound on the replicas of one process]
// Every in-process replica is a thread with a model of its own, and the Gloo group connects every
// pair of replicas through loopback sockets: n replicas hold n(n-1) socket ends in this one
// process. 256 `cpu` entries (65280 sockets, past the usual limit of 1024 descriptors, and 256
// models) never reached a first step in 150 s and printed nothing. Sixteen (240 sockets) start in
// seconds; one process per rank under torchrun has no such bound. A machine with more GPUs than
// that may list each of them once.
void check_replica_count(size_t replicas, int cuda_devices) {
  const size_t most = std::max<size_t>(kMaxReplicasPerProcess, static_cast<size_t>(cuda_devices));
  if (replicas <= most) return;
  throw UsageError("--devices lists " + std::to_string(replicas) +
                   " replicas; one process runs at most " + std::to_string(most) +
                   " (each is a thread with its own model and a connection to every other); "
                   "for more, start one process per rank with torchrun");
}

}  // namespace

WorldPlan plan_world(const std::optional<std::string>& devices, std::optional<int> gpus,
                     const std::optional<LaunchEnvironment>& launch, int cuda_devices) {
  std::vector<torch::Device> named;
  if (gpus) {
    named = first_gpus(*gpus, cuda_devices);
  } else if (devices) {
    named = parse_device_list(*devices, cuda_devices);
  }
  WorldPlan world;
  if (!launch) {
    if (named.empty()) {
      named = {cuda_devices > 0 ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU)};
    }
    check_replica_count(named.size(), cuda_devices);
    world.local_devices = named;
    world.world_size = static_cast<int>(named.size());
    return world;
  }
  world.multi_process = true;
  world.first_rank = launch->rank;
  world.world_size = launch->world_size;
  world.launch = *launch;
  world.local_devices = {device_of_local_rank(named, *launch, cuda_devices)};
  return world;
}

Backend choose_backend(const std::optional<std::string>& named, const WorldPlan& world,
                       bool nccl_built) {
  if (named) return *named == "nccl" ? Backend::kNccl : Backend::kGloo;
  return world.local_devices.front().is_cuda() && nccl_built ? Backend::kNccl : Backend::kGloo;
}

void check_placements(const std::vector<RankPlacement>& placements, Backend backend) {
  if (backend != Backend::kNccl) return;
  for (size_t i = 0; i < placements.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      const auto& a = placements[j];
      const auto& b = placements[i];
      // The UUID names the GPU whatever CUDA_VISIBLE_DEVICES did to its index; without one (a
      // build without CUDA) the host and device name are the best guess.
      const bool same = a.gpu.empty() || b.gpu.empty()
                            ? a.host == b.host && a.device == b.device && a.device != "cpu"
                            : a.gpu == b.gpu;
      if (!same) continue;
      throw UsageError("--backend nccl: ranks " + std::to_string(j) + " and " + std::to_string(i) +
                       " both use the GPU " + (a.gpu.empty() ? "" : a.gpu + " ") + "(" + a.device +
                       " on " + a.host +
                       (b.device == a.device
                            ? ""
                            : ", " + b.device + " in rank " + std::to_string(i) + "'s process") +
                       "); NCCL needs one GPU per rank: give each rank its own GPU, or use "
                       "--backend gloo");
    }
  }
}

}  // namespace dptrain
