// dptrain's entry point: parse the command line, wire the library's pieces together, and turn
// every failure into one "error:" line and an exit status (2 for usage, 1 for run time).
#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>
#include <string>

#include <torch/serialize.h>
#include <unistd.h>

#include "cli.h"
#include "dptrain/checkpoint.h"
#include "dptrain/model.h"
#include "progress.h"
#include "signals.h"
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

// One line: c10 errors carry a C++ backtrace after the first line, which is not for users.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

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

// The backend the user named, else NCCL where every replica is a GPU and NCCL was built.
dptrain::Backend choose_backend(const dptrain::TrainCommand& command,
                                const dptrain::WorldPlan& world) {
  if (command.backend) {
    return *command.backend == "nccl" ? dptrain::Backend::kNccl : dptrain::Backend::kGloo;
  }
  const bool all_cuda = world.local_devices.front().is_cuda();
  return all_cuda && dptrain::backend_available(dptrain::Backend::kNccl) ? dptrain::Backend::kNccl
                                                                         : dptrain::Backend::kGloo;
}

int run_train(dptrain::TrainCommand command) {
  const auto world = plan_world(command);
  auto& options = command.options;
  options.backend = choose_backend(command, world);
  dptrain::check_world(options, world);  // usage mistakes before the data is loaded
  const bool reporter = world.first_rank == 0 || command.verbose;
  // With every rank of a launch printing, each line says whose it is.
  const std::string prefix = world.multi_process && command.verbose
                                 ? "[rank " + std::to_string(world.first_rank) + "] "
                                 : "";

  const auto data_dir = dptrain::resolve_data_dir(command.data_dir);
  const auto data = dptrain::load_fashion_mnist(data_dir, command.train_limit, command.test_limit);
  dptrain::ProgressPrinter progress(isatty(STDERR_FILENO) == 1, command.quiet || !reporter,
                                    command.log_every, prefix);
  const auto print = [&](const std::string& line) {
    progress.clear();
    std::printf("%s%s\n", prefix.c_str(), line.c_str());
    std::fflush(stdout);
  };
  if (reporter && !command.quiet) {
    char header[512];
    std::snprintf(header, sizeof header,
                  "dptrain: %lld train / %lld test images from %s; width %lld; rank %d of %d",
                  static_cast<long long>(data.train.size()),
                  static_cast<long long>(data.test.size()), data_dir.c_str(),
                  static_cast<long long>(options.width), world.first_rank, world.world_size);
    print(header);
  }

  options.stop_signal = &dptrain::install_stop_handlers();
  options.progress_every = progress.steps_between_updates();
  dptrain::TrainCallbacks callbacks;
  callbacks.on_progress = [&](const dptrain::ProgressStats& stats) { progress.show(stats); };
  callbacks.on_epoch = [&](const dptrain::EpochStats& stats) {
    if (reporter && !command.quiet) print(dptrain::format_epoch_line(stats));
  };
  callbacks.on_checkpoint = [&](const std::string& path) {
    if (reporter && !command.quiet) print("checkpoint: " + path);
  };
  callbacks.on_resume = [&](const std::string& path) {
    if (reporter && !command.quiet) print("resuming from " + path);
  };
  const auto result = dptrain::train(data, options, world, callbacks);
  progress.clear();
  if (result.skipped_steps > 0 && reporter) {
    print("skipped " + std::to_string(result.skipped_steps) +
          " step(s) with a non-finite gradient (--on-nonfinite skip)");
  }
  if (result.stopped_by != 0) {
    if (reporter) {
      std::fprintf(stderr, "%sdptrain: stopped by signal %d%s\n", prefix.c_str(),
                   result.stopped_by,
                   result.last_checkpoint ? ("; resume from " + *result.last_checkpoint).c_str()
                                          : "");
    }
    return 128 + result.stopped_by;
  }
  if (reporter) print(dptrain::format_final_line(result));
  return 0;
}

// The weights to evaluate, from a checkpoint (which knows its width) or a --save-model file.
std::vector<std::pair<std::string, torch::Tensor>> load_weights(dptrain::EvalCommand& command) {
  if (command.checkpoint) {
    auto checkpoint = dptrain::read_checkpoint(*command.checkpoint);
    command.common.options.width = checkpoint.config.width;
    dptrain::check_checkpoint_matches(
        checkpoint.config,
        dptrain::CheckpointConfig{checkpoint.config.width, dptrain::kNumClasses, 1},
        *command.checkpoint);
    return std::move(checkpoint.tensors);
  }
  const auto width = command.common.options.width;
  dptrain::ResNet model(dptrain::ResNetOptions{dptrain::kNumClasses, 1, width});
  try {
    torch::load(model, *command.model);
  } catch (const c10::Error& e) {
    throw dptrain::DataError("--model " + *command.model +
                             ": not a model of width " + std::to_string(width) +
                             " saved by dptrain train --save-model (" +
                             first_line(e.what_without_backtrace()) + ")");
  }
  return dptrain::model_tensors(*model);
}

int run_download(const dptrain::DownloadCommand& command) {
  throw dptrain::UsageError("download to " + command.directory + ": not built yet");
}

int run_eval(dptrain::EvalCommand command) {
  const auto world = plan_world(command.common);
  auto& options = command.common.options;
  options.backend = choose_backend(command.common, world);
  dptrain::check_world(options, world);
  const auto weights = load_weights(command);
  const auto data_dir = dptrain::resolve_data_dir(command.common.data_dir);
  // Only the test set is evaluated; one training image keeps the data set's shape valid.
  const auto data = dptrain::load_fashion_mnist(data_dir, 1, command.common.test_limit);
  const auto result = dptrain::evaluate_weights(data, options, world, weights);
  if (world.first_rank == 0 || command.common.verbose) {
    std::printf("%s\n", dptrain::format_eval_line(result).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto parsed = dptrain::parse_command_line(argc, argv);
    if (parsed.action == dptrain::ParsedCommandLine::Action::kHelp) {
      std::fputs(parsed.help.c_str(), stdout);
      return 0;
    }
    switch (parsed.action) {
      case dptrain::ParsedCommandLine::Action::kTrain:
        return run_train(parsed.train);
      case dptrain::ParsedCommandLine::Action::kEval:
        return run_eval(parsed.eval);
      case dptrain::ParsedCommandLine::Action::kDownload:
        return run_download(parsed.download);
      case dptrain::ParsedCommandLine::Action::kHelp:
        break;
    }
    return 0;
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
