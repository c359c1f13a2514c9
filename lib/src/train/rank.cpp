// One rank's training and evaluation: joining the world, the replica, the step, the epoch,
// checkpoints and the non-finite guard. See rank.h.
#include "rank.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>

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
#include "dptrain/train/checkpoint_directory.h"
#include "dptrain/train/cuda_graph_step.h"
#include "dptrain/train/finite.h"

namespace dptrain {
namespace {

namespace F = torch::nn::functional;

// A rank's options have their layout resolved for its device (run_world): never kAuto here.
bool channels_last(const TrainOptions& options) {
  return options.memory_format == MemoryFormat::kChannelsLast;
}

// A split of the data moved to a rank's device once, as bytes (55 MB for both splits), so that
// no step copies from the host.
struct DeviceSplit {
  torch::Tensor images;  // (N, 28, 28) uint8
  torch::Tensor labels;  // (N) int64
};

DeviceSplit to_device(const Dataset& set, const torch::Device& device) {
  return {set.images.to(device), set.labels.to(device)};
}

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
  // The sums as they stand, read on the host (which waits for the device).
  Totals read() const {
    const auto host = sums.to(torch::kCPU);
    return {host[0].item<double>(), host[1].item<double>(), host[2].item<double>()};
  }
  void set(const Totals& totals) {
    sums.copy_(torch::tensor({totals.loss_sum, totals.correct, totals.count}, torch::kFloat64));
  }
  // Sums over all ranks, in place; returns them.
  Totals reduce(Communicator& communicator, const std::string& what) {
    communicator.allreduce_sum(sums, what);
    communicator.wait_host(what);
    return read();
  }
};

// The evaluation after each epoch: every rank takes a contiguous shard of the test set. Returns
// the sums over all ranks.
Totals evaluate(ResNet& model, const DeviceSplit& test, int64_t batch_size,
                const TrainOptions& options, Communicator& communicator) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto [begin, end] =
      shard_range(test.labels.size(0), communicator.world_size(), communicator.rank());
  Tally tally(test.labels.device());
  for (int64_t i = begin; i < end; i += batch_size) {
    const int64_t n = std::min(batch_size, end - i);
    auto x = to_model_input(test.images.narrow(0, i, n));  // (n, 1, 28, 28)
    if (channels_last(options)) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    auto y = test.labels.narrow(0, i, n);  // (n)
    torch::Tensor logits;                  // (n, 10)
    {
      const AutocastGuard autocast(x.device(), options.amp);
      logits = model->forward(x);
    }
    logits = logits.to(torch::kFloat32);
    tally.add(F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().reduction(torch::kSum)),
              logits, y);
  }
  return tally.reduce(communicator, "evaluation counts");
}

// Note [A model file is a checkpoint]
// --save-model writes the checkpoint format (checkpoint.h) at the run's final position: plain
// tensors with their names, shapes and dtypes, read back by a strict reader that runs nothing.
// It used to be torch::save's TorchScript archive, which torch::load compiles and runs: a
// crafted file's code (its __setstate__ included) hung `eval`, allocated gigabytes or printed
// a forged result line. scripts/read_checkpoint.py turns a model file into a PyTorch state_dict.
void save_model_atomically(ResNet& model, const CheckpointConfig& config, int64_t epochs_done,
                           int64_t step_in_epoch, int64_t global_step,
                           const std::vector<EpochStats>& history, const std::string& path) {
  Checkpoint weights;
  weights.config = config;
  weights.epochs_done = epochs_done;
  weights.step_in_epoch = step_in_epoch;
  weights.global_step = global_step;
  // The finished epochs only: a run cut short by --max-steps also reports its partial epoch.
  weights.history.assign(history.begin(),
                         history.begin() + std::min<int64_t>(epochs_done, history.size()));
  // CPU copies: the replica's parameters live in the reducer's buckets and stay put.
  weights.tensors = model_tensors(*model);
  const auto bytes = serialize_checkpoint(weights);
  write_file_atomically(path, bytes.data(), bytes.size(), "--save-model " + path);
}

// The largest signal number any rank was asked to stop with, or 0: every rank gets the same
// answer at the same step, so all of them stop together.
int agreed_stop_signal(const std::atomic<int>* stop_signal, Communicator& communicator,
                       const torch::Device& device) {
  const int local = stop_signal ? stop_signal->load() : 0;
  if (communicator.world_size() == 1) return local;
  auto flag = torch::full({1}, local, torch::dtype(torch::kInt64).device(device));
  communicator.allreduce_max(flag, "stop agreement");
  return static_cast<int>(flag.item<int64_t>());
}

// ---- Joining the world and making the replica -------------------------------------------------

// The rendezvous of one rank: every rank present and agreeing on the world, their settings
// compared (run_configuration.h), their placements exchanged (into `devices`, every rank's
// device in rank order) and checked against the backend, then the process group. A world of one
// without a process group skips all of it.
std::unique_ptr<Communicator> connect_rank(const TrainOptions& options, const RankPlan& plan,
                                           std::vector<std::string>& devices) {
  if (!plan.store) {
    devices = {device_name(plan.device)};
    return std::make_unique<Communicator>();
  }
  store_barrier(*plan.store, "rendezvous", plan.rank, plan.world_size, options.timeout);
  const RankPlacement mine{host_name(), device_name(plan.device), gpu_identity(plan.device)};
  const auto placements =
      gather_placements(*plan.store, plan.rank, plan.world_size, mine, options.timeout);
  const auto settings = all_gather_strings(*plan.store, "settings", plan.rank, plan.world_size,
                                           plan.settings, options.timeout);
  try {
    check_same_settings(settings);
    check_placements(placements, options.backend);
  } catch (const UsageError&) {
    // Every rank finds the same mistake. Rank 0 may serve the store: it leaves only once the
    // others have read what it holds, so that they report the mistake too, not a lost store.
    const std::string prefix = "dptrain/rendezvous-read/";
    plan.store->set(prefix + std::to_string(plan.rank), std::vector<uint8_t>{'1'});
    if (plan.rank == 0) ranks_missing_after(*plan.store, prefix, plan.world_size, options.timeout);
    throw;
  }
  devices.clear();
  WorldOptions world_options;
  for (const auto& placement : placements) {
    devices.push_back(placement.device);
    world_options.rank_hosts.push_back(placement.host);
  }
  world_options.backend = options.backend;
  world_options.timeout = options.timeout;
  world_options.loopback = plan.loopback;
  return std::make_unique<Communicator>(plan.store, plan.rank, plan.world_size, world_options);
}

// One rank's place in the world: its communicator, every rank's device, and its membership of
// this process's replicas (so that a failing sibling can abort its process group).
class JoinedWorld {
 public:
  JoinedWorld(const TrainOptions& options, const RankPlan& plan)
      : communicator_(connect_rank(options, plan, devices_)), local_(plan.local) {
    if (local_) local_->add(communicator_.get());
  }
  ~JoinedWorld() {
    if (local_) local_->remove(communicator_.get());
  }
  JoinedWorld(const JoinedWorld&) = delete;
  JoinedWorld& operator=(const JoinedWorld&) = delete;

  Communicator& communicator() { return *communicator_; }
  const std::vector<std::string>& devices() const { return devices_; }
  // No rank leaves while others may still talk to it; then the process group is shut down.
  void leave() {
    communicator_->barrier("final barrier");
    communicator_->shutdown();
  }

 private:
  std::vector<std::string> devices_;
  std::unique_ptr<Communicator> communicator_;
  LocalReplicas* local_;
};

// The replica: the same seed on every rank (or the start's weights), laid out for its device,
// and rank 0's state broadcast to make sure.
ResNet make_replica(const TrainOptions& options, const RankPlan& plan, Communicator& communicator) {
  ResNet model(ResNetOptions{kNumClasses, /*in_channels=*/1, options.width});
  init_reference_weights(*model, options.seed);
  if (plan.weights) load_model_tensors(*model, *plan.weights, plan.start_name);
  model->to(plan.device);
  if (channels_last(options)) convert_to_channels_last(*model);
  if (options.sync_bn) set_batch_norm_sync(*model, &communicator);
  broadcast_from_rank0(*model, communicator);
  return model;
}

// ---- Checkpoints and the non-finite guard ------------------------------------------------------

// Every checkpoint of a rank's run is saved through here (rank 0 writes; every rank learns
// whether the write worked, so that a failure is an error everywhere instead of rank 0 leaving
// while the others wait for it in the next collective).
class Checkpointer {
 public:
  Checkpointer(const TrainOptions& options, const CheckpointConfig& config, ResNet& model,
               Communicator& communicator, const torch::Device& device)
      : directory_(options.checkpoint_dir),
        config_(config),
        model_(model),
        communicator_(communicator),
        device_(device) {}

  bool enabled() const { return directory_.has_value(); }
  const CheckpointConfig& config() const { return config_; }

  // The run after `epochs_done` epochs and `step_in_epoch` steps of the next, with that epoch's
  // sums and seconds so far; `history` holds the finished epochs. Returns the path written.
  std::string save(int64_t epochs_done, int64_t step_in_epoch, int64_t global_step,
                   const Totals& partial_sums, double partial_seconds,
                   const std::vector<EpochStats>& history) {
    communicator_.wait_host("the checkpoint's copy of the weights");
    Checkpoint checkpoint;
    checkpoint.config = config_;
    checkpoint.epochs_done = epochs_done;
    checkpoint.step_in_epoch = step_in_epoch;
    checkpoint.global_step = global_step;
    checkpoint.partial_sums = partial_sums;
    checkpoint.partial_seconds = partial_seconds;
    checkpoint.history = history;
    checkpoint.tensors = model_tensors(*model_);
    const std::string path = *directory_ + "/" + checkpoint_file_name(epochs_done, step_in_epoch);
    std::string error;
    if (communicator_.rank() == 0) {
      try {
        write_checkpoint_atomically(checkpoint, path);
      } catch (const DataError& e) {
        error = e.what();
      }
    }
    auto failed =
        torch::full({1}, error.empty() ? 0 : 1, torch::dtype(torch::kInt64).device(device_));
    communicator_.allreduce_max(failed, "checkpoint agreement");
    if (!error.empty()) throw DataError(error);
    if (failed.item<int64_t>() != 0) {
      throw DataError("rank 0 could not write checkpoint " + path + " (see rank 0's error)");
    }
    return path;
  }

 private:
  std::optional<std::string> directory_;
  CheckpointConfig config_;
  ResNet& model_;
  Communicator& communicator_;
  torch::Device device_;
};

// Note [Non-finite steps]
// The decision is taken on the all-reduced gradient, which is the same on every rank, so the
// ranks agree without a collective of their own. kSkip must know before the update and reads
// the flag every step, restoring the BatchNorm statistics that the skipped step's forward pass
// moved; kStop only records the first bad step on the device and reads it at the host check
// points, so a GPU epoch never waits for it.
class NonFiniteGuard {
 public:
  NonFiniteGuard(const TrainOptions& options, ResNet& model, const torch::Device& device,
                 int64_t batches_per_epoch)
      : skip_(options.on_nonfinite == NonFinite::kSkip),
        batches_per_epoch_(batches_per_epoch),
        first_bad_step_(torch::full({}, -1, torch::dtype(torch::kInt64).device(device))) {
    if (!skip_) return;
    for (auto& b : model->buffers()) {
      buffers_.push_back(b);
      saved_buffers_.push_back(b.detach().clone());
    }
  }

  // Whether the step whose all-reduced gradients `reducer` holds may update the weights. kStop
  // always says yes and remembers a bad step for throw_if_bad_step; kSkip waits for the answer.
  bool allow_update(const Reducer& reducer, int64_t global_step, Communicator& communicator) {
    const auto finite = gradients_finite(reducer);  // the same on every rank
    if (!skip_) {
      first_bad_step_.masked_fill_(first_bad_step_.lt(0).logical_and(finite.logical_not()),
                                   global_step);
      return true;
    }
    torch::NoGradGuard no_grad;
    communicator.wait_host("the non-finite check");
    if (!finite.item<bool>()) {
      for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(saved_buffers_[i]);
      ++skipped_;
      return false;
    }
    return true;
  }
  // After an update under kSkip: the statistics to restore should the next step be skipped.
  void keep_buffers() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers_.size(); ++i) saved_buffers_[i].copy_(buffers_[i]);
  }
  // kStop: throws, naming the first bad step, if there was one (reads the device).
  void throw_if_bad_step(const std::optional<std::string>& last_checkpoint) const {
    if (skip_) return;
    const int64_t bad = first_bad_step_.item<int64_t>();
    if (bad < 0) return;
    throw std::runtime_error(
        "epoch " + std::to_string((bad - 1) / batches_per_epoch_ + 1) + " step " +
        std::to_string((bad - 1) % batches_per_epoch_ + 1) +
        ": the gradient is not finite (NaN or infinity); training stopped" +
        (last_checkpoint ? "; the last good checkpoint is " + *last_checkpoint : std::string()) +
        ". Lower --lr, or pass --on-nonfinite skip");
  }
  int64_t skipped() const { return skipped_; }

 private:
  static torch::Tensor gradients_finite(const Reducer& reducer) {
    std::vector<torch::Tensor> buckets;
    for (size_t i = 0; i < reducer.num_buckets(); ++i) buckets.push_back(reducer.bucket(i));
    return all_finite(buckets);  // () bool
  }

  bool skip_;
  int64_t batches_per_epoch_;
  torch::Tensor first_bad_step_;  // () int64, the first bad global step or -1
  std::vector<torch::Tensor> buffers_, saved_buffers_;
  int64_t skipped_ = 0;
};

// ---- The step and the epoch
// ----------------------------------------------------------------------

// What one rank trains with, for the step and the epoch.
struct Replica {
  const TrainOptions& options;
  const RankPlan& plan;
  Communicator& communicator;
  ResNet& model;
  Reducer& reducer;
  BatchAssembler& assembler;
  const DeviceSplit& train;
  const DeviceSplit& test;
  int64_t batches_per_epoch;
  CudaGraphStep* graph;  // --cuda-graph: every step goes through it; null without the flag
};

// The book's step on this rank's shard x (n, 1, 28, 28), y (n) of a global batch of
// `global_batch` examples: zero grad -> forward -> loss -> backward (buckets all-reduce as they
// fill) -> wait. Returns the shard's summed loss () and logits (n, 10); the SGD step is the
// caller's, once the gradient is known to be finite.
std::pair<torch::Tensor, torch::Tensor> train_step(Replica& r, const torch::Tensor& x,
                                                   const torch::Tensor& y, int64_t global_batch) {
  r.reducer.zero_grad();
  torch::Tensor loss_sum, logits;
  if (x.size(0) > 0 || r.options.sync_bn) {
    {
      const AutocastGuard autocast(r.plan.device, r.options.amp);
      logits = r.model->forward(x);  // (n, 10)
    }
    logits = logits.to(torch::kFloat32);  // the loss in float32 whatever the forward's type
    loss_sum = F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().reduction(torch::kSum));
  } else {
    // A replica with no examples (a global batch smaller than the world) still joins every
    // gradient all-reduce, with zeros. (With sync-bn it runs the empty forward instead, to join
    // the statistics all-reduces too.)
    loss_sum = torch::zeros({}, torch::dtype(torch::kFloat32).device(r.plan.device));
    for (const auto& p : r.model->parameters()) loss_sum = loss_sum + p.sum() * 0.0;
    logits = torch::zeros({0, kNumClasses}, loss_sum.options());
  }
  // Each replica divides its summed loss by the GLOBAL batch size, so the all-reduced sum of
  // gradients is exactly the gradient of the mean loss over the global batch, however unevenly
  // the batch splits over the replicas.
  const auto loss = loss_sum / static_cast<double>(global_batch);
  r.reducer.prepare_for_backward();
  loss.backward();
  r.reducer.finalize_backward();
  return {loss_sum, logits};
}

// Whether the SGD update is part of the graphed step. Under kStop a step always updates (a bad
// one is reported at the next host check), so the graph captures the update with the step; kSkip
// must read the gradient's verdict on the host first. Eager steps keep the update after the
// non-finite check, in the order (and so with the allocations) they always had.
bool update_in_step(const Replica& r) {
  return r.graph != nullptr && r.options.on_nonfinite == NonFinite::kStop;
}

// The step as the loop runs it: train_step and, where it belongs to the step, the update;
// captured once and replayed with --cuda-graph (Note [Capturing the whole step] in
// cuda_graph_step.cpp). Returns the shard's summed loss () and logits (n, 10).
std::pair<torch::Tensor, torch::Tensor> run_step(Replica& r, const torch::Tensor& x,
                                                 const torch::Tensor& y, int64_t global_batch) {
  const auto body = [&r, global_batch](const torch::Tensor& bx, const torch::Tensor& by) {
    auto [loss_sum, logits] = train_step(r, bx, by, global_batch);
    if (update_in_step(r)) r.reducer.sgd_step(r.options.lr);
    return std::vector<torch::Tensor>{loss_sum, logits};
  };
  const auto outputs = r.graph ? r.graph->run(x, y, body) : body(x, y);
  return {outputs.at(0), outputs.at(1)};
}

// Before the host reads what the steps wrote: the last graph replay (whose collectives the
// communicator cannot see), then the communicator's own collectives, each within the timeout.
void wait_host(Replica& r, const std::string& what) {
  if (r.graph) r.graph->wait_host(what);
  r.communicator.wait_host(what);
}

// Where a rank is in its run.
struct Position {
  int64_t epoch = 0;        // 0-based, the epoch being trained
  int64_t step = 0;         // steps done in it
  int64_t global_step = 0;  // steps done in all
  int64_t images = 0;       // training images of this epoch so far, over all ranks
};

// How an epoch's steps ended.
struct EpochSteps {
  int stop = 0;        // the agreed stop signal, when one ended it early
  double seconds = 0;  // training seconds of the epoch, those before a resume included
};

// A step checkpoint inside the epoch, given the epoch's tally and training seconds so far.
using SaveInsideEpoch = std::function<void(Tally& tally, double seconds)>;

// The steps of one epoch from `at.step` on, adding to `tally`, until the epoch ends, --max-steps
// is reached or the ranks agree on a stop. Side concerns are one block each.
EpochSteps train_epoch(Replica& r, Position& at, Tally& tally, double seconds_before,
                       NonFiniteGuard& guard, const TrainCallbacks& callbacks,
                       const std::optional<std::string>& last_checkpoint,
                       const SaveInsideEpoch& save_inside_epoch) {
  const auto& options = r.options;
  const int64_t num_train = r.train.labels.size(0);
  const auto order_host = epoch_order(num_train, options.seed, at.epoch);
  const auto order = torch::tensor(order_host, torch::kInt64).to(r.plan.device);  // (N_train)
  // Host check points: where the ranks agree on a stop request and kStop reads the non-finite
  // record. Every step on the CPU, where reading costs nothing; sparser on a GPU.
  const int64_t check_every = r.plan.device.is_cpu() ? 1 : 25;
  const bool reporter = r.plan.first_local;
  r.model->train();
  synchronize(r.plan.device);
  const auto start_time = std::chrono::steady_clock::now();
  double saving_seconds = 0;  // step checkpoints' writing, which is not training time
  const auto elapsed = [&] {
    return seconds_before - saving_seconds +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  };
  EpochSteps result;
  while (at.step < r.batches_per_epoch) {
    if (options.max_steps > 0 && at.global_step >= options.max_steps) break;
    const auto [begin, end] = batch_range(num_train, options.batch_size, at.step);
    const int64_t global_batch = end - begin;
    const auto [shard_begin, shard_end] = shard_range(global_batch, r.plan.world_size, r.plan.rank);
    const auto index = order.narrow(0, begin + shard_begin, shard_end - shard_begin);  // (n)
    // x: (n, 1, 28, 28), y: (n), in buffers reused by every step.
    const auto [x, y] = r.assembler.gather(r.train.images, r.train.labels, index);
    const auto [loss_sum, logits] = run_step(r, x, y, global_batch);
    ++at.global_step;
    if (r.graph && !update_in_step(r)) r.graph->wait_host("the non-finite check");
    if (guard.allow_update(r.reducer, at.global_step, r.communicator)) {
      if (!update_in_step(r)) r.reducer.sgd_step(options.lr);
      tally.add(loss_sum, logits, y);
      guard.keep_buffers();
    }
    ++at.step;
    at.images += global_batch;

    // Each side concern, one block: the step callback, the progress report, the replica check,
    // and the host check point (a stop request, a non-finite step).
    if (reporter && callbacks.on_step) {
      wait_host(r, "the step callback");
      callbacks.on_step(StepStats{at.epoch + 1, at.step, r.batches_per_epoch,
                                  loss_sum.item<double>() / std::max<int64_t>(index.size(0), 1)});
    }
    if (reporter && callbacks.on_progress && options.progress_every > 0 &&
        (at.step % options.progress_every == 0 || at.step == r.batches_per_epoch)) {
      wait_host(r, "the progress report");
      const auto running = means_of(tally.read());
      callbacks.on_progress(ProgressStats{at.epoch + 1, options.epochs, at.step,
                                          r.batches_per_epoch, at.images, elapsed(), running.loss,
                                          running.accuracy});
    }
    if (options.check_replicas_every > 0 && at.global_step % options.check_replicas_every == 0) {
      wait_host(r, "the replica check");
      check_replicas_identical(*r.model, r.communicator, at.global_step);
    }
    if (at.global_step % check_every == 0 && at.step < r.batches_per_epoch) {
      wait_host(r, "the step's host check");
      guard.throw_if_bad_step(last_checkpoint);
      result.stop = agreed_stop_signal(options.stop_signal, r.communicator, r.plan.device);
      if (result.stop != 0) break;
    }
    // A step checkpoint (--checkpoint-every-steps) inside the epoch; at its end, or at the
    // --max-steps cut, train_epochs saves.
    const bool cut = options.max_steps > 0 && at.global_step >= options.max_steps;
    if (save_inside_epoch && at.global_step % options.checkpoint_every_steps == 0 &&
        at.step < r.batches_per_epoch && !cut) {
      guard.throw_if_bad_step(last_checkpoint);  // never save a non-finite step's weights
      const auto save_start = std::chrono::steady_clock::now();
      save_inside_epoch(tally, elapsed());
      saving_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start).count();
    }
  }
  wait_host(r, "the end of the epoch");
  synchronize(r.plan.device);
  result.seconds = elapsed();
  guard.throw_if_bad_step(last_checkpoint);
  return result;
}

// The end of a whole (or a --max-steps-cut) epoch: its sums reduced over the ranks, the
// replicas' BatchNorm statistics averaged so that every rank evaluates the same model, the
// evaluation, and the epoch's figures.
EpochStats finish_epoch(Replica& r, const Position& at, Tally& tally, double seconds) {
  EpochStats stats;
  stats.epoch = at.epoch + 1;
  stats.epochs = r.options.epochs;
  stats.steps = at.step;
  stats.seconds = seconds;
  const auto train = means_of(tally.reduce(r.communicator, "training loss and accuracy"));
  stats.train_loss = train.loss;
  stats.train_acc = train.accuracy;
  stats.images_per_second = seconds > 0 ? train.count / seconds : 0;
  if (!std::isfinite(stats.train_loss)) {
    throw std::runtime_error(
        "epoch " + std::to_string(at.epoch + 1) + ": the training loss is not finite (" +
        std::to_string(stats.train_loss) + "); the learning rate may be too high");
  }
  average_buffers(*r.model, r.communicator);
  const auto test =
      means_of(evaluate(r.model, r.test, r.options.batch_size, r.options, r.communicator));
  stats.test_loss = test.loss;
  stats.test_acc = test.accuracy;
  return stats;
}

// ---- One rank ----------------------------------------------------------------------------

// Epoch after epoch from `at` until the last, --max-steps or an agreed stop, adding each to
// `result`; each kind of checkpoint is saved in one place.
void train_epochs(Replica& r, Position& at, Checkpointer& checkpointer, NonFiniteGuard& guard,
                  const TrainCallbacks& callbacks, TrainResult& result) {
  const auto& options = r.options;
  const auto& plan = r.plan;
  const auto save = [&](int64_t epochs_done, int64_t step, const Totals& sums, double seconds) {
    result.last_checkpoint =
        checkpointer.save(epochs_done, step, at.global_step, sums, seconds, result.epochs);
    if (plan.first_local && callbacks.on_checkpoint) {
      callbacks.on_checkpoint(*result.last_checkpoint);
    }
  };
  // Note [Step checkpoints resume bit for bit]
  // A checkpoint inside an epoch holds one set of BatchNorm statistics and the epoch's sums so
  // far, and a resume gives every replica those statistics and rank 0 those sums (the others
  // start from zero). So the run that writes a step checkpoint puts itself into that very
  // state: the replicas' statistics are averaged in place and the sums are gathered on rank 0.
  // Whether a run is interrupted after a step checkpoint or not, it then continues from the
  // same bits, weights, statistics and sums alike.
  SaveInsideEpoch save_inside_epoch;
  if (checkpointer.enabled() && options.checkpoint_every_steps > 0) {
    save_inside_epoch = [&](Tally& tally, double seconds) {
      average_buffers(*r.model, r.communicator);
      const Totals sums = tally.reduce(r.communicator, "the epoch's sums for a step checkpoint");
      if (plan.rank != 0) tally.set(Totals{});
      save(at.epoch, at.step, sums, seconds);
    };
  }
  for (; at.epoch < options.epochs; ++at.epoch, at.step = 0) {
    if (options.max_steps > 0 && at.global_step >= options.max_steps) break;
    // A resumed epoch carries on with its sums and seconds so far (rank 0 holds the sums, as
    // they are global).
    Tally tally(plan.device);
    double seconds_before = 0;
    at.images = at.step * options.batch_size;
    if (at.step > 0 && plan.start) {
      seconds_before = plan.start->partial_seconds;
      if (plan.rank == 0) tally.set(plan.start->partial_sums);
    }
    const auto steps = train_epoch(r, at, tally, seconds_before, guard, callbacks,
                                   result.last_checkpoint, save_inside_epoch);
    if (steps.stop != 0) {
      // Stopped inside the epoch: keep its sums so far, summed over the ranks, for the resume.
      // The checkpoint holds one set of BatchNorm statistics, but mid-epoch each replica's have
      // followed its own shard: save their mean. The momentum update is linear, so the mean
      // after the epoch's end is the same (to rounding) as without the stop; rank 0's alone
      // would move it by (1 - momentum)^k times the replicas' spread.
      result.stopped_by = steps.stop;
      if (checkpointer.enabled()) {
        average_buffers(*r.model, r.communicator);
        save(at.epoch, at.step, tally.reduce(r.communicator, "partial epoch sums"), steps.seconds);
      }
      return;
    }
    const EpochStats stats = finish_epoch(r, at, tally, steps.seconds);
    result.epochs.push_back(stats);
    if (plan.first_local && callbacks.on_epoch) callbacks.on_epoch(stats);
    if (at.step < r.batches_per_epoch) {
      // --max-steps cut this epoch short: its checkpoint records the position inside it (and
      // the sums so far, all-reduced by finish_epoch), so that a resume finishes the epoch. Its
      // history holds finished epochs only.
      if (checkpointer.enabled()) {
        result.epochs.pop_back();
        save(at.epoch, at.step, tally.read(), steps.seconds);
        result.epochs.push_back(stats);
      }
      return;
    }
    const bool last = at.epoch + 1 == options.epochs;
    const bool scheduled = (at.epoch + 1) % options.checkpoint_every == 0 || last ||
                           (options.checkpoint_every_steps > 0 &&
                            at.global_step % options.checkpoint_every_steps == 0);
    if (checkpointer.enabled() && scheduled) save(at.epoch + 1, 0, Totals{}, 0);
    // A stop requested during the epoch's last step, the evaluation or the checkpoint ends the
    // run here, keeping the finished epoch even between scheduled checkpoints.
    if (last) continue;
    result.stopped_by = agreed_stop_signal(options.stop_signal, r.communicator, plan.device);
    if (result.stopped_by != 0) {
      if (checkpointer.enabled() && !scheduled) save(at.epoch + 1, 0, Totals{}, 0);
      return;
    }
  }
}

// One rank's whole training: join the world, make the replica and what trains it, pick up where
// a checkpoint left off, train the epochs, then save the model and leave together.
}  // namespace

CheckpointConfig checkpoint_config(const TrainOptions& options, int64_t train_size, int world_size,
                                   const std::string& train_digest) {
  CheckpointConfig config;
  config.width = options.width;
  config.num_classes = kNumClasses;
  config.in_channels = 1;
  config.batch_size = options.batch_size;
  config.lr = options.lr;
  config.seed = options.seed;
  config.train_size = train_size;
  config.world_size = world_size;
  config.train_digest = train_digest;
  return config;
}

TrainResult run_rank(const FashionMnist& data, const TrainOptions& options, const RankPlan& plan,
                     const TrainCallbacks& callbacks) {
  at::set_num_threads(plan.threads);  // intra-op threads are per calling thread under OpenMP
  // This thread's current device: new tensors, NCCL and cuDNN handles go where the replica is.
  const c10::DeviceGuard device_guard(plan.device);
  TrainResult result;
  result.world_size = plan.world_size;
  JoinedWorld world(options, plan);
  result.devices = world.devices();
  auto& communicator = world.communicator();
  ResNet model = make_replica(options, plan, communicator);
  result.parameter_count = count_parameters(*model);
  const DeviceSplit train = to_device(data.train, plan.device);
  const DeviceSplit test = to_device(data.test, plan.device);
  const int64_t num_train = data.train.size();
  // --cuda-graph: made before the reducer, which must be made on the graph's stream.
  std::unique_ptr<CudaGraphStep> graph;
  if (options.cuda_graph) {
    const auto [begin, end] = shard_range(options.batch_size, plan.world_size, plan.rank);
    graph = std::make_unique<CudaGraphStep>(plan.device, communicator, end - begin);
  }
  // The reducer also takes over the parameters' storage, for its one-update-per-bucket SGD.
  std::unique_ptr<Reducer> reducer_owner;
  const auto make_reducer = [&] {
    reducer_owner =
        std::make_unique<Reducer>(model->parameters(), communicator, options.bucket_bytes);
  };
  if (graph) {
    graph->on_graph_stream(make_reducer);
  } else {
    make_reducer();
  }
  Reducer& reducer = *reducer_owner;
  BatchAssembler assembler(
      shard_range(std::min(options.batch_size, num_train), plan.world_size, 0).second, plan.device,
      channels_last(options));
  Replica replica{options,    plan,    communicator,
                  model,      reducer, assembler,
                  train,      test,    num_batches(num_train, options.batch_size),
                  graph.get()};
  Checkpointer checkpointer(
      options, checkpoint_config(options, num_train, plan.world_size, plan.train_digest), model,
      communicator, plan.device);

  Position at;  // a resumed run carries on at the checkpoint's epoch and step
  if (plan.start) {
    at = Position{plan.start->epochs_done, plan.start->step_in_epoch, plan.start->global_step, 0};
    result.epochs = plan.start->history;
    result.resumed_from = plan.start_name;
  }
  if (plan.first_local && callbacks.on_start) {
    callbacks.on_start(result.devices, result.epochs, result.resumed_from);
  }
  NonFiniteGuard guard(options, model, plan.device, replica.batches_per_epoch);
  train_epochs(replica, at, checkpointer, guard, callbacks, result);

  if (options.check_replicas_every > 0) {
    check_replicas_identical(*model, communicator, at.global_step);
  }
  if (plan.rank == 0 && options.save_model && result.stopped_by == 0) {
    communicator.wait_host("the saved model's copy of the weights");
    save_model_atomically(model, checkpointer.config(), at.epoch, at.step, at.global_step,
                          result.epochs, *options.save_model);
  }
  result.skipped_steps = guard.skipped();
  result.graph_replays = graph ? graph->replays() : 0;
  world.leave();
  return result;
}

// One rank's evaluation of the start's weights: the same world and replica as training, then
// the evaluation after an epoch.
EvalResult evaluate_rank(const FashionMnist& data, const TrainOptions& options,
                         const RankPlan& plan) {
  at::set_num_threads(plan.threads);
  const c10::DeviceGuard device_guard(plan.device);
  JoinedWorld world(options, plan);
  ResNet model = make_replica(options, plan, world.communicator());
  const auto totals = evaluate(model, to_device(data.test, plan.device), options.batch_size,
                               options, world.communicator());
  const auto test = means_of(totals);
  EvalResult result{test.loss, test.accuracy, static_cast<int64_t>(totals.count), world.devices()};
  world.leave();
  return result;
}

}  // namespace dptrain
