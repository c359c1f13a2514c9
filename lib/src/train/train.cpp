// The training run as a whole: where it starts (the checkpoint directory's resume policy), the
// settings every rank must agree on, the ranks started, a thread each where a process has several.
// The world was checked before (checked_world.cpp); one rank's run is rank.cpp. See train.h.
#include "dptrain/data/data.h"
#include "dptrain/parallel/world_plan.h"
#include "dptrain/train/callbacks.h"
#include "dptrain/train/checked_world.h"
#include "dptrain/train/checkpoint_types.h"
#include "dptrain/train/epoch_stats.h"
#include "dptrain/train/train.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/core/sha256.h"
#include "dptrain/data/batching.h"
#include "dptrain/model/autocast.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/parallel/joined_world.h"
#include "dptrain/parallel/rendezvous.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_directory.h"
#include "dptrain/train/memory_budget.h"
#include "dptrain/train/run_configuration.h"
#include "rank.h"

namespace dptrain {

namespace {

// "--batch-size 256 and --width 64; lower one of them", or for weights from a file, whose
// width no flag sets, "--batch-size 256 (the weights of F have width 64); lower it".
std::string sizes_to_lower(const TrainOptions& options, const RankPlan& plan) {
  const std::string batch = "--batch-size " + std::to_string(options.batch_size);
  const std::string width = std::to_string(plan.width);
  if (plan.width_from.empty()) return batch + " and --width " + width + "; lower one of them";
  return batch + " (" + plan.width_from + " has width " + width + "); lower --batch-size";
}

// Called in a handler of a rank's failure: an allocator's failure becomes one line that says what
// to change; anything else is rethrown as it is.
[[noreturn]] void rethrow_reporting_memory(const TrainOptions& options, const RankPlan& plan) {
  const std::string where =
      "rank " + std::to_string(plan.rank) + " on " + device_name(plan.device) + ": out of memory";
  try {
    throw;
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

// Runs `run_one(i)` for the `local` replicas of this process, a thread each (run_on_threads,
// joined_world.h), and returns the first's result.
template <typename Result>
Result run_local_ranks(int local, LocalReplicas& replicas,
                       const std::function<Result(int)>& run_one) {
  std::vector<Result> results(static_cast<size_t>(local));
  run_on_threads(local, replicas,
                 [&](int i) { results[static_cast<size_t>(i)] = run_one(i); });
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

// Runs one rank per local device (a thread each when there are several): run_rank for a
// TrainResult, evaluate_rank for an EvalResult (rank.h). Returns the first local replica's result.
template <typename Result>
Result run_world(const FashionMnist& data, const CheckedWorld& run, RankPlan base,
                 const TrainCallbacks& callbacks) {
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
  const CpuBf16KernelsGuard bf16_kernels(world.local_devices.front(), options.amp,
                                         detect_cpu_kernels());
  const int total_threads = intra_op_thread_count(options, world);
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
  LocalReplicas replicas;  // with several in this process, a thread each
  if (local > 1) base.local = &replicas;
  const auto run_one = [&](int i) -> Result {
    RankPlan plan = base;
    plan.rank = world.first_rank + i;
    plan.first_local = i == 0;
    plan.device = world.local_devices[static_cast<size_t>(i)];
    plan.memory_format = rank_memory_format(options, world, data.train.size(), plan.device);
    try {
      if constexpr (std::is_same_v<Result, TrainResult>) {
        return run_rank(data, options, plan, callbacks);
      } else {
        return evaluate_rank(data, options, plan);
      }
    } catch (...) {
      rethrow_reporting_memory(options, plan);
    }
  };
  if (local == 1) return run_one(0);
  return run_local_ranks<Result>(local, replicas, run_one);
}

// An empty set would fail deep inside (a batch of no examples) or report the accuracy of
// nothing; the loaders name the file, this catches a caller's own data.
void check_not_empty(const Dataset& set, const char* which) {
  if (set.size() == 0) {
    throw DataError(std::string("the ") + which +
                    " set holds 0 images; dptrain needs at least one");
  }
}

// Note [The ranks of an eval agree on the weights]
// Under a launcher every rank of `eval` reads its own --model or --checkpoint (on its own host,
// a copy of its own), and rank 0 prints the figures of all of them together: ranks holding
// different weights would print one result for files none of them evaluated alone. So the
// weights' content (each tensor's name, type, shape and bytes, in file order) goes into the
// settings the ranks compare at the rendezvous, as the data sets' digests do: a rank whose
// weights differ is refused by name before any image is evaluated. The path is not compared:
// the same weights may lie at different paths on different hosts.
std::string weights_digest(const std::vector<std::pair<std::string, torch::Tensor>>& weights) {
  Sha256 hash;
  for (const auto& [name, tensor] : weights) {
    const auto bytes = tensor.to(torch::kCPU).contiguous();
    std::string shape;
    for (const auto size : bytes.sizes()) shape += " " + std::to_string(size);
    hash.update(name + "\n" + std::string(c10::toString(bytes.scalar_type())) + shape + "\n");
    hash.update(bytes.data_ptr(), static_cast<size_t>(bytes.numel()) * bytes.element_size());
  }
  return hash.hex_digest();
}

// A resume whose checkpoint is at or past where this run would stop: the one line that says so
// and why, or "" when there is training left. The loop then takes no step, and the driver
// prints no result (TrainResult::steps_run is 0): the history's last epoch is the checkpoint's
// figure, not this run's.
std::string nothing_left_to_train(const TrainOptions& options, const Checkpoint& checkpoint,
                                  const std::string& path) {
  std::string why;
  if (checkpoint.epochs_done >= options.epochs) {
    why = path + " has finished " + std::to_string(checkpoint.epochs_done) +
          " epoch(s) and --epochs is " + std::to_string(options.epochs);
  } else if (options.max_steps > 0 && checkpoint.global_step >= options.max_steps) {
    why = path + " is at global step " + std::to_string(checkpoint.global_step) +
          " and --max-steps is " + std::to_string(options.max_steps);
  } else {
    return "";
  }
  return "nothing left to train: the checkpoint " + why +
         "; this run takes no step and reports no result" +
         (options.save_model ? "; --save-model " + *options.save_model +
                                   " gets the checkpoint's weights as they are"
                             : std::string()) +
         " (raise --epochs or --max-steps to train on)";
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
  const auto start = choose_start(options, writer, callbacks.on_notice);
  const std::string train_digest = dataset_digest(data.train);
  RankPlan base;
  base.width = options.width;
  base.train_digest = train_digest;
  if (start) {
    const auto& [path, checkpoint] = *start;
    check_resumable(checkpoint, path,
                    checkpoint_config(options, data.train.size(), world.world_size, train_digest),
                    callbacks.on_notice);
    if (const auto nothing = nothing_left_to_train(options, checkpoint, path);
        !nothing.empty() && callbacks.on_notice) {
      callbacks.on_notice(nothing);
    }
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
  return run_world<TrainResult>(data, run, base, callbacks);
}

EvalResult evaluate_weights(const FashionMnist& data, const CheckedWorld& run,
                            const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                            int64_t width, const std::string& name, bool with_logits) {
  const TrainOptions& options = run.options();
  check_not_empty(data.test, "test");
  RankPlan base;
  base.weights = &weights;
  base.start_name = name;
  base.width = width;
  base.width_from = "the weights of " + name;
  base.collect_logits = with_logits;
  auto settings =
      run_settings(options, describe_set(data.train, dataset_digest(data.train)),
                   describe_set(data.test, dataset_digest(data.test)), "the weights to evaluate");
  // Note [The ranks of an eval agree on the weights]
  settings.emplace_back("the weights' SHA-256", weights_digest(weights));
  base.settings = settings_text(settings);
  return run_world<EvalResult>(data, run, base, TrainCallbacks{});
}

}  // namespace dptrain
