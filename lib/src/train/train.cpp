// The training run as a whole: the world checked, where it starts (the checkpoint directory),
// the ranks started, a thread each where a process has several. One rank's run is rank.cpp.
// See train.h.
#include "dptrain/train/train.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <torch/nn/functional/loss.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>

#include "dptrain/data/batch_input.h"
#include "dptrain/data/batching.h"
#include "dptrain/errors.h"
#include "dptrain/io/files.h"
#include "dptrain/model/autocast.h"
#include "dptrain/model/batch_norm.h"
#include "dptrain/model/model.h"
#include "dptrain/parallel/devices.h"
#include "dptrain/parallel/rendezvous.h"
#include "dptrain/parallel/replicas.h"
#include "dptrain/parallel/run_configuration.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_directory.h"
#include "dptrain/train/cuda_graph_step.h"
#include "dptrain/train/memory_budget.h"
#include "rank.h"

namespace dptrain {

// ---- The world ------------------------------------------------------------------

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

// Note [OMP_NUM_THREADS is checked like --threads]
// LibTorch sizes its OpenMP pool from OMP_NUM_THREADS at the first parallel region (the data
// load), before any flag applies: 64 on 2 cores made a step 30 times slower, 100000 crashed
// inside libgomp and 0 ended in a c10 backtrace. So the variable gets the checks of --threads
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

int intra_op_thread_count(const TrainOptions& options) {
  return options.threads > 0 ? static_cast<int>(options.threads)
                             : default_intra_op_threads(std::getenv("OMP_NUM_THREADS"));
}

void start_intra_op_threads(const TrainOptions& options) {
  at::set_num_threads(std::max(1, intra_op_thread_count(options)));
}

void check_world(const TrainOptions& options, const WorldPlan& world) {
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
}

namespace {

// What one rank does, training or evaluating: run_rank or evaluate_rank with their inputs bound.
template <typename Result>
using RankJob = std::function<Result(const TrainOptions& options, const RankPlan& plan)>;

// "--batch-size 256 and --width 64; lower one of them", or for weights from a file, whose
// width no flag sets, "--batch-size 256 (the weights of F have width 64); lower it".
std::string sizes_to_lower(const TrainOptions& options, const RankPlan& plan) {
  const std::string batch = "--batch-size " + std::to_string(options.batch_size);
  const std::string width = std::to_string(options.width);
  if (plan.width_from.empty()) return batch + " and --width " + width + "; lower one of them";
  return batch + " (" + plan.width_from + " has width " + width + "); lower --batch-size";
}

// A rank's job, with an allocator's failure turned into one line that says what to change.
template <typename Result>
Result run_reporting_memory(const RankJob<Result>& job, const TrainOptions& options,
                            const RankPlan& plan) {
  const std::string where =
      "rank " + std::to_string(plan.rank) + " on " + device_name(plan.device) + ": out of memory";
  try {
    return job(options, plan);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    // CUDA's allocator says "out of memory", the CPU's "not enough memory" (1.13 and 2.x).
    if (what.find("out of memory") == std::string::npos &&
        what.find("not enough memory") == std::string::npos &&
        what.find("can't allocate memory") == std::string::npos) {
      throw;
    }
    throw std::runtime_error(where + " with " + sizes_to_lower(options, plan) + " (LibTorch: " +
                             what.substr(0, what.find('\n')) + ")");
  } catch (const std::bad_alloc&) {
    throw std::runtime_error(where + " with " + sizes_to_lower(options, plan));
  }
}

// The failure to report among this process's replicas: a rank's own failure over a collective
// error that merely reports a missing peer, and among collective errors the first to happen
// (`order[i]`: when rank i failed, 1 for the first).
void rethrow_first_failure(const std::vector<std::exception_ptr>& errors,
                           const std::vector<int>& order) {
  std::exception_ptr first_collective;
  int first_order = 0;
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const CollectiveError&) {
      if (!first_collective || order[i] < first_order) {
        first_collective = errors[i];
        first_order = order[i];
      }
    } catch (...) {
      throw;
    }
  }
  if (first_collective) std::rethrow_exception(first_collective);
}

// Runs `run_one(i)` for the `local` replicas of this process, a thread each, and returns the
// first's result. The first failure aborts the others' process groups (so that they end at once)
// and is reported; the others follow from it (their peer left) and would only hide the cause.
template <typename Result>
Result run_local_ranks(int local, LocalReplicas& replicas,
                       const std::function<Result(int)>& run_one) {
  std::vector<Result> results(static_cast<size_t>(local));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(local));
  std::vector<int> failure_order(static_cast<size_t>(local), 0);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < local; ++i) {
    threads.emplace_back([&, i] {
      try {
        results[static_cast<size_t>(i)] = run_one(i);
      } catch (...) {
        failure_order[static_cast<size_t>(i)] = ++failures;
        errors[static_cast<size_t>(i)] = std::current_exception();
        replicas.abort_all();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  rethrow_first_failure(errors, failure_order);
  return results.front();
}

// Runs `job` as one rank per local device (a thread each when there are several) and returns the
// first local replica's result.
template <typename Result>
Result run_world(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                 RankPlan base, const RankJob<Result>& job) {
  check_world(options, world);
  // LibTorch cannot run a convolution on an empty channels-last batch, which a replica meets
  // with sync-bn when the last batch has fewer examples than there are replicas (it must still
  // join the statistics all-reduces). Such a run uses the contiguous layout throughout: the same
  // results up to float rounding.
  const int64_t last_batch = data.train.size() % options.batch_size;
  if (options.sync_bn && options.memory_format != MemoryFormat::kContiguous && last_batch > 0 &&
      last_batch < world.world_size) {
    TrainOptions contiguous = options;
    contiguous.memory_format = MemoryFormat::kContiguous;
    return run_world(data, contiguous, world, base, job);
  }
  // Each rank lays out its replica for its own device (memory_format.h).
  const auto cpu = detect_cpu_kernels();
  const auto options_for = [&](const torch::Device& device) {
    TrainOptions rank_options = options;
    rank_options.memory_format = resolve_memory_format(options.memory_format, device, cpu);
    return rank_options;
  };

  const auto local = static_cast<int>(world.local_devices.size());
  // Impossible sizes are refused before any allocation (the estimate covers CPU replicas; a
  // GPU's allocator reports its own failure, turned into one line below).
  if (const auto available = available_host_memory();
      available && world.local_devices[0].is_cpu()) {
    const int64_t shard =
        shard_range(std::min(options.batch_size, std::max<int64_t>(data.train.size(), 1)),
                    world.world_size, 0)
            .second;
    check_host_memory(options.width, shard, local, *available,
                      base.width_from.empty() ? "--batch-size and --width"
                                              : "--batch-size with " + base.width_from);
  }
  if (world.local_devices.front().is_cuda()) {
    at::globalContext().setBenchmarkCuDNN(options.cudnn_benchmark);
  }
  const int total_threads = intra_op_thread_count(options);
  base.world_size = world.world_size;
  base.threads = std::max(1, total_threads / local);
  base.loopback = !world.multi_process;
  if (world.world_size > 1 || options.process_group_for_one) {
    if (world.multi_process) {
      base.store = connect_tcp_store(world.launch, options.timeout);
      base.loopback =
          world.launch.master_addr == "127.0.0.1" || world.launch.master_addr == "localhost";
    } else {
      base.store = make_in_process_store(options.timeout);
    }
  }

  if (local == 1) {
    RankPlan plan = base;
    plan.rank = world.first_rank;
    plan.device = world.local_devices[0];
    return run_reporting_memory(job, options_for(plan.device), plan);
  }

  // Replicas in this process: a thread each.
  LocalReplicas replicas;
  base.local = &replicas;
  return run_local_ranks<Result>(local, replicas, [&](int i) {
    RankPlan plan = base;
    plan.rank = world.first_rank + i;
    plan.first_local = i == 0;
    plan.device = world.local_devices[static_cast<size_t>(i)];
    return run_reporting_memory(job, options_for(plan.device), plan);
  });
}

}  // namespace

namespace {

// An empty set would fail deep inside (a batch of no examples) or report the accuracy of
// nothing; the loaders name the file, this catches a caller's own data.
void check_not_empty(const Dataset& set, const char* which) {
  if (set.size() == 0) {
    throw DataError(std::string("the ") + which +
                    " set holds 0 images; dptrain needs at least one");
  }
}

// Note [What a checkpoint directory may hold]
// A run never writes over a checkpoint it did not read. Without --resume, a directory that already
// holds checkpoints is refused (they would be overwritten) unless --fresh removes them first.
// With --resume, every file is read and the latest position stored inside wins, whatever the
// names say; a file that cannot be read is named with the reason, and is refused when nothing
// else can be read or when the run would later save under its name. One process writes: the one
// that holds global rank 0, under the directory's lock (checkpoint_directory.h).
std::optional<std::pair<std::string, Checkpoint>> choose_start(const TrainOptions& options,
                                                               bool writer,
                                                               const TrainCallbacks& callbacks) {
  if (!options.checkpoint_dir) return std::nullopt;
  const std::string& directory = *options.checkpoint_dir;
  const auto notice = [&](const std::string& text) {
    if (writer && callbacks.on_notice) callbacks.on_notice(text);
  };
  const std::string fresh_hint =
      "move it away, or pass --fresh to start over (which removes the directory's checkpoints)";
  if (writer && (options.fresh || options.resume)) {
    for (const auto& path : remove_stale_temporaries(directory)) {
      notice("removed " + path + ", left by a writer that was killed during a write");
    }
  }
  if (options.fresh) {
    if (!writer) return std::nullopt;
    for (const auto& path : remove_checkpoints_for_fresh_start(directory)) {
      notice("--fresh: removed " + path);
    }
    return std::nullopt;
  }
  if (!options.resume) {
    const auto names = checkpoint_file_names(directory);
    if (!writer || names.empty()) return std::nullopt;
    throw UsageError("--checkpoint-dir " + directory + " already holds " +
                     std::to_string(names.size()) + " checkpoint(s) (" + names.back() +
                     (names.size() > 1 ? " and others" : "") +
                     ") that this run would overwrite; pass --resume to continue from the "
                     "newest, or --fresh to start over (which removes them)");
  }
  auto scan = scan_checkpoint_directory(directory);
  const std::string start_name = scan.newest
                                     ? directory + "/" +
                                           checkpoint_file_name(scan.newest->second.epochs_done,
                                                                scan.newest->second.step_in_epoch)
                                     : "";
  for (const auto& [path, why] : scan.unreadable) {
    if (!scan.newest) {
      throw UsageError("--resume: no checkpoint in " + directory + " can be read (" + why +
                       (scan.unreadable.size() > 1
                            ? "; and " + std::to_string(scan.unreadable.size() - 1) + " more"
                            : "") +
                       "); " + fresh_hint);
    }
    if (named_before(start_name, path)) {
      throw UsageError("--resume: " + why + "; this run resumes from " + scan.newest->first +
                       " and would later save under that name; " + fresh_hint);
    }
    notice("--resume: skipped " + why);
  }
  return std::move(scan.newest);
}

// Whether a resumed run continues the data order and model of `checkpoint`: UsageError if not.
void check_resumable(const Checkpoint& checkpoint, const std::string& path,
                     const CheckpointConfig& run, const TrainCallbacks& callbacks) {
  check_checkpoint_matches(checkpoint.config, run, path);
  const auto differ = [&](const char* flag, const std::string& was, const std::string& is) {
    if (was != is) {
      throw UsageError("--resume: checkpoint " + path + " was written with " + flag + " " + was +
                       ", this run has " + is + "; the data order would not continue");
    }
  };
  differ("--batch-size", std::to_string(checkpoint.config.batch_size),
         std::to_string(run.batch_size));
  differ("--seed", std::to_string(checkpoint.config.seed), std::to_string(run.seed));
  differ("a training set of", std::to_string(checkpoint.config.train_size),
         std::to_string(run.train_size));
  // Note [Resuming on another world size]
  // The data order and each global batch depend on --seed and --batch-size only, so a run may
  // continue on another number of ranks. What changes is how a global batch is split: without
  // --sync-bn each replica normalises its own share, so the steps are not those the writing
  // world would have taken; with it they are the same to rounding (the sums are ordered
  // differently). tests/test_resume.cpp measures both.
  if (checkpoint.config.world_size != run.world_size && callbacks.on_notice) {
    callbacks.on_notice("--resume: " + path + " was written by " +
                        std::to_string(checkpoint.config.world_size) + " rank(s), this run has " +
                        std::to_string(run.world_size) +
                        ": the same global batches, split over the new world");
  }
  if (checkpoint.config.train_digest.empty()) {
    if (callbacks.on_notice) {
      callbacks.on_notice("--resume: " + path +
                          " is of format version 1, which holds no digest of its training set; "
                          "only the set's size is compared");
    }
    return;
  }
  differ("the training set of SHA-256", printable(checkpoint.config.train_digest),
         run.train_digest);
}

// "60000 images, SHA-256 ...": a data set as the ranks compare it.
std::string describe_set(const Dataset& set, const std::string& digest) {
  return std::to_string(set.size()) + " images, SHA-256 " + digest;
}

}  // namespace

TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const TrainCallbacks& callbacks) {
  check_world(options, world);
  check_not_empty(data.train, "training");
  check_not_empty(data.test, "test");
  check_checkpoint_options(options);
  // Global rank 0 writes the files: their paths are checked before the first step, so that a
  // bad one fails now and not after the training.
  const bool writer = world.first_rank == 0;
  if (writer && options.save_model) check_output_file(*options.save_model, "--save-model");
  std::optional<CheckpointDirectoryLock> lock;
  if (options.checkpoint_dir) {
    prepare_checkpoint_directory(*options.checkpoint_dir);
    if (writer) lock.emplace(*options.checkpoint_dir);
  }
  const auto start = choose_start(options, writer, callbacks);
  const std::string train_digest = dataset_digest(data.train);
  RankPlan base;
  base.train_digest = train_digest;
  if (start) {
    const auto& [path, checkpoint] = *start;
    check_resumable(checkpoint, path,
                    checkpoint_config(options, data.train.size(), world.world_size, train_digest),
                    callbacks);
    base.start = &checkpoint;
    base.weights = &checkpoint.tensors;
    base.start_name = path;
  }
  // Each process read the directory itself (a shared file system under a launcher); the ranks
  // compare the position they found with everything else at the rendezvous.
  const std::string start_text =
      start ? "the checkpoint at epoch " + std::to_string(start->second.epochs_done) + " step " +
                  std::to_string(start->second.step_in_epoch) + " (global step " +
                  std::to_string(start->second.global_step) + ")"
            : "the beginning";
  base.settings =
      settings_text(run_settings(options, describe_set(data.train, train_digest),
                                 describe_set(data.test, dataset_digest(data.test)), start_text));
  const RankJob<TrainResult> job = [&](const TrainOptions& rank_options, const RankPlan& plan) {
    return run_rank(data, rank_options, plan, callbacks);
  };
  return run_world(data, options, world, base, job);
}

TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const EpochCallback& on_epoch, const StepCallback& on_step) {
  TrainCallbacks callbacks;
  callbacks.on_epoch = on_epoch;
  callbacks.on_step = on_step;
  return train(data, options, world, callbacks);
}

EvalResult evaluate_weights(const FashionMnist& data, const TrainOptions& options,
                            const WorldPlan& world,
                            const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                            const std::string& name) {
  check_not_empty(data.test, "test");
  RankPlan base;
  base.weights = &weights;
  base.start_name = name;
  base.width_from = "the weights of " + name;
  base.settings = settings_text(
      run_settings(options, describe_set(data.train, dataset_digest(data.train)),
                   describe_set(data.test, dataset_digest(data.test)), "the weights to evaluate"));
  const RankJob<EvalResult> job = [&](const TrainOptions& rank_options, const RankPlan& plan) {
    return evaluate_rank(data, rank_options, plan);
  };
  return run_world(data, options, world, base, job);
}

}  // namespace dptrain
