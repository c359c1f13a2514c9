// Where this process stands before anything starts: which devices its replicas run on, its place
// in the world (threads of one process, or one rank under torchrun or Slurm), and the collective
// backend. Decided from the device flags, the launcher's environment and the GPU count, all
// passed in, so every case is testable without GPUs. Not here: checking the options against it
// (checked_world.h) or building it (train.h).
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/rendezvous.h"

namespace dptrain {

// Where this process stands: all replicas in this process (one thread per device), or one rank
// of a multi-process world launched by torchrun or Slurm.
struct WorldPlan {
  std::vector<torch::Device> local_devices;  // one replica per entry
  int first_rank = 0;                        // global rank of local_devices[0]
  int world_size = 1;
  bool multi_process = false;
  LaunchEnvironment launch;  // multi-process only: where the ranks meet
};

// The most replicas one process runs as threads, where the machine has fewer GPUs (Note [A bound
// on the replicas of one process]).
constexpr size_t kMaxReplicasPerProcess = 16;

// `devices` is --devices as given, `gpus` is --gpus (at most one is set), `launch` is
// read_launch_environment(), `cuda_devices` is cuda_device_count().
// Without a launcher every replica is a thread of this process: the devices named, else the
// first GPU, else the CPU. Under a launcher this process is one rank with one replica: the
// devices named are this node's and LOCAL_RANK picks one (a lone "cpu" serves every local rank);
// with none named, GPU LOCAL_RANK, or the CPU on a machine without GPUs.
// Throws UsageError naming the flag, or the launcher and local rank, when the devices are not
// there, or when more than kMaxReplicasPerProcess (or the GPU count, where larger) are listed.
WorldPlan plan_world(const std::optional<std::string>& devices, std::optional<int> gpus,
                     const std::optional<LaunchEnvironment>& launch, int cuda_devices);

// The backend named by --backend ("gloo" or "nccl"), else NCCL where the replicas are GPUs and
// `nccl_built` (backend_available(Backend::kNccl)), else Gloo.
Backend choose_backend(const std::optional<std::string>& named, const WorldPlan& world,
                       bool nccl_built);

// Checks the placements every rank learns at the rendezvous (gather_placements) against the
// backend: NCCL refuses two ranks on one GPU ("Duplicate GPU detected" deep inside its first
// collective), so that is a UsageError here naming both ranks, the host and the device.
void check_placements(const std::vector<RankPlacement>& placements, Backend backend);

}  // namespace dptrain
