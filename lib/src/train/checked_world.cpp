// check_world and the thread count it vouches for. See checked_world.h.
#include "dptrain/train/checked_world.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/world_plan.h"
#include "dptrain/train/cuda_graph_step.h"
#include "dptrain/train/options.h"
#include "dptrain/train/recipe.h"

namespace dptrain {

namespace {

// Note [Sync-bn needs a GPU per replica]
// Autograd runs the backward pass of each CUDA device on one worker thread of its own
// (torch/csrc/autograd/engine.h: Engine::start_device_threads, one ReadyQueue per device in
// device_ready_queues_); CPU work runs on the calling thread. Two replicas on one GPU in one
// process therefore share that thread, and sync-bn's AllReduceSum::backward, which blocks until
// every replica has contributed, would block it while the other replica's backward waits in the
// same queue: a deadlock. Separate processes have separate engines, so one GPU shared by two
// ranks under a launcher (with --backend gloo) is fine.
void check_sync_bn_devices(const std::vector<torch::Device>& devices) {
  for (size_t i = 0; i < devices.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (devices[i].is_cuda() && devices[i] == devices[j]) {
        throw UsageError("--sync-bn cannot run two replicas on " + device_name(devices[i]) +
                         " in one process: autograd runs one GPU's backward pass on one thread, "
                         "where their statistics all-reduces would wait for each other; give "
                         "each replica its own GPU, or start one process per replica (torchrun)");
      }
    }
  }
}

}  // namespace

// Note [OMP_NUM_THREADS is checked like --threads]
// LibTorch sizes its OpenMP pool from OMP_NUM_THREADS at the first parallel region (the data
// load), before any flag applies: 64 on 2 cores makes a step some 30 times slower, 100000 crashes
// inside libgomp and 0 ends in a c10 backtrace. So the variable gets the checks of --threads
// before anything runs in parallel, and start_intra_op_threads then sets the count itself.
void check_omp_num_threads(const char* value, int cores, int64_t most_threads) {
  if (value == nullptr || *value == '\0') return;
  const std::string text = value;
  const bool digits = text.size() <= 9 && std::all_of(text.begin(), text.end(), [](char c) {
                        return c >= '0' && c <= '9';
                      });
  const std::string shown = "OMP_NUM_THREADS=" + printable(text.substr(0, 40)) + ": ";
  const std::string fix = "; set it to a number of threads from 1 to " +
                          std::to_string(most_threads) + ", or unset it and pass --threads";
  if (!digits || std::stol(text) < 1) {
    throw UsageError(shown + "not a whole number of threads" + fix);
  }
  if (std::stol(text) > most_threads) {
    throw UsageError(shown + "this process may run on " + std::to_string(cores) +
                     " CPU core(s) (more threads than cores only make every step slower)" + fix);
  }
}

ThreadDefault intra_op_threads(const TrainOptions& options, const WorldPlan& world) {
  ThreadDefault chosen;
  if (options.threads > 0) {
    chosen.threads = static_cast<int>(options.threads);
    chosen.reason = std::to_string(chosen.threads) +
                    (chosen.threads == 1 ? " thread" : " threads") + " (--threads)";
  } else {
    // The processes on this host share its cores: a launcher's local ranks; in-process
    // replicas share this process's threads below (train.cpp divides them).
    chosen = default_intra_op_threads(std::getenv("OMP_NUM_THREADS"),
                                      world.multi_process ? world.launch.local_world_size : 1);
  }
  if (const auto replicas = world.local_devices.size(); replicas > 1) {
    chosen.reason += ", shared by " + std::to_string(replicas) + " replicas";
  }
  return chosen;
}

int intra_op_thread_count(const TrainOptions& options, const WorldPlan& world) {
  return intra_op_threads(options, world).threads;
}

void start_intra_op_threads(const CheckedWorld& run) {
  at::set_num_threads(std::max(1, intra_op_thread_count(run.options(), run.world())));
}

CheckedWorld check_world(const TrainOptions& options, const WorldPlan& world) {
  check_checkpoint_options(options);
  check_recipe(options.recipe);
  if (world.local_devices.empty()) throw UsageError("no device to train on");
  if (options.batch_size < world.world_size) {
    throw UsageError("--batch-size " + std::to_string(options.batch_size) +
                     " is smaller than the number of replicas (" +
                     std::to_string(world.world_size) + ")");
  }
  // OpenMP's threads wait for each other at every parallel region: with more of them than
  // cores a step crawls (4096 threads on 2 cores never finished one). Each local replica gets
  // at least one thread, so as many threads as replicas are always allowed.
  const int cores = usable_cpu_cores();
  const auto most_threads =
      std::max<int64_t>(cores, static_cast<int64_t>(world.local_devices.size()));
  if (options.threads > most_threads) {
    throw UsageError("--threads " + std::to_string(options.threads) + ": this process may run on " +
                     std::to_string(cores) + " CPU core(s); give at most " +
                     std::to_string(most_threads) +
                     " (more threads than cores only make every step slower)");
  }
  check_omp_num_threads(std::getenv("OMP_NUM_THREADS"), cores, most_threads);
  if (options.backend == Backend::kNccl && !backend_available(Backend::kNccl)) {
    throw UsageError(
        "--backend nccl: this build of dptrain has no NCCL (it needs a CUDA LibTorch with NCCL "
        "and the nccl.h of its NCCL version at build time: see CMake's 'NCCL support' line); "
        "use --backend gloo");
  }
  if ((world.world_size > 1 || options.process_group_for_one) &&
      !backend_available(options.backend)) {
    throw UsageError("--backend " + backend_name(options.backend) +
                     ": not available in this build of dptrain (Gloo needs its headers, "
                     "libgloo-dev, at build time)");
  }
  if (options.sync_bn) check_sync_bn_devices(world.local_devices);
  check_cuda_graph(options, world, cuda_graph_available());
  if (options.backend == Backend::kNccl) {
    for (size_t i = 0; i < world.local_devices.size(); ++i) {
      if (!world.local_devices[i].is_cuda()) {
        throw UsageError("--backend nccl needs CUDA devices; use --backend gloo for cpu");
      }
      for (size_t j = 0; j < i; ++j) {
        if (world.local_devices[i] == world.local_devices[j]) {
          throw UsageError("--backend nccl cannot run two replicas on " +
                           device_name(world.local_devices[i]) +
                           " (NCCL refuses duplicate GPUs); use --backend gloo");
        }
      }
    }
  }
  // A layout known to corrupt memory on one of the devices is refused before anything runs.
  const auto cpu = detect_cpu_kernels();
  for (const auto& device : world.local_devices) {
    resolve_memory_format(options.memory_format, device, cpu);
  }
  return CheckedWorld(options, world);
}

}  // namespace dptrain
