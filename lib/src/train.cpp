// The training run: rendezvous, replicas, the step and the epoch. See train.h.
#include "dptrain/train.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "dptrain/batch_norm.h"
#include "dptrain/batching.h"
#include "dptrain/devices.h"
#include "dptrain/errors.h"
#include "dptrain/model.h"
#include "dptrain/rendezvous.h"
#include "dptrain/replicas.h"

namespace dptrain {
namespace {

namespace F = torch::nn::functional;

// Everything one rank needs to know to run.
struct RankPlan {
  int rank = 0;
  int world_size = 1;
  torch::Device device{torch::kCPU};
  int threads = 1;
  c10::intrusive_ptr<c10d::Store> store;  // null for a world of one
  bool loopback = true;
  bool first_local = true;  // the first replica of this process: it calls the callbacks
};

// The data one rank trains and evaluates on, moved to its device once: 55 MB as bytes, so that
// no step copies from the host.
struct DeviceData {
  torch::Tensor train_images;  // (N_train, 28, 28) uint8
  torch::Tensor train_labels;  // (N_train) int64
  torch::Tensor test_images;   // (N_test, 28, 28) uint8
  torch::Tensor test_labels;   // (N_test) int64
};

// Sums of a pass over data: cross-entropy, correct predictions, examples. Kept on the device as
// float64 and read once at the end, so the loop never waits for the host.
struct Tally {
  torch::Tensor sums;  // (3): loss sum, correct, count

  explicit Tally(const torch::Device& device)
      : sums(torch::zeros({3}, torch::dtype(torch::kFloat64).device(device))) {}

  void add(const torch::Tensor& loss_sum, const torch::Tensor& logits,
           const torch::Tensor& labels) {
    sums[0] += loss_sum.detach().to(torch::kFloat64);
    sums[1] += logits.argmax(1).eq(labels).sum().to(torch::kFloat64);
    sums[2] += static_cast<double>(labels.size(0));
  }
  // Sums over all ranks; returns {mean loss, accuracy, count}.
  std::array<double, 3> reduce(Communicator& communicator, const std::string& what) {
    communicator.allreduce_sum(sums, what);
    const auto host = sums.to(torch::kCPU);
    const double count = host[2].item<double>();
    return {host[0].item<double>() / std::max(count, 1.0),
            host[1].item<double>() / std::max(count, 1.0), count};
  }
};

// The evaluation after each epoch: every rank takes a contiguous shard of the test set.
std::array<double, 3> evaluate(ResNet& model, const DeviceData& data, int64_t batch_size,
                               Communicator& communicator) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto [begin, end] =
      shard_range(data.test_labels.size(0), communicator.world_size(), communicator.rank());
  Tally tally(data.test_labels.device());
  for (int64_t i = begin; i < end; i += batch_size) {
    const int64_t n = std::min(batch_size, end - i);
    auto x = to_model_input(data.test_images.narrow(0, i, n));  // (n, 1, 28, 28)
    auto y = data.test_labels.narrow(0, i, n);                  // (n)
    auto logits = model->forward(x);                            // (n, 10)
    tally.add(F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().reduction(torch::kSum)),
              logits, y);
  }
  return tally.reduce(communicator, "evaluation counts");
}

void save_model_atomically(ResNet& model, const std::string& path) {
  // Written next to the target and renamed, so a crash never leaves a half-written file there.
  const std::string temporary = path + ".tmp";
  model->to(torch::kCPU);
  try {
    torch::save(model, temporary);
  } catch (const std::exception& e) {
    std::remove(temporary.c_str());
    throw DataError("--save-model " + path + ": cannot write: " + e.what());
  }
  // std::rename, not std::filesystem: see data.cpp on PyPI's libtorch.so.
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    throw DataError("--save-model " + path + ": cannot write: " + reason);
  }
}

// ---- One rank -----------------------------------------------------------------

TrainResult run_rank(const FashionMnist& data, const TrainOptions& options, const RankPlan& plan,
                     const EpochCallback& on_epoch, const StepCallback& on_step) {
  at::set_num_threads(plan.threads);  // intra-op threads are per calling thread under OpenMP
  // This thread's current device: new tensors, NCCL and cuDNN handles go where the replica is.
  const c10::DeviceGuard device_guard(plan.device);
  // The callbacks run on one rank per process, the first of this process's replicas; whether
  // anything is printed is the caller's choice. The model is saved by global rank 0 only.
  const bool reporter = plan.first_local;

  // Rendezvous: every rank present, agreeing on the world, then the process group.
  TrainResult result;
  result.world_size = plan.world_size;
  std::unique_ptr<Communicator> communicator;
  if (plan.world_size == 1) {
    communicator = std::make_unique<Communicator>();
    result.devices = {device_name(plan.device)};
  } else {
    store_barrier(*plan.store, "rendezvous", plan.rank, plan.world_size, options.timeout);
    result.devices = all_gather_strings(*plan.store, "devices", plan.rank, plan.world_size,
                                        device_name(plan.device), options.timeout);
    WorldOptions world_options;
    world_options.backend = options.backend;
    world_options.timeout = options.timeout;
    world_options.loopback = plan.loopback;
    communicator =
        std::make_unique<Communicator>(plan.store, plan.rank, plan.world_size, world_options);
  }

  // The replica: the same seed on every rank, and rank 0's state broadcast to make sure.
  ResNet model(ResNetOptions{kNumClasses, /*in_channels=*/1, options.width});
  init_reference_weights(*model, options.seed);
  model->to(plan.device);
  if (options.sync_bn) set_batch_norm_sync(*model, communicator.get());
  broadcast_from_rank0(*model, *communicator);
  result.parameter_count = count_parameters(*model);

  Reducer reducer(model->parameters(), *communicator, options.bucket_bytes);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(options.lr));

  const DeviceData device_data{data.train.images.to(plan.device), data.train.labels.to(plan.device),
                               data.test.images.to(plan.device), data.test.labels.to(plan.device)};
  const int64_t num_train = data.train.size();
  const int64_t batches_per_epoch = num_batches(num_train, options.batch_size);

  int64_t global_step = 0;
  for (int64_t epoch = 0; epoch < options.epochs; ++epoch) {
    if (options.max_steps > 0 && global_step >= options.max_steps) break;
    const auto order_host = epoch_order(num_train, options.seed, epoch);
    const auto order = torch::tensor(order_host, torch::kInt64).to(plan.device);  // (N_train)
    model->train();
    Tally tally(plan.device);

    synchronize(plan.device);
    const auto start = std::chrono::steady_clock::now();
    int64_t steps = 0;
    for (int64_t b = 0; b < batches_per_epoch; ++b) {
      if (options.max_steps > 0 && global_step >= options.max_steps) break;
      const auto [begin, end] = batch_range(num_train, options.batch_size, b);
      const int64_t global_batch = end - begin;
      const auto [shard_begin, shard_end] = shard_range(global_batch, plan.world_size, plan.rank);
      const auto index = order.narrow(0, begin + shard_begin, shard_end - shard_begin);  // (n)
      const auto x =
          to_model_input(device_data.train_images.index_select(0, index));  // (n,1,28,28)
      const auto y = device_data.train_labels.index_select(0, index);       // (n)

      // zero grad -> forward -> loss -> backward (buckets all-reduce as they fill) -> wait -> step
      reducer.zero_grad();
      torch::Tensor loss_sum, logits;
      if (index.size(0) > 0 || options.sync_bn) {
        logits = model->forward(x);  // (n, 10)
        loss_sum = F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().reduction(torch::kSum));
      } else {
        // A replica with no examples (a global batch smaller than the world) still joins every
        // gradient all-reduce, with zeros. (With sync-bn it runs the empty forward instead, to
        // join the statistics all-reduces too.)
        loss_sum = torch::zeros({}, torch::dtype(torch::kFloat32).device(plan.device));
        for (const auto& p : model->parameters()) loss_sum = loss_sum + p.sum() * 0.0;
        logits = torch::zeros({0, kNumClasses}, loss_sum.options());
      }
      // Each replica divides its summed loss by the GLOBAL batch size, so the all-reduced sum
      // of gradients is exactly the gradient of the mean loss over the global batch, however
      // unevenly the batch splits over the replicas.
      const auto loss = loss_sum / static_cast<double>(global_batch);
      reducer.prepare_for_backward();
      loss.backward();
      reducer.finalize_backward();
      optimizer.step();

      tally.add(loss_sum, logits, y);
      ++steps;
      ++global_step;
      if (reporter && on_step) {
        on_step(StepStats{epoch + 1, steps, batches_per_epoch,
                          loss_sum.item<double>() / std::max<int64_t>(index.size(0), 1)});
      }
      if (options.check_replicas_every > 0 && global_step % options.check_replicas_every == 0) {
        check_replicas_identical(*model, *communicator, global_step);
      }
    }
    synchronize(plan.device);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    EpochStats stats;
    stats.epoch = epoch + 1;
    stats.epochs = options.epochs;
    stats.steps = steps;
    stats.seconds = seconds;
    const auto train_totals = tally.reduce(*communicator, "training loss and accuracy");
    stats.train_loss = train_totals[0];
    stats.train_acc = train_totals[1];
    stats.images_per_second = seconds > 0 ? train_totals[2] / seconds : 0;
    if (!std::isfinite(stats.train_loss)) {
      throw std::runtime_error(
          "epoch " + std::to_string(epoch + 1) + ": the training loss is not finite (" +
          std::to_string(stats.train_loss) + "); the learning rate may be too high");
    }
    // Every rank must evaluate the same model: average the per-replica running statistics.
    average_buffers(*model, *communicator);
    const auto test_totals = evaluate(model, device_data, options.batch_size, *communicator);
    stats.test_loss = test_totals[0];
    stats.test_acc = test_totals[1];
    result.epochs.push_back(stats);
    if (reporter && on_epoch) on_epoch(stats);
  }
  if (options.check_replicas_every > 0)
    check_replicas_identical(*model, *communicator, global_step);
  if (plan.rank == 0 && options.save_model) save_model_atomically(model, *options.save_model);
  // No rank leaves while others may still talk to it.
  communicator->barrier("final barrier");
  return result;
}

}  // namespace

// ---- The world ------------------------------------------------------------------

void check_world(const TrainOptions& options, const WorldPlan& world) {
  if (world.local_devices.empty()) throw UsageError("no device to train on");
  if (options.batch_size < world.world_size) {
    throw UsageError("--batch-size " + std::to_string(options.batch_size) +
                     " is smaller than the number of replicas (" +
                     std::to_string(world.world_size) + ")");
  }
  if (options.backend == Backend::kNccl && !backend_available(Backend::kNccl)) {
    throw UsageError(
        "--backend nccl: this build of dptrain has no NCCL (it needs a CUDA LibTorch with NCCL "
        "at build time); use --backend gloo");
  }
  if (world.world_size > 1 && !backend_available(options.backend)) {
    throw UsageError("--backend " + backend_name(options.backend) +
                     ": not available in this build of dptrain (Gloo needs its headers, "
                     "libgloo-dev, at build time)");
  }
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
}

TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const EpochCallback& on_epoch, const StepCallback& on_step) {
  check_world(options, world);
  const auto local = static_cast<int>(world.local_devices.size());
  const int total_threads =
      options.threads > 0 ? static_cast<int>(options.threads) : at::get_num_threads();
  RankPlan base;
  base.world_size = world.world_size;
  base.threads = std::max(1, total_threads / local);
  base.loopback = !world.multi_process;
  if (world.world_size > 1) {
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
    return run_rank(data, options, plan, on_epoch, on_step);
  }

  // Replicas in this process: a thread each. The first failure is reported; the others usually
  // follow from it (their peer left) and would only hide the cause.
  std::vector<TrainResult> results(static_cast<size_t>(local));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(local));
  std::vector<std::thread> threads;
  for (int i = 0; i < local; ++i) {
    threads.emplace_back([&, i] {
      RankPlan plan = base;
      plan.rank = world.first_rank + i;
      plan.first_local = i == 0;
      plan.device = world.local_devices[static_cast<size_t>(i)];
      try {
        results[static_cast<size_t>(i)] = run_rank(data, options, plan, on_epoch, on_step);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  // Prefer a rank's own failure over a collective error that merely reports a missing peer.
  std::exception_ptr first_collective;
  for (auto& error : errors) {
    if (!error) continue;
    try {
      std::rethrow_exception(error);
    } catch (const CollectiveError&) {
      if (!first_collective) first_collective = error;
    } catch (...) {
      throw;
    }
  }
  if (first_collective) std::rethrow_exception(first_collective);
  return results.front();
}

}  // namespace dptrain
