// Joining a world from a program of one's own. See world.h.
#include "dptrain/parallel/world.h"

#include <ATen/Parallel.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/core/errors.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/joined_world.h"
#include "dptrain/parallel/rendezvous.h"

namespace dptrain {
namespace {

// A GPU this process does not have is refused before any rendezvous, naming it and `where` it
// came from.
void check_device(const torch::Device& device, const std::string& where) {
  if (!device.is_cpu() && !device.is_cuda()) {
    throw UsageError(where + ": device " + device.str() + " is neither a CPU nor a CUDA GPU");
  }
  if (device.is_cuda()) {
    const int gpus = cuda_device_count();
    if (!device.has_index() || device.index() >= gpus) {
      throw UsageError(where + ": device " + device.str() + " is not there: this process sees " +
                       std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s"));
    }
  }
}

Backend pick_backend(const JoinOptions& options, const torch::Device& device) {
  if (options.backend) {
    if (!backend_available(*options.backend)) {
      throw UsageError("backend " + backend_name(*options.backend) +
                       " is not in this build of dptrain");
    }
    return *options.backend;
  }
  return device.is_cuda() && backend_available(Backend::kNccl) ? Backend::kNccl : Backend::kGloo;
}

WorldSeat seat_for(int rank, int world_size, const torch::Device& device,
                   const JoinOptions& options) {
  WorldSeat seat;
  seat.rank = rank;
  seat.world_size = world_size;
  seat.device = device;
  seat.settings = options.settings;
  seat.backend = pick_backend(options, device);
  seat.timeout = options.timeout;
  seat.stop_signal = options.stop_signal;
  return seat;
}

bool is_loopback(const std::string& address) {
  return address == "127.0.0.1" || address == "localhost" || address == "::1";
}

// Where one rank of a multi-process world runs: `device` if given, else GPU LOCAL_RANK where
// there are GPUs, else the CPU.
torch::Device launched_device(const LaunchEnvironment& launch,
                              const std::optional<torch::Device>& device) {
  if (device) return *device;
  const int gpus = cuda_device_count();
  if (gpus == 0) return torch::Device(torch::kCPU);
  if (launch.local_rank >= gpus) {
    throw UsageError(launch.launcher + " started local rank " + std::to_string(launch.local_rank) +
                     " on a machine with " + std::to_string(gpus) +
                     " GPUs: start at most one rank per GPU, or pass each rank its device");
  }
  return {torch::kCUDA, static_cast<torch::DeviceIndex>(launch.local_rank)};
}

}  // namespace

World::World(std::unique_ptr<JoinedWorld> joined, int rank, int world_size, torch::Device device)
    : joined_(std::move(joined)), rank_(rank), world_size_(world_size), device_(device) {}

World::World(World&&) noexcept = default;
World& World::operator=(World&&) noexcept = default;
World::~World() = default;

Communicator& World::communicator() { return joined_->communicator(); }

const std::vector<std::string>& World::devices() const { return joined_->devices(); }

void World::leave() { joined_->leave(); }

World World::join(const ExplicitSeat& seat, const JoinOptions& options) {
  if (seat.world_size < 1) {
    throw UsageError("world size " + std::to_string(seat.world_size) + ": must be at least 1");
  }
  if (seat.rank < 0 || seat.rank >= seat.world_size) {
    throw UsageError("rank " + std::to_string(seat.rank) + " is outside a world of " +
                     std::to_string(seat.world_size) + " (ranks 0 to " +
                     std::to_string(seat.world_size - 1) + ")");
  }
  if (seat.master_port < 1 || seat.master_port > 65535) {
    throw UsageError("master port " + std::to_string(seat.master_port) +
                     ": must be between 1 and 65535");
  }
  const std::string where = "rank " + std::to_string(seat.rank);
  check_device(seat.device, where);
  WorldSeat world_seat = seat_for(seat.rank, seat.world_size, seat.device, options);
  if (seat.world_size > 1) {
    LaunchEnvironment launch;
    launch.launcher = "World::join";
    launch.rank = seat.rank;
    launch.world_size = seat.world_size;
    launch.master_addr = seat.master_addr;
    launch.master_port = seat.master_port;
    world_seat.store = connect_tcp_store(launch, options.timeout);
    world_seat.loopback = is_loopback(seat.master_addr);
  }
  return World(std::make_unique<JoinedWorld>(world_seat), seat.rank, seat.world_size,
               seat.device);
}

World World::from_environment(const JoinOptions& options,
                              const std::optional<torch::Device>& device) {
  const auto launch = read_launch_environment();
  if (!launch) {
    const torch::Device alone =
        device ? *device
               : (cuda_device_count() > 0 ? torch::Device(torch::kCUDA, 0)
                                          : torch::Device(torch::kCPU));
    check_device(alone, "a world of one");
    return World(std::make_unique<JoinedWorld>(seat_for(0, 1, alone, options)), 0, 1, alone);
  }
  const torch::Device mine = launched_device(*launch, device);
  check_device(mine, launch->launcher + " rank " + std::to_string(launch->rank));
  WorldSeat seat = seat_for(launch->rank, launch->world_size, mine, options);
  if (launch->world_size > 1) {
    seat.store = connect_tcp_store(*launch, options.timeout);
    seat.loopback = is_loopback(launch->master_addr);
  }
  return World(std::make_unique<JoinedWorld>(seat), launch->rank, launch->world_size, mine);
}

void run_replicas(const std::vector<torch::Device>& devices,
                  const std::function<void(World&)>& replica, const JoinOptions& options) {
  if (devices.empty()) throw UsageError("run_replicas: no devices given");
  const auto count = static_cast<int>(devices.size());
  for (int i = 0; i < count; ++i) {
    check_device(devices[static_cast<size_t>(i)], "replica " + std::to_string(i));
  }
  c10::intrusive_ptr<c10d::Store> store;  // none for a world of one
  if (count > 1) store = make_in_process_store(options.timeout);
  // The process's intra-op threads shared out: under OpenMP each thread sets its own.
  const int threads_each = std::max(1, at::get_num_threads() / count);
  LocalReplicas replicas;
  run_on_threads(count, replicas, [&](int i) {
    at::set_num_threads(threads_each);
    const auto& device = devices[static_cast<size_t>(i)];
    WorldSeat seat = seat_for(i, count, device, options);
    seat.store = store;
    seat.local = count > 1 ? &replicas : nullptr;
    World world(std::make_unique<JoinedWorld>(seat), i, count, device);
    replica(world);
    world.leave();
  });
}

}  // namespace dptrain
