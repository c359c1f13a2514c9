// The training run as a whole: where it starts (the checkpoint directory), the ranks started, a
// thread each where a process has several. The world was checked before (checked_world.cpp);
// one rank's run is rank.cpp. See train.h.
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
#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/model/autocast.h"
#include "dptrain/model/batch_norm.h"
#include "dptrain/model/model.h"
#include "dptrain/core/devices.h"
#include "dptrain/parallel/rendezvous.h"
#include "dptrain/parallel/replicas.h"
#include "dptrain/train/run_configuration.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_directory.h"
#include "dptrain/train/cuda_graph_step.h"
#include "dptrain/train/memory_budget.h"
#include "rank.h"

namespace dptrain {

namespace {

// What one rank does, training or evaluating: run_rank or evaluate_rank with their inputs bound.
template <typename Result>
using RankJob = std::function<Result(const RankPlan& plan)>;

// "--batch-size 256 and --width 64; lower one of them", or for weights from a file, whose
// width no flag sets, "--batch-size 256 (the weights of F have width 64); lower it".
std::string sizes_to_lower(const TrainOptions& options, const RankPlan& plan) {
  const std::string batch = "--batch-size " + std::to_string(options.batch_size);
  const std::string width = std::to_string(plan.width);
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
    return job(plan);
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

// The layout a rank's replica runs in: the options' choice resolved for its device
// (memory_format.h). LibTorch cannot run a convolution on an empty channels-last batch, which a
// replica meets with sync-bn when the last batch has fewer examples than there are replicas (it
// must still join the statistics all-reduces): such a run uses the contiguous layout throughout,
// the same results up to float rounding.
MemoryFormat rank_memory_format(const TrainOptions& options, const WorldPlan& world,
                                int64_t train_size, const torch::Device& device) {
  const int64_t last_batch = train_size % options.batch_size;
  if (options.sync_bn && last_batch > 0 && last_batch < world.world_size) {
    return MemoryFormat::kContiguous;
  }
  return resolve_memory_format(options.memory_format, device, detect_cpu_kernels());
}

// Runs `job` as one rank per local device (a thread each when there are several) and returns the
// first local replica's result.
template <typename Result>
Result run_world(const FashionMnist& data, const CheckedWorld& run, RankPlan base,
                 const RankJob<Result>& job) {
  const TrainOptions& options = run.options();
  const WorldPlan& world = run.world();
  const auto local = static_cast<int>(world.local_devices.size());
  // Impossible sizes are refused before any allocation (the estimate covers CPU replicas; a
  // GPU's allocator reports its own failure, turned into one line below).
  if (const auto available = available_host_memory();
      available && world.local_devices[0].is_cpu()) {
    const int64_t shard =
        shard_range(std::min(options.batch_size, std::max<int64_t>(data.train.size(), 1)),
                    world.world_size, 0)
            .second;
    check_host_memory(base.width, shard, local, *available,
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
  const auto plan_for = [&](int i) {
    RankPlan plan = base;
    plan.rank = world.first_rank + i;
    plan.first_local = i == 0;
    plan.device = world.local_devices[static_cast<size_t>(i)];
    plan.memory_format = rank_memory_format(options, world, data.train.size(), plan.device);
    return plan;
  };

  if (local == 1) return run_reporting_memory(job, options, plan_for(0));

  // Replicas in this process: a thread each.
  LocalReplicas replicas;
  base.local = &replicas;
  return run_local_ranks<Result>(local, replicas, [&](int i) {
    return run_reporting_memory(job, options, plan_for(i));
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
  // differently). tests/integration/test_resume.cpp measures both.
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

TrainResult train(const FashionMnist& data, const CheckedWorld& run,
                  const TrainCallbacks& callbacks) {
  const TrainOptions& options = run.options();
  const WorldPlan& world = run.world();
  check_not_empty(data.train, "training");
  check_not_empty(data.test, "test");
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
  base.width = options.width;
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
  const RankJob<TrainResult> job = [&](const RankPlan& plan) {
    return run_rank(data, options, plan, callbacks);
  };
  return run_world(data, run, base, job);
}

EvalResult evaluate_weights(const FashionMnist& data, const CheckedWorld& run,
                            const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                            int64_t width, const std::string& name) {
  const TrainOptions& options = run.options();
  check_not_empty(data.test, "test");
  RankPlan base;
  base.weights = &weights;
  base.start_name = name;
  base.width = width;
  base.width_from = "the weights of " + name;
  base.settings = settings_text(
      run_settings(options, describe_set(data.train, dataset_digest(data.train)),
                   describe_set(data.test, dataset_digest(data.test)), "the weights to evaluate"));
  const RankJob<EvalResult> job = [&](const RankPlan& plan) {
    return evaluate_rank(data, options, plan);
  };
  return run_world(data, run, base, job);
}

}  // namespace dptrain
