// dptrain's entry point: parse the command line, wire the library's pieces together, and turn
// every failure into one "error:" line and an exit status (2 for usage, 1 for run time).
#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>
#include <string>

#include "cli.h"
#include "dptrain/data.h"
#include "dptrain/devices.h"
#include "dptrain/errors.h"
#include "dptrain/rendezvous.h"
#include "dptrain/report.h"
#include "dptrain/train.h"

namespace {

constexpr int kExitRuntimeFailure = 1;
constexpr int kExitUsage = 2;

using dptrain::UsageError;

// The devices of the replicas in this process, and where this process stands in the world.
dptrain::WorldPlan plan_world(const dptrain::TrainCommand& command) {
  std::vector<torch::Device> devices;
  if (command.gpus) {
    devices = dptrain::first_gpus(*command.gpus);
  } else if (command.devices) {
    devices = dptrain::parse_device_list(*command.devices);
  }

  dptrain::WorldPlan world;
  const auto launch = dptrain::read_launch_environment();
  if (!launch) {
    world.local_devices = devices.empty() ? dptrain::default_devices() : devices;
    world.world_size = static_cast<int>(world.local_devices.size());
    return world;
  }
  // Under a launcher this process is one rank; the device list names this node's devices and
  // LOCAL_RANK picks one (a single "cpu" serves every local rank).
  world.multi_process = true;
  world.first_rank = launch->rank;
  world.world_size = launch->world_size;
  world.launch = *launch;
  const auto local = static_cast<size_t>(launch->local_rank);
  if (devices.empty()) {
    const int gpus = dptrain::cuda_device_count();
    if (gpus == 0) {
      devices = {torch::Device(torch::kCPU)};
    } else if (launch->local_rank < gpus) {
      devices = {torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(launch->local_rank))};
    } else {
      throw UsageError(launch->launcher + " local rank " + std::to_string(launch->local_rank) +
                       " has no GPU: this machine has " + std::to_string(gpus));
    }
  }
  if (devices.size() == 1 && devices[0].is_cpu()) {
    world.local_devices = devices;
  } else if (local < devices.size()) {
    world.local_devices = {devices[local]};
  } else {
    throw UsageError("--devices lists " + std::to_string(devices.size()) +
                     " device(s) but this is local rank " + std::to_string(local));
  }
  return world;
}

int run_train(dptrain::TrainCommand command) {
  const auto world = plan_world(command);
  auto& options = command.options;
  if (command.backend) {
    options.backend =
        *command.backend == "nccl" ? dptrain::Backend::kNccl : dptrain::Backend::kGloo;
  } else {
    const bool all_cuda = world.local_devices.front().is_cuda();
    options.backend = all_cuda && dptrain::backend_available(dptrain::Backend::kNccl)
                          ? dptrain::Backend::kNccl
                          : dptrain::Backend::kGloo;
  }
  dptrain::check_world(options, world);  // usage mistakes before the data is loaded
  const bool reporter = world.first_rank == 0 || command.verbose;
  // With every rank of a launch printing, each line says whose it is.
  const std::string prefix = world.multi_process && command.verbose
                                 ? "[rank " + std::to_string(world.first_rank) + "] "
                                 : "";

  const auto data_dir = dptrain::resolve_data_dir(command.data_dir);
  const auto data = dptrain::load_fashion_mnist(data_dir, command.train_limit, command.test_limit);
  if (reporter) {
    std::printf("%sdptrain: %lld train / %lld test images from %s; width %lld; rank %d of %d\n",
                prefix.c_str(), static_cast<long long>(data.train.size()),
                static_cast<long long>(data.test.size()), data_dir.c_str(),
                static_cast<long long>(options.width), world.first_rank, world.world_size);
    std::fflush(stdout);
  }

  const auto result = dptrain::train(data, options, world, [&](const dptrain::EpochStats& stats) {
    if (!reporter) return;
    std::printf("%s%s\n", prefix.c_str(), dptrain::format_epoch_line(stats).c_str());
    std::fflush(stdout);
  });
  if (reporter) std::printf("%s%s\n", prefix.c_str(), dptrain::format_final_line(result).c_str());
  return 0;
}

// One line: c10 errors carry a C++ backtrace after the first line, which is not for users.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto parsed = dptrain::parse_command_line(argc, argv);
    if (parsed.action == dptrain::ParsedCommandLine::Action::kHelp) {
      std::fputs(parsed.help.c_str(), stdout);
      return 0;
    }
    return run_train(parsed.train);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", first_line(e.what()).c_str());
    return kExitUsage;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "error: %s\n", first_line(e.what_without_backtrace()).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", first_line(e.what()).c_str());
  } catch (...) {
    std::fprintf(stderr, "error: unknown failure\n");
  }
  return kExitRuntimeFailure;
}
