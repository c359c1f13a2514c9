// Joining a world of replicas from a program of one's own: from the launcher's environment
// (torchrun, Slurm, or none: a world of one), from explicit values, or as several replicas that
// are threads of this process. Every wait bounded, a missing rank named, the ranks' settings
// compared: the guarantees of joined_world.h behind three calls.
// Not here: what the replicas do with the world (data_parallel.h), the collectives
// (distributed.h), how the driver plans its world from flags (world_plan.h).
#pragma once

#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/parallel/distributed.h"

namespace dptrain {

class JoinedWorld;

struct JoinOptions {
  // Gloo or NCCL; unset: NCCL where this rank's device is a GPU and the build has NCCL, else Gloo.
  std::optional<Backend> backend;
  // Bounds the rendezvous and every collective; a rank that is not there by then is an error
  // naming it.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // What every rank must agree on, one "name=value" per line (a learning rate, a data digest):
  // compared at the rendezvous, a difference is a UsageError naming the rank and the setting.
  std::string settings;
  // A stop request (a signal number set by a handler; null: none can come), as
  // WorldOptions::stop_signal.
  const std::atomic<int>* stop_signal = nullptr;
};

// Where a rank takes its place when no launcher says so.
struct ExplicitSeat {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";  // where rank 0 serves the store
  int master_port = 29500;
  torch::Device device{torch::kCPU};
};

// One rank's membership of a world: its rank, device and communicator. Movable, not copyable.
// Destroyed without leave() (an exception on its way up), its process group is aborted so that
// peers fail at once instead of at the timeout.
class World {
 public:
  // Under torchrun or Slurm (read_launch_environment): this process is rank RANK of WORLD_SIZE,
  // on `device` if given, else GPU LOCAL_RANK where there are GPUs, else the CPU. Without a
  // launcher: a world of one on `device` (else GPU 0, else the CPU), with no process group.
  // Throws UsageError for a malformed environment or a device that is not there,
  // CollectiveError when a rank does not come.
  static World from_environment(const JoinOptions& options = {},
                                const std::optional<torch::Device>& device = std::nullopt);
  // Rank `seat.rank` of `seat.world_size`, meeting at seat.master_addr:seat.master_port (rank 0
  // serves the store there). A world of one has no process group.
  static World join(const ExplicitSeat& seat, const JoinOptions& options = {});

  World(World&&) noexcept;
  World& operator=(World&&) noexcept;
  ~World();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const torch::Device& device() const { return device_; }
  Communicator& communicator();
  // Every rank's device as its process names it ("cpu", "cuda:0"), in rank order.
  const std::vector<std::string>& devices() const;
  // The end of a successful run, on every rank: waits for the others, then ends the process group.
  void leave();

 private:
  World(std::unique_ptr<JoinedWorld> joined, int rank, int world_size, torch::Device device);
  friend void run_replicas(const std::vector<torch::Device>&, const std::function<void(World&)>&,
                           const JoinOptions&);

  std::unique_ptr<JoinedWorld> joined_;
  int rank_ = 0;
  int world_size_ = 1;
  torch::Device device_{torch::kCPU};
};

// Several replicas in this process, one per entry of `devices` ("cpu" may repeat): a thread
// each, rank i on devices[i], all of one world over a store in memory. Each thread runs
// `replica(world)`; leave() is called for it when it returns. The first replica to throw aborts
// the others' process groups and its exception is rethrown here once all threads have ended.
void run_replicas(const std::vector<torch::Device>& devices,
                  const std::function<void(World&)>& replica, const JoinOptions& options = {});

}  // namespace dptrain
