// One rank's training and evaluation: the replica, the step, the end of a step and of an epoch,
// checkpoints and the non-finite guard. Joining the world is joined_world.h's. See rank.h.
#include "rank.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/core/peak_tflops.h"
#include "dptrain/core/statistics.h"
#include "dptrain/data/augment.h"
#include "dptrain/data/batch_input.h"
#include "dptrain/data/batching.h"
#include "dptrain/data/data.h"
#include "dptrain/model/autocast.h"
#include "dptrain/model/batch_norm.h"
#include "dptrain/model/flops.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/model/model.h"
#include "dptrain/model/numerics.h"
#include "dptrain/parallel/bucket_sgd.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/joined_world.h"
#include "dptrain/parallel/reducer.h"
#include "dptrain/parallel/replicas.h"
#include "dptrain/train/callbacks.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_directory.h"
#include "dptrain/train/checkpoint_types.h"
#include "dptrain/train/cuda_graph_step.h"
#include "dptrain/train/epoch_stats.h"
#include "dptrain/train/finite.h"
#include "dptrain/train/lr_schedule.h"
#include "dptrain/train/options.h"
#include "dptrain/train/step_gpu_time.h"
#include "dptrain/train/weight_average.h"
#include "optimizer_state.h"

namespace dptrain {
namespace {

namespace F = torch::nn::functional;

// Whether a rank's replica runs channels-last (RankPlan::memory_format, resolved for its device).
bool channels_last(const RankPlan& plan) {
  return plan.memory_format == MemoryFormat::kChannelsLast;
}

// A split of the data moved to a rank's device once, as bytes (55 MB for both splits), so that
// no step copies from the host.
struct DeviceSplit {
  torch::Tensor images;  // (N, 28, 28) uint8
  torch::Tensor labels;  // (N) int64
};

DeviceSplit to_device(const Dataset& set, const torch::Device& device) {
  if (set.size() == 0) return {};  // no validation set
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

// The evaluation after each epoch: every rank takes a contiguous shard of the set (the test set,
// or the validation set). Returns the sums over all ranks. With `all_logits`, also every test
// image's logits, in order, on every rank: each rank fills its shard's rows of a zero tensor and
// a sum over the ranks joins them (adding zeros is exact).
Totals evaluate(ResNet& model, const DeviceSplit& test, const TrainOptions& options,
                const RankPlan& plan, Communicator& communicator,
                torch::Tensor* all_logits = nullptr) {
  const int64_t batch_size = options.batch_size;
  torch::NoGradGuard no_grad;
  model->eval();
  const auto [begin, end] =
      shard_range(test.labels.size(0), communicator.world_size(), communicator.rank());
  Tally tally(test.labels.device());
  if (all_logits) {
    *all_logits = torch::zeros({test.labels.size(0), kNumClasses},
                               torch::dtype(torch::kFloat32).device(test.labels.device()));
  }
  for (int64_t i = begin; i < end; i += batch_size) {
    const int64_t n = std::min(batch_size, end - i);
    auto x = to_model_input(test.images.narrow(0, i, n));  // (n, 1, 28, 28)
    if (channels_last(plan)) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    auto y = test.labels.narrow(0, i, n);  // (n)
    torch::Tensor logits;                  // (n, 10)
    {
      const AutocastGuard autocast(x.device(), options.amp);
      logits = model->forward(x);
    }
    logits = logits.to(torch::kFloat32);
    if (all_logits) all_logits->narrow(0, i, n).copy_(logits);
    tally.add(F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().reduction(torch::kSum)),
              logits, y);
  }
  if (all_logits) communicator.allreduce_sum(*all_logits, "the test images' logits");
  return tally.reduce(communicator, "evaluation counts");
}

// What every file a run saves holds of it (a checkpoint or --save-model's model): the run's
// config, its position after `epochs_done` epochs and `step_in_epoch` steps of the next, the
// finished epochs only of `history` (an epoch cut short by --max-steps is reported, not
// recorded), and CPU copies of the weights (the replica's parameters live in the reducer's
// buckets and stay put).
Checkpoint checkpoint_of_run(const ResNet& model, const CheckpointConfig& config,
                             int64_t epochs_done, int64_t step_in_epoch, int64_t global_step,
                             const std::vector<EpochStats>& history) {
  Checkpoint checkpoint;
  checkpoint.config = config;
  checkpoint.epochs_done = epochs_done;
  checkpoint.step_in_epoch = step_in_epoch;
  checkpoint.global_step = global_step;
  checkpoint.history.assign(history.begin(),
                            history.begin() + std::min<int64_t>(epochs_done, history.size()));
  checkpoint.tensors = model_tensors(*model);
  return checkpoint;
}

// Note [A model file is a checkpoint]
// --save-model writes the checkpoint format (checkpoint.h: safetensors, "dptrain.kind": "model")
// at the run's final position: plain tensors under the names of the book's PyTorch model, read
// back by a strict reader that runs nothing, and by safetensors.torch.load_file in any Python.
// Not torch::save's TorchScript archive, which torch::load compiles and runs: a crafted file's
// code (its __setstate__ included) can hang `eval`, allocate gigabytes or print a forged result
// line.
void save_model_atomically(const ResNet& model, const CheckpointConfig& config, int64_t epochs_done,
                           int64_t step_in_epoch, int64_t global_step,
                           const std::vector<EpochStats>& history, const std::string& path) {
  Checkpoint weights =
      checkpoint_of_run(model, config, epochs_done, step_in_epoch, global_step, history);
  weights.kind = CheckpointKind::kModel;
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

// ---- The weights' average ---------------------------------------------------------------------

// --ema's averaged weights: a model like the replica, laid out alike, starting from its weights
// (Note [The averaged weights' decay]). None without --ema.
ResNet make_average(const TrainOptions& options, const RankPlan& plan, const ResNet& model) {
  if (options.recipe.ema_decay == 0) return ResNet(nullptr);
  ResNet averaged(ResNetOptions{kNumClasses, /*in_channels=*/1, plan.width});
  averaged->to(plan.device);
  if (channels_last(plan)) convert_to_channels_last(*averaged);
  for (auto& p : averaged->parameters()) p.requires_grad_(false);
  copy_weights(*averaged, *model);
  return averaged;
}

// ---- The replica and its place in the world ---------------------------------------------------

// Where this rank joins the world (joined_world.h): its place and store from the plan, the
// backend and the timeout from the options.
WorldSeat seat_of(const TrainOptions& options, const RankPlan& plan) {
  WorldSeat seat;
  seat.rank = plan.rank;
  seat.world_size = plan.world_size;
  seat.device = plan.device;
  seat.store = plan.store;
  seat.loopback = plan.loopback;
  seat.settings = plan.settings;
  seat.backend = options.backend;
  seat.timeout = options.timeout;
  seat.local = plan.local;
  seat.stop_signal = options.stop_signal;
  return seat;
}

// The replica: the same seed on every rank (or the start's weights), laid out for its device,
// and rank 0's state broadcast to make sure.
ResNet make_replica(const TrainOptions& options, const RankPlan& plan, Communicator& communicator) {
  ResNetOptions model_options{kNumClasses, /*in_channels=*/1, plan.width};
  model_options.fused_conv_bias_grad = options.fused_conv_bias_grad;
  ResNet model(model_options);
  init_reference_weights(*model, options.seed);
  if (plan.weights) load_model_tensors(*model, *plan.weights, plan.start_name);
  model->to(plan.device);
  if (channels_last(plan)) convert_to_channels_last(*model);
  if (options.sync_bn) set_batch_norm_sync(*model, &communicator);
  broadcast_from_rank0(*model, communicator);
  return model;
}

// ---- Checkpoints and the non-finite guard ------------------------------------------------------

// Writes `checkpoint` to `path` on rank 0, and every rank learns whether the write worked, so that
// a failure is an error everywhere instead of rank 0 leaving while the others wait for it in the
// next collective.
void write_checkpoint_everywhere(const Checkpoint& checkpoint, const std::string& path,
                                 Communicator& communicator, const torch::Device& device) {
  std::string error;
  if (communicator.rank() == 0) {
    try {
      write_checkpoint_atomically(checkpoint, path);
    } catch (const DataError& e) {
      error = e.what();
    }
  }
  auto failed =
      torch::full({1}, error.empty() ? 0 : 1, torch::dtype(torch::kInt64).device(device));
  communicator.allreduce_max(failed, "checkpoint agreement");
  if (!error.empty()) throw DataError(error);
  if (failed.item<int64_t>() != 0) {
    throw DataError("rank 0 could not write checkpoint " + path + " (see rank 0's error)");
  }
}

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
      ++skipped_in_epoch_;
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
  // The steps skipped since the last call (at the end of the previous epoch): the epoch's.
  int64_t take_epoch_skipped() { return std::exchange(skipped_in_epoch_, 0); }

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
  int64_t skipped_in_epoch_ = 0;
};

// ---- One rank's training ----------------------------------------------------------------------

// Where a rank is in its run.
struct Position {
  int64_t epoch = 0;        // 0-based, the epoch being trained
  int64_t step = 0;         // steps done in it
  int64_t global_step = 0;  // steps done in all
  int64_t images = 0;       // training images of this epoch so far, over all ranks
};

// The reducer, made on the CUDA graph's stream where there is a graph (--cuda-graph). It also
// takes over the parameters' storage, for its one-update-per-bucket SGD.
std::unique_ptr<Reducer> make_reducer(ResNet& model, Communicator& communicator,
                                      int64_t bucket_bytes, CudaGraphStep* graph) {
  std::unique_ptr<Reducer> reducer;
  const auto make = [&] {
    reducer = std::make_unique<Reducer>(model->parameters(), communicator, bucket_bytes);
  };
  if (graph) {
    graph->on_graph_stream(make);
  } else {
    make();
  }
  return reducer;
}

// --cuda-graph: made before the reducer, which must be made on the graph's stream.
std::unique_ptr<CudaGraphStep> make_graph(const TrainOptions& options, const RankPlan& plan,
                                          Communicator& communicator) {
  if (!options.cuda_graph) return nullptr;
  const auto [begin, end] = shard_range(options.batch_size, plan.world_size, plan.rank);
  return std::make_unique<CudaGraphStep>(plan.device, communicator, end - begin);
}

// The device whose steps are timed (step_gpu_time.h), or the CPU, which times nothing: only
// where a timed step is the GPU's work alone (Note [Timing the GPU alone]). Not with several
// ranks, where one rank's wait for a peer's all-reduce would count as GPU time and each rank
// would size its own spin; not where the step waits on the host by design: --on-nonfinite
// skip reads the gradient's verdict, and Gloo's collectives run on the host.
torch::Device timed_device(const TrainOptions& options, const RankPlan& plan) {
  const bool host_collectives = options.process_group_for_one && options.backend == Backend::kGloo;
  if (plan.world_size != 1 || host_collectives || options.on_nonfinite == NonFinite::kSkip) {
    return torch::kCPU;
  }
  return plan.device;
}

// One rank's training: the replica and everything that trains it, and the loop. run() is the
// whole story: the book's step, then end_step, then end_epoch, where each side concern (report,
// check, stop, save, evaluate) is one block, decided there and nowhere else.
class RankTraining {
 public:
  RankTraining(const FashionMnist& data, const TrainOptions& options, const RankPlan& plan,
               const TrainCallbacks& callbacks, JoinedWorld& world)
      : options_(options),
        plan_(plan),
        callbacks_(callbacks),
        communicator_(world.communicator()),
        model_(make_replica(options, plan, communicator_)),
        train_(to_device(data.train, plan.device)),
        test_(to_device(data.test, plan.device)),
        validation_(to_device(data.validation, plan.device)),
        graph_(make_graph(options, plan, communicator_)),
        reducer_(make_reducer(model_, communicator_, options.bucket_bytes, graph_.get())),
        sgd_(std::make_unique<BucketSgd>(*reducer_, options.recipe.sgd)),
        averaged_(make_average(options, plan, model_)),
        assembler_(
            shard_range(std::min(options.batch_size, data.train.size()), plan.world_size, 0).second,
            plan.device, channels_last(plan)),
        batches_per_epoch_(num_batches(data.train.size(), options.batch_size)),
        config_(checkpoint_config(options, data.train.size(), plan.world_size, plan.train_digest)),
        tally_(plan.device),
        gpu_timer_(timed_device(options, plan)),
        gpu_timed_steps_(
            gpu_timed_steps(data.train.size() / options.batch_size, kGpuTimedStepsPerEpoch)) {
    result_.world_size = plan.world_size;
    result_.devices = world.devices();
    result_.parameter_count = count_parameters(*model_);
    if (reports_loss()) {
      loss_window_.sum = torch::zeros({}, torch::dtype(torch::kFloat64).device(plan.device));
    }
    if (plan.start) {  // a resumed run carries on at the checkpoint's epoch and step
      at_ = Position{plan.start->epochs_done, plan.start->step_in_epoch, plan.start->global_step, 0};
      result_.epochs = plan.start->history;
      result_.resumed_from = plan.start_name;
      load_optimizer_state(*plan.start, plan.start_name, model_, *sgd_, averaged_);
    }
  }

  TrainResult run();

 private:
  bool reporter() const { return plan_.first_local; }  // calls the callbacks
  bool checkpoints() const { return options_.checkpoint_dir.has_value(); }
  bool reports_loss() const {
    return reporter() && callbacks_.on_loss && options_.loss_every > 0;
  }
  bool max_steps_reached() const {
    return options_.max_steps > 0 && at_.global_step >= options_.max_steps;
  }
  void start_epoch();
  struct StepLoss {
    torch::Tensor sum;       // () the shard's summed loss
    int64_t shard_size = 0;  // the examples of this rank's shard
  };
  StepLoss take_step(NonFiniteGuard& guard);
  // What the end of a step or of an epoch says: the loop goes on, or the run stops here.
  enum class Next { kGoOn, kStop };
  Next end_step(const StepLoss& loss, NonFiniteGuard& guard);
  Next end_epoch(NonFiniteGuard& guard);
  void end_run(const NonFiniteGuard& guard);
  std::pair<torch::Tensor, torch::Tensor> step(const torch::Tensor& x, const torch::Tensor& y,
                                               int64_t global_batch);
  torch::Tensor augmented(const torch::Tensor& x, int64_t global_batch, int64_t shard_begin) const;
  void update();
  bool update_in_step() const;
  bool gpu_timed() const;
  void wait_host(const std::string& what);
  double epoch_seconds() const;
  Totals settle_partial_epoch(const std::string& what);
  EpochStats finish_epoch(double seconds, int64_t skipped_steps);
  void evaluate_epoch(ResNet& model, EpochStats& stats);
  void save_checkpoint(int64_t epochs_done, int64_t step_in_epoch, const Totals& sums,
                       double seconds);

  const TrainOptions& options_;
  const RankPlan& plan_;
  const TrainCallbacks& callbacks_;
  Communicator& communicator_;
  ResNet model_;
  const DeviceSplit train_;
  const DeviceSplit test_;
  const DeviceSplit validation_;          // empty (undefined tensors) without --val-split
  std::unique_ptr<CudaGraphStep> graph_;  // --cuda-graph: every step goes through it
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<BucketSgd> sgd_;  // the update, on the reducer's buckets
  ResNet averaged_;                 // --ema: the weights' moving average; else empty
  BatchAssembler assembler_;
  const int64_t batches_per_epoch_;
  const CheckpointConfig config_;
  Position at_;
  torch::Tensor order_;  // (N_train) this epoch's order of the training set, on the device
  Tally tally_;          // this epoch's sums so far
  std::chrono::steady_clock::time_point epoch_start_;
  double seconds_before_ = 0;  // of a resumed epoch, trained before the resume
  double saving_seconds_ = 0;  // step checkpoints' writing, which is not training time
  StepGpuTimer gpu_timer_;     // a few steps' GPU time per epoch, beside the wall time
  const std::vector<int64_t> gpu_timed_steps_;  // which steps of an epoch it times
  // The running loss (on_loss): the steps since the last report add their shard's summed loss
  // on the device, so that only a report makes the host wait.
  struct LossWindow {
    torch::Tensor sum;   // () float64, on the device
    int64_t count = 0;   // examples in `sum`
    int64_t steps = 0;   // steps since the last report
  } loss_window_;
  TrainResult result_;
};

TrainResult RankTraining::run() {
  if (reporter() && callbacks_.on_start) {
    callbacks_.on_start(result_.devices, result_.epochs, at_.global_step, result_.resumed_from);
  }
  NonFiniteGuard guard(options_, model_, plan_.device, batches_per_epoch_);
  for (; at_.epoch < options_.epochs && !max_steps_reached(); ++at_.epoch, at_.step = 0) {
    start_epoch();
    while (at_.step < batches_per_epoch_ && !max_steps_reached()) {
      const StepLoss loss = take_step(guard);
      if (end_step(loss, guard) == Next::kStop) break;
    }
    if (end_epoch(guard) == Next::kStop) break;
  }
  end_run(guard);
  return result_;
}

// The end of a step: one block per side concern. kStop when the ranks agreed on a stop request
// inside the epoch (result_.stopped_by says which signal); the end of the epoch saves for it.
RankTraining::Next RankTraining::end_step(const StepLoss& loss, NonFiniteGuard& guard) {
  // Host check points: where the ranks agree on a stop request and kStop reads the non-finite
  // record. Every step on the CPU, where reading costs nothing; sparser on a GPU.
  const int64_t check_every = plan_.device.is_cpu() ? 1 : 25;
  const bool inside_epoch = at_.step < batches_per_epoch_;
  if (reporter() && callbacks_.on_step) {
    wait_host("the step callback");
    callbacks_.on_step(StepStats{at_.epoch + 1, at_.step, batches_per_epoch_,
                                 loss.sum.item<double>() / std::max<int64_t>(loss.shard_size, 1)});
  }
  if (reporter() && callbacks_.on_progress && options_.progress_every > 0 &&
      (at_.step % options_.progress_every == 0 || !inside_epoch)) {
    wait_host("the progress report");
    const auto running = means_of(tally_.read());
    callbacks_.on_progress(ProgressStats{at_.epoch + 1, options_.epochs, at_.step,
                                         batches_per_epoch_, at_.images, epoch_seconds(),
                                         running.loss, running.accuracy});
  }
  if (reports_loss() && at_.global_step % options_.loss_every == 0 && loss_window_.count > 0) {
    wait_host("the running loss");
    callbacks_.on_loss(LossStats{at_.epoch + 1, at_.global_step, loss_window_.steps,
                                 loss_window_.sum.item<double>() /
                                     static_cast<double>(loss_window_.count)});
    loss_window_.sum.zero_();
    loss_window_.count = 0;
    loss_window_.steps = 0;
  }
  if (options_.check_replicas_every > 0 && at_.global_step % options_.check_replicas_every == 0) {
    wait_host("the replica check");
    check_replicas_identical(*model_, communicator_, at_.global_step);
  }
  if (inside_epoch && at_.global_step % check_every == 0) {
    wait_host("the step's host check");
    guard.throw_if_bad_step(result_.last_checkpoint);
    result_.stopped_by = agreed_stop_signal(options_.stop_signal, communicator_, plan_.device);
    if (result_.stopped_by != 0) return Next::kStop;
  }
  // A step checkpoint (--checkpoint-every-steps); at the epoch's end, or at the --max-steps
  // cut, the end of the epoch saves.
  if (checkpoints() && options_.checkpoint_every_steps > 0 && inside_epoch &&
      !max_steps_reached() && at_.global_step % options_.checkpoint_every_steps == 0) {
    guard.throw_if_bad_step(result_.last_checkpoint);  // never save a non-finite step's weights
    const auto save_start = std::chrono::steady_clock::now();
    save_checkpoint(at_.epoch, at_.step,
                    settle_partial_epoch("the epoch's sums for a step checkpoint"),
                    epoch_seconds());
    saving_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start).count();
  }
  return Next::kGoOn;
}

// The end of an epoch, or of the steps it got: one block per side concern. kStop when the run
// ends here (a stop inside the epoch or agreed at its end, or the --max-steps cut), before the
// position moves on to the next epoch.
RankTraining::Next RankTraining::end_epoch(NonFiniteGuard& guard) {
  wait_host("the end of the epoch");
  synchronize(plan_.device);
  const double seconds = epoch_seconds();
  guard.throw_if_bad_step(result_.last_checkpoint);
  if (result_.stopped_by != 0) {  // a stop inside the epoch: save where it stands, for the resume
    if (checkpoints()) {
      save_checkpoint(at_.epoch, at_.step, settle_partial_epoch("partial epoch sums"), seconds);
    }
    return Next::kStop;
  }
  const EpochStats stats = finish_epoch(seconds, guard.take_epoch_skipped());
  result_.epochs.push_back(stats);
  // The epoch's callback (its line, the driver's records) comes first, as it always did, but a
  // failure in it waits until the epoch's checkpoint is written: the records must never cost
  // the weights (Note [A failed record costs only itself] in app/run_records.cpp).
  std::exception_ptr callback_failure;
  if (reporter() && callbacks_.on_epoch) {
    try {
      callbacks_.on_epoch(stats);
    } catch (...) {
      callback_failure = std::current_exception();
    }
  }
  const auto rethrow_callback_failure = [&] {
    if (callback_failure) std::rethrow_exception(callback_failure);
  };
  if (at_.step < batches_per_epoch_) {
    // --max-steps cut this epoch short: its checkpoint records the position inside it and the
    // sums so far (all-reduced by finish_epoch), so that a resume finishes the epoch.
    if (checkpoints()) save_checkpoint(at_.epoch, at_.step, tally_.read(), seconds);
    rethrow_callback_failure();
    return Next::kStop;
  }
  const bool last = at_.epoch + 1 == options_.epochs;
  // (The schedule stays the same on every rank even when a callback failed: the checkpoint's
  // write is a collective, and only the reporting replicas call back.)
  const bool scheduled = (at_.epoch + 1) % options_.checkpoint_every == 0 || last ||
                         (options_.checkpoint_every_steps > 0 &&
                          at_.global_step % options_.checkpoint_every_steps == 0);
  if (checkpoints() && scheduled) save_checkpoint(at_.epoch + 1, 0, Totals{}, 0);
  rethrow_callback_failure();
  // A stop requested during the epoch's last step, the evaluation or the checkpoint ends the
  // run here, keeping the finished epoch even between scheduled checkpoints.
  if (last) return Next::kGoOn;
  result_.stopped_by = agreed_stop_signal(options_.stop_signal, communicator_, plan_.device);
  if (result_.stopped_by != 0) {
    if (checkpoints() && !scheduled) save_checkpoint(at_.epoch + 1, 0, Totals{}, 0);
    return Next::kStop;
  }
  return Next::kGoOn;
}

// The end of the run: the last replica check, --save-model, and the run's own figures.
void RankTraining::end_run(const NonFiniteGuard& guard) {
  if (options_.check_replicas_every > 0) {
    check_replicas_identical(*model_, communicator_, at_.global_step);
  }
  result_.steps_run = at_.global_step - (plan_.start ? plan_.start->global_step : 0);
  result_.skipped_steps = guard.skipped();
  result_.graph_replays = graph_ ? graph_->replays() : 0;
  result_.gpu_step_ms = gpu_timer_.all_ms();
  result_.gpu_samples = gpu_timer_.samples();
  result_.gpu_samples_dropped = gpu_timer_.dropped();
  result_.graph_nodes = graph_ ? graph_->captured_nodes() : -1;
  // Note [A run that trained nothing]
  // --on-nonfinite skip promises that a bad step leaves the weights as they were, and goes on.
  // A run every one of whose steps was skipped (the learning rate blew the weights up before
  // it, or a resume of weights already blown up) has then changed nothing: its weights are the
  // ones it started from. Ending it with success and a --save-model file would pass them off as
  // a trained model. So such a run (that took steps, and was not stopped, which says so itself)
  // writes no --save-model and ends in one error line, after its epochs were reported and
  // checkpointed as usual (the checkpoints keep the position and the history, whose epochs say
  // that none of their steps trained). A run of which some step trained is a success: its
  // figures are those of the trained steps (Note [An epoch without a trained step]).
  const bool trained_nothing = result_.stopped_by == 0 && result_.steps_run > 0 &&
                               result_.skipped_steps == result_.steps_run;
  if (plan_.rank == 0 && options_.save_model && result_.stopped_by == 0 && !trained_nothing) {
    communicator_.wait_host("the saved model's copy of the weights");
    save_model_atomically(averaged_ ? averaged_ : model_, config_, at_.epoch, at_.step,
                          at_.global_step, result_.epochs, *options_.save_model);
  }
  if (trained_nothing) {
    throw std::runtime_error(
        "no step of this run trained: all " + std::to_string(result_.steps_run) +
        " of its steps had a non-finite gradient and were skipped (--on-nonfinite skip), so its "
        "weights are the ones it started from" +
        (options_.save_model ? "; --save-model " + *options_.save_model + " was not written"
                             : std::string()) +
        (plan_.start ? ". Lower --lr, or resume from an earlier checkpoint" : ". Lower --lr"));
  }
}

// An epoch's start, or a resumed epoch's: its data order, and its sums and seconds so far (rank 0
// holds a resumed epoch's sums, as they are global).
void RankTraining::start_epoch() {
  const auto order_host = epoch_order(train_.labels.size(0), options_.seed, at_.epoch);
  order_ = torch::tensor(order_host, torch::kInt64).to(plan_.device);  // (N_train)
  tally_ = Tally(plan_.device);
  seconds_before_ = 0;
  saving_seconds_ = 0;
  at_.images = at_.step * options_.batch_size;
  if (at_.step > 0 && plan_.start) {
    seconds_before_ = plan_.start->partial_seconds;
    if (plan_.rank == 0) tally_.set(plan_.start->partial_sums);
  }
  model_->train();
  synchronize(plan_.device);
  epoch_start_ = std::chrono::steady_clock::now();
}

// This rank's shard of the next global batch through the step, the update where the gradient
// allows it, and the position moved on.
RankTraining::StepLoss RankTraining::take_step(NonFiniteGuard& guard) {
  const bool timed = gpu_timed();
  if (timed) gpu_timer_.begin();
  const int64_t num_train = train_.labels.size(0);
  const auto [begin, end] = batch_range(num_train, options_.batch_size, at_.step);
  const int64_t global_batch = end - begin;
  const auto [shard_begin, shard_end] = shard_range(global_batch, plan_.world_size, plan_.rank);
  const auto index = order_.narrow(0, begin + shard_begin, shard_end - shard_begin);  // (n)
  // x: (n, 1, 28, 28), y: (n), in buffers reused by every step.
  const auto [gathered, y] = assembler_.gather(train_.images, train_.labels, index);
  const auto x = augmented(gathered, global_batch, shard_begin);  // (n, 1, 28, 28)
  // With --cuda-graph the step is captured once and replayed (Note [Capturing the whole step] in
  // cuda_graph_step.cpp), the update with it where it belongs to the step.
  const auto body = [this, global_batch](const torch::Tensor& bx, const torch::Tensor& by) {
    auto [loss_sum, logits] = step(bx, by, global_batch);
    if (update_in_step()) update();
    return std::vector<torch::Tensor>{loss_sum, logits};
  };
  const auto outputs = graph_ ? graph_->run(x, y, body) : body(x, y);
  const torch::Tensor& loss_sum = outputs.at(0);  // ()
  const torch::Tensor& logits = outputs.at(1);    // (n, 10)
  ++at_.global_step;
  if (graph_ && !update_in_step()) graph_->wait_host("the non-finite check");
  if (guard.allow_update(*reducer_, at_.global_step, communicator_)) {
    if (!update_in_step()) update();
    if (averaged_) {
      update_weight_average(*averaged_, *model_,
                            weight_average_decay(options_.recipe.ema_decay, at_.global_step - 1));
    }
    tally_.add(loss_sum, logits, y);
    guard.keep_buffers();
    if (reports_loss()) {
      loss_window_.sum += loss_sum.detach().to(torch::kFloat64);
      loss_window_.count += index.size(0);
    }
  }
  ++loss_window_.steps;
  if (timed) gpu_timer_.end();
  ++at_.step;
  at_.images += global_batch;
  return {loss_sum, index.size(0)};
}

// The book's step on this rank's shard x (n, 1, 28, 28), y (n) of a global batch of
// `global_batch` examples: zero grad -> forward -> loss -> backward (buckets all-reduce as they
// fill) -> wait. Returns the shard's summed loss () and logits (n, 10); the SGD step is the
// caller's, once the gradient is known to be finite.
std::pair<torch::Tensor, torch::Tensor> RankTraining::step(const torch::Tensor& x,
                                                           const torch::Tensor& y,
                                                           int64_t global_batch) {
  reducer_->zero_grad();
  torch::Tensor loss_sum, logits;
  if (x.size(0) > 0 || options_.sync_bn) {
    {
      const AutocastGuard autocast(plan_.device, options_.amp);
      logits = model_->forward(x);  // (n, 10)
    }
    logits = logits.to(torch::kFloat32);  // the loss in float32 whatever the forward's type
    auto loss_options = F::CrossEntropyFuncOptions().reduction(torch::kSum);
    if (options_.recipe.label_smoothing != 0) {
      loss_options.label_smoothing(options_.recipe.label_smoothing);
    }
    loss_sum = F::cross_entropy(logits, y, loss_options);
  } else {
    // A replica with no examples (a global batch smaller than the world) still joins every
    // gradient all-reduce, with zeros. (With sync-bn it runs the empty forward instead, to join
    // the statistics all-reduces too.)
    loss_sum = torch::zeros({}, torch::dtype(torch::kFloat32).device(plan_.device));
    for (const auto& p : model_->parameters()) loss_sum = loss_sum + p.sum() * 0.0;
    logits = torch::zeros({0, kNumClasses}, loss_sum.options());
  }
  // Each replica divides its summed loss by the GLOBAL batch size, so the all-reduced sum of
  // gradients is exactly the gradient of the mean loss over the global batch, however unevenly
  // the batch splits over the replicas.
  const auto loss = loss_sum / static_cast<double>(global_batch);
  reducer_->prepare_for_backward();
  loss.backward();
  reducer_->finalize_backward();
  return {loss_sum, logits};
}

// --augment crop-flip: this rank's shard x (n, 1, 28, 28), the rows from `shard_begin` of a
// global batch of `global_batch`, cropped and flipped by the global batch's draws (Note
// [Augmentation draws belong to the global batch]). Without it, x itself.
torch::Tensor RankTraining::augmented(const torch::Tensor& x, int64_t global_batch,
                                      int64_t shard_begin) const {
  if (options_.recipe.augment == Augment::kNone) return x;
  const int64_t padding = options_.recipe.crop_padding;
  const auto draws = draw_crop_flip(options_.seed, at_.epoch, at_.step, global_batch, padding)
                         .narrow(0, shard_begin, x.size(0))
                         .to(plan_.device);  // (n, 3)
  return crop_flip(x, draws, padding);
}

// The update from the reduced gradient: clipped where the recipe clips, then SGD at this step's
// learning rate (the step just taken is global step at_.global_step - 1, 0-based, wherever this
// runs: the graphed step runs it before the position moves on, the eager one after).
void RankTraining::update() {
  const int64_t step = update_in_step() ? at_.global_step : at_.global_step - 1;
  if (options_.recipe.clip_grad_norm > 0) {
    clip_gradient_norm(*reducer_, options_.recipe.clip_grad_norm);
  }
  sgd_->step(
      lr_at(options_.lr, options_.recipe.schedule, step, batches_per_epoch_, options_.epochs));
}

// Whether the SGD update is part of the graphed step. Under kStop a step always updates (a bad
// one is reported at the next host check), so the graph captures the update with the step; kSkip
// must read the gradient's verdict on the host first. Eager steps keep the update after the
// non-finite check, in the order (and so with the allocations) they always had.
bool RankTraining::update_in_step() const {
  return graph_ != nullptr && options_.on_nonfinite == NonFinite::kStop;
}

// Whether this step's GPU time is sampled (step_gpu_time.h): one of the epoch's few timed steps,
// on a GPU, and with --cuda-graph a replay (never the warm-up or the capture, which are not
// the steady step and whose capture must not see the timer's work).
bool RankTraining::gpu_timed() const {
  return gpu_timer_.active() &&
         std::binary_search(gpu_timed_steps_.begin(), gpu_timed_steps_.end(), at_.step) &&
         (graph_ == nullptr || graph_->captured());
}

// Before the host reads what the steps wrote: the last graph replay (whose collectives the
// communicator cannot see), then the communicator's own collectives, each within the timeout.
void RankTraining::wait_host(const std::string& what) {
  if (graph_) graph_->wait_host(what);
  communicator_.wait_host(what);
}

// The epoch's training seconds so far: those before a resume included, checkpoint writing not.
double RankTraining::epoch_seconds() const {
  return seconds_before_ - saving_seconds_ +
         std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_).count();
}

// Note [Step checkpoints resume bit for bit]
// A checkpoint inside an epoch holds one set of BatchNorm statistics and the epoch's sums so
// far, and a resume gives every replica those statistics and rank 0 those sums (the others
// start from zero). So the run that writes a step checkpoint puts itself into that very
// state: the replicas' statistics are averaged in place and the sums are gathered on rank 0.
// Whether a run is interrupted after a step checkpoint or not, it then continues from the
// same bits, weights, statistics and sums alike. (The momentum update is linear, so the mean
// after the epoch's end is the same, to rounding, as without the checkpoint; rank 0's alone
// would move it by (1 - momentum)^k times the replicas' spread.) Returns the sums.
Totals RankTraining::settle_partial_epoch(const std::string& what) {
  average_buffers(*model_, communicator_);
  if (averaged_) average_buffers(*averaged_, communicator_);
  const Totals sums = tally_.reduce(communicator_, what);
  if (plan_.rank != 0) tally_.set(Totals{});
  return sums;
}

// The end of a whole (or a --max-steps-cut) epoch, once the device is synchronised: its sums
// reduced over the ranks, the replicas' BatchNorm statistics averaged so that every rank
// evaluates the same model, the evaluations, and the epoch's figures.
EpochStats RankTraining::finish_epoch(double seconds, int64_t skipped_steps) {
  EpochStats stats;
  stats.epoch = at_.epoch + 1;
  stats.epochs = options_.epochs;
  stats.steps = at_.step;
  stats.skipped_steps = skipped_steps;
  stats.seconds = seconds;
  if (gpu_timer_.active()) {
    const GpuTimes times = gpu_timer_.take_finished();  // synchronised above
    stats.gpu_ms_per_step = median_or_nan(times.ms);
    stats.gpu_samples_dropped = static_cast<double>(times.dropped);
    stats.gpu_spin_ms = times.spin_ms;
  }
  const auto train = means_of(tally_.reduce(communicator_, "training loss and accuracy"));
  // Note [An epoch without a trained step]
  // Under --on-nonfinite skip a skipped step adds nothing to the epoch's sums, so the training
  // figures are means over the trained steps' examples. When no step trained, the sums are
  // 0 examples, and 0/0 is no loss, accuracy or pace: a 0.0000 loss would read as a perfect
  // fit. The figures are then NaN, which every writer already knows as "no figure": "-" in the
  // epoch line, null in JSON Lines and an empty CSV field, no TensorBoard point, "nan" in a
  // checkpoint's run state (whose checks accept NaN for the accuracy and the pace only beside
  // a NaN loss, which a trained epoch never has) and a gap in the plot.
  // The test loss and accuracy stay: the weights are evaluated all the same.
  const bool trained = train.count > 0;
  const double none = std::numeric_limits<double>::quiet_NaN();
  stats.train_loss = trained ? train.loss : none;
  stats.train_acc = trained ? train.accuracy : none;
  stats.images_per_second = !trained ? none : seconds > 0 ? train.count / seconds : 0;
  if (trained && !std::isfinite(stats.train_loss)) {
    throw std::runtime_error(
        "epoch " + std::to_string(at_.epoch + 1) + ": the training loss is not finite (" +
        std::to_string(stats.train_loss) + "); the learning rate may be too high");
  }
  average_buffers(*model_, communicator_);
  // With --ema the averaged weights are what is evaluated (and saved); their BatchNorm
  // statistics are averaged over the replicas like the model's.
  if (averaged_) average_buffers(*averaged_, communicator_);
  evaluate_epoch(averaged_ ? averaged_ : model_, stats);
  // How well the epoch used the machine (Note [Counting FLOPs] in model/flops.h): every image a
  // step took over all ranks, as the seconds count them (a resumed epoch's earlier part included;
  // a step skipped as non-finite included, as it computed all the same), at 3 forward passes
  // each; and the memory peaks so far, the evaluation's included.
  const int64_t forward = forward_flops_per_image(*model_, kImageSide, kImageSide);
  const auto per_image = kTrainingPassesPerImage * forward;
  const double flops = static_cast<double>(per_image) * static_cast<double>(at_.images);
  stats.tflops = seconds > 0 ? flops / seconds / 1e12 : std::numeric_limits<double>::quiet_NaN();
  const double peak = device_peak_tflops(options_.peak_tflops, options_.amp, plan_.device);
  stats.mfu = model_flops_utilization(stats.tflops, peak, plan_.world_size);
  stats.peak_host_bytes = peak_host_bytes();
  stats.peak_device_bytes = peak_device_bytes(plan_.device);
  return stats;
}

// The evaluations after an epoch of `model` (the replica, or its average), its statistics
// averaged over the replicas: the test set, then the validation set where there is one, each
// sharded over the ranks alike; and their seconds, the devices synchronised before and after.
void RankTraining::evaluate_epoch(ResNet& model, EpochStats& stats) {
  synchronize(plan_.device);
  const auto start = std::chrono::steady_clock::now();
  const auto test = means_of(evaluate(model, test_, options_, plan_, communicator_));
  stats.test_loss = test.loss;
  stats.test_acc = test.accuracy;
  if (validation_.labels.defined()) {
    const auto validation = means_of(evaluate(model, validation_, options_, plan_, communicator_));
    stats.val_loss = validation.loss;
    stats.val_acc = validation.accuracy;
  }
  synchronize(plan_.device);
  stats.eval_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Every checkpoint of the run: the position after `epochs_done` epochs and `step_in_epoch` steps
// of the next, with that epoch's sums and seconds so far, and the finished epochs' history.
void RankTraining::save_checkpoint(int64_t epochs_done, int64_t step_in_epoch, const Totals& sums,
                                   double seconds) {
  communicator_.wait_host("the checkpoint's copy of the weights");
  Checkpoint checkpoint = checkpoint_of_run(model_, config_, epochs_done, step_in_epoch,
                                            at_.global_step, result_.epochs);
  checkpoint.partial_sums = sums;
  checkpoint.partial_seconds = seconds;
  checkpoint.state = optimizer_state(model_, *sgd_, averaged_);
  const std::string path =
      *options_.checkpoint_dir + "/" + checkpoint_file_name(epochs_done, step_in_epoch);
  write_checkpoint_everywhere(checkpoint, path, communicator_, plan_.device);
  result_.last_checkpoint = path;
  if (reporter() && callbacks_.on_checkpoint) callbacks_.on_checkpoint(path);
}

}  // namespace

TrainResult run_rank(const FashionMnist& data, const TrainOptions& options, const RankPlan& plan,
                     const TrainCallbacks& callbacks) {
  at::set_num_threads(plan.threads);  // intra-op threads are per calling thread under OpenMP
  // This thread's current device: new tensors, NCCL and cuDNN handles go where the replica is.
  const c10::DeviceGuard device_guard(plan.device);
  JoinedWorld world(seat_of(options, plan));
  TrainResult result = RankTraining(data, options, plan, callbacks, world).run();
  world.leave();
  return result;
}

// One rank's evaluation of the start's weights: the same world and replica as training, then
// the evaluation after an epoch.
EvalResult evaluate_rank(const FashionMnist& data, const TrainOptions& options,
                         const RankPlan& plan) {
  at::set_num_threads(plan.threads);
  const c10::DeviceGuard device_guard(plan.device);
  JoinedWorld world(seat_of(options, plan));
  ResNet model = make_replica(options, plan, world.communicator());
  torch::Tensor logits;  // (test images, classes), when asked for
  const auto totals = evaluate(model, to_device(data.test, plan.device), options, plan,
                               world.communicator(), plan.collect_logits ? &logits : nullptr);
  const auto test = means_of(totals);
  EvalResult result{test.loss, test.accuracy, static_cast<int64_t>(totals.count), world.devices(), {}};
  if (plan.collect_logits) {
    const auto host = logits.to(torch::kCPU).contiguous();
    result.logits.assign(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
  }
  world.leave();
  return result;
}

}  // namespace dptrain
