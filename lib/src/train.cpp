// The training run: rendezvous, replicas, the step and the epoch. See train.h.
#include "dptrain/train.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <torch/nn/functional/loss.h>
#include <torch/serialize.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>

#include "dptrain/autocast.h"
#include "dptrain/batch_input.h"
#include "dptrain/batch_norm.h"
#include "dptrain/batching.h"
#include "dptrain/checkpoint.h"
#include "dptrain/checkpoint_directory.h"
#include "dptrain/devices.h"
#include "dptrain/errors.h"
#include "dptrain/files.h"
#include "dptrain/memory_budget.h"
#include "dptrain/model.h"
#include "dptrain/rendezvous.h"
#include "dptrain/replicas.h"
#include "dptrain/run_configuration.h"

namespace dptrain {
namespace {

namespace F = torch::nn::functional;

// A rank's options have their layout resolved for its device (run_world): never kAuto here.
bool channels_last(const TrainOptions& options) {
  return options.memory_format == MemoryFormat::kChannelsLast;
}

// The replicas of this process, each a thread with its own communicator. When one fails, the
// others' process groups are aborted, so that their collectives with it end at once instead of
// at the timeout (Communicator::abort; a no-op for Gloo, whose peers see the closed connection).
class LocalReplicas {
 public:
  void add(Communicator* communicator) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) communicator->abort();
    members_.push_back(communicator);
  }
  void remove(Communicator* communicator) {
    std::lock_guard<std::mutex> lock(mutex_);
    members_.erase(std::remove(members_.begin(), members_.end(), communicator), members_.end());
  }
  void abort_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
    for (auto* communicator : members_) communicator->abort();
  }

 private:
  std::mutex mutex_;
  std::vector<Communicator*> members_;
  bool failed_ = false;
};

// Everything one rank needs to know to run.
struct RankPlan {
  int rank = 0;
  int world_size = 1;
  torch::Device device{torch::kCPU};
  int threads = 1;
  c10::intrusive_ptr<c10d::Store> store;  // null for a world of one
  bool loopback = true;
  bool first_local = true;            // the first replica of this process: it calls the callbacks
  const Checkpoint* start = nullptr;  // weights and position to start from, if any
  std::string start_name;             // where `start` came from, for messages
  bool evaluate_only = false;         // evaluate the start's weights instead of training
  LocalReplicas* local = nullptr;     // this process's replicas, when there are several
  std::string settings;               // settings_text of what every rank must agree on
  std::string train_digest;           // dataset_digest of the training set, for checkpoints
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
  // The sums as they stand, read on the host (which waits for the device).
  std::array<double, 3> read() const {
    const auto host = sums.to(torch::kCPU);
    return {host[0].item<double>(), host[1].item<double>(), host[2].item<double>()};
  }
  // {mean loss, accuracy, count} of sums {loss sum, correct, count}.
  static std::array<double, 3> means(const std::array<double, 3>& sums) {
    const double count = std::max(sums[2], 1.0);
    return {sums[0] / count, sums[1] / count, sums[2]};
  }
  // Sums over all ranks, in place; returns their means.
  std::array<double, 3> reduce(Communicator& communicator, const std::string& what) {
    communicator.allreduce_sum(sums, what);
    communicator.wait_host(what);
    return means(read());
  }
};

// The evaluation after each epoch: every rank takes a contiguous shard of the test set.
std::array<double, 3> evaluate(ResNet& model, const DeviceData& data, int64_t batch_size,
                               const TrainOptions& options, Communicator& communicator) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto [begin, end] =
      shard_range(data.test_labels.size(0), communicator.world_size(), communicator.rank());
  Tally tally(data.test_labels.device());
  for (int64_t i = begin; i < end; i += batch_size) {
    const int64_t n = std::min(batch_size, end - i);
    auto x = to_model_input(data.test_images.narrow(0, i, n));  // (n, 1, 28, 28)
    if (channels_last(options)) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    auto y = data.test_labels.narrow(0, i, n);  // (n)
    torch::Tensor logits;                       // (n, 10)
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

void save_model_atomically(ResNet& model, const std::string& path) {
  // A CPU copy is saved: the replica's parameters live in the reducer's buckets and stay put.
  // torch::save writes into memory, and the one atomic writer puts the bytes on disk, so a full
  // disk or a file-size limit is an error line and leaves no temporary file (LibTorch's own
  // file writer fails inside a destructor, which ends the process).
  ResNet copy(model->options());
  load_model_tensors(*copy, model_tensors(*model), "in memory");
  std::ostringstream bytes;
  torch::save(copy, bytes);
  const std::string data = bytes.str();
  write_file_atomically(path, data.data(), data.size(), "--save-model " + path);
}

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

// Every rank learns whether rank 0 managed to write; a failed write is an error everywhere,
// instead of rank 0 leaving while the others wait for it in the next collective.
std::string save_checkpoint_on_rank0(const Checkpoint& checkpoint, const std::string& directory,
                                     Communicator& communicator, const torch::Device& device) {
  const std::string path =
      directory + "/" + checkpoint_file_name(checkpoint.epochs_done, checkpoint.step_in_epoch);
  std::string error;
  if (communicator.rank() == 0) {
    try {
      write_checkpoint_atomically(checkpoint, path);
    } catch (const DataError& e) {
      error = e.what();
    }
  }
  auto failed = torch::full({1}, error.empty() ? 0 : 1, torch::dtype(torch::kInt64).device(device));
  communicator.allreduce_max(failed, "checkpoint agreement");
  if (!error.empty()) throw DataError(error);
  if (failed.item<int64_t>() != 0) {
    throw DataError("rank 0 could not write checkpoint " + path + " (see rank 0's error)");
  }
  return path;
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

// Note [Non-finite steps]
// The decision is taken on the all-reduced gradient, which is the same on every rank, so the
// ranks agree without a collective of their own. kSkip must know before the update and reads
// the flag every step; kStop only records the first bad step on the device and reads it at the
// host check points, so a GPU epoch never waits for it.
torch::Tensor gradients_finite(const Reducer& reducer) {
  torch::Tensor finite;
  for (size_t i = 0; i < reducer.num_buckets(); ++i) {
    auto bucket_finite = torch::isfinite(reducer.bucket(i)).all();
    finite = finite.defined() ? finite.logical_and(bucket_finite) : bucket_finite;
  }
  return finite;  // () bool
}

// ---- One rank -----------------------------------------------------------------

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
  for (const auto& placement : placements) devices.push_back(placement.device);
  WorldOptions world_options;
  world_options.backend = options.backend;
  world_options.timeout = options.timeout;
  world_options.loopback = plan.loopback;
  return std::make_unique<Communicator>(plan.store, plan.rank, plan.world_size, world_options);
}

TrainResult run_rank(const FashionMnist& data, const TrainOptions& options, const RankPlan& plan,
                     const TrainCallbacks& callbacks) {
  at::set_num_threads(plan.threads);  // intra-op threads are per calling thread under OpenMP
  // This thread's current device: new tensors, NCCL and cuDNN handles go where the replica is.
  const c10::DeviceGuard device_guard(plan.device);
  // The callbacks run on one rank per process, the first of this process's replicas; whether
  // anything is printed is the caller's choice. Files are written by global rank 0 only.
  const bool reporter = plan.first_local;

  // Rendezvous: every rank present, agreeing on the world, then the process group.
  TrainResult result;
  result.world_size = plan.world_size;
  auto communicator = connect_rank(options, plan, result.devices);
  // Aborting this process's other replicas is run_world's job; membership is ours.
  struct Membership {
    LocalReplicas* local;
    Communicator* communicator;
    ~Membership() {
      if (local) local->remove(communicator);
    }
  } membership{plan.local, communicator.get()};
  if (plan.local) plan.local->add(communicator.get());

  // The replica: the same seed on every rank (or the start's weights), and rank 0's state
  // broadcast to make sure.
  ResNet model(ResNetOptions{kNumClasses, /*in_channels=*/1, options.width});
  init_reference_weights(*model, options.seed);
  const Checkpoint* start = plan.evaluate_only ? nullptr : plan.start;
  if (plan.start) load_model_tensors(*model, plan.start->tensors, plan.start_name);
  model->to(plan.device);
  if (channels_last(options)) convert_to_channels_last(*model);
  if (options.sync_bn) set_batch_norm_sync(*model, communicator.get());
  broadcast_from_rank0(*model, *communicator);
  result.parameter_count = count_parameters(*model);

  const DeviceData device_data{data.train.images.to(plan.device), data.train.labels.to(plan.device),
                               data.test.images.to(plan.device), data.test.labels.to(plan.device)};
  if (plan.evaluate_only) {
    const auto totals = evaluate(model, device_data, options.batch_size, options, *communicator);
    EpochStats stats;
    stats.test_loss = totals[0];
    stats.test_acc = totals[1];
    stats.steps = static_cast<int64_t>(totals[2]);
    result.epochs.push_back(stats);
    communicator->barrier("final barrier");
    communicator->shutdown();
    return result;
  }

  // The reducer also takes over the parameters' storage, for its one-update-per-bucket SGD.
  Reducer reducer(model->parameters(), *communicator, options.bucket_bytes);
  const int64_t num_train = data.train.size();
  const int64_t batches_per_epoch = num_batches(num_train, options.batch_size);
  BatchAssembler assembler(
      shard_range(std::min(options.batch_size, num_train), plan.world_size, 0).second, plan.device,
      channels_last(options));
  const auto config = checkpoint_config(options, num_train, plan.world_size, plan.train_digest);

  // Where to begin: a resumed run carries on at the checkpoint's epoch and step, with the
  // unfinished epoch's sums and seconds so far (held by rank 0 alone, as they are global).
  int64_t first_epoch = 0;
  int64_t first_step = 0;
  int64_t global_step = 0;
  if (start) {
    first_epoch = start->epochs_done;
    first_step = start->step_in_epoch;
    global_step = start->global_step;
    result.epochs = start->history;
    result.resumed_from = plan.start_name;
  }
  if (reporter && callbacks.on_start) {
    callbacks.on_start(result.devices, result.epochs, result.resumed_from);
  }

  // Host check points: where the ranks agree on a stop request and kStop reads the non-finite
  // record. Every step on the CPU, where reading costs nothing; sparser on a GPU.
  const int64_t check_every = plan.device.is_cpu() ? 1 : 25;
  auto first_bad_step =
      torch::full({}, -1, torch::dtype(torch::kInt64).device(plan.device));  // () global step
  const auto throw_if_nonfinite = [&] {
    const int64_t bad = first_bad_step.item<int64_t>();
    if (bad < 0) return;
    throw std::runtime_error("epoch " + std::to_string((bad - 1) / batches_per_epoch + 1) +
                             " step " + std::to_string((bad - 1) % batches_per_epoch + 1) +
                             ": the gradient is not finite (NaN or infinity); training stopped" +
                             (result.last_checkpoint
                                  ? "; the last good checkpoint is " + *result.last_checkpoint
                                  : std::string()) +
                             ". Lower --lr, or pass --on-nonfinite skip");
  };
  // kSkip restores the BatchNorm statistics that the skipped step's forward pass moved.
  std::vector<torch::Tensor> buffers, saved_buffers;
  if (options.on_nonfinite == NonFinite::kSkip) {
    for (auto& b : model->buffers()) {
      buffers.push_back(b);
      saved_buffers.push_back(b.detach().clone());
    }
  }
  const auto make_checkpoint = [&](int64_t epochs_done, int64_t step_in_epoch,
                                   std::array<double, 3> partial_sums, double partial_seconds) {
    communicator->wait_host("the checkpoint's copy of the weights");
    Checkpoint checkpoint;
    checkpoint.config = config;
    checkpoint.epochs_done = epochs_done;
    checkpoint.step_in_epoch = step_in_epoch;
    checkpoint.global_step = global_step;
    checkpoint.partial_sums = partial_sums;
    checkpoint.partial_seconds = partial_seconds;
    checkpoint.history = result.epochs;
    checkpoint.tensors = model_tensors(*model);
    return checkpoint;
  };
  const auto save = [&](const Checkpoint& checkpoint) {
    const auto path =
        save_checkpoint_on_rank0(checkpoint, *options.checkpoint_dir, *communicator, plan.device);
    result.last_checkpoint = path;
    if (reporter && callbacks.on_checkpoint) callbacks.on_checkpoint(path);
  };

  for (int64_t epoch = first_epoch; epoch < options.epochs; ++epoch) {
    if (options.max_steps > 0 && global_step >= options.max_steps) break;
    const auto order_host = epoch_order(num_train, options.seed, epoch);
    const auto order = torch::tensor(order_host, torch::kInt64).to(plan.device);  // (N_train)
    model->train();
    Tally tally(plan.device);
    const int64_t resume_step = epoch == first_epoch ? first_step : 0;
    double seconds_before = 0;  // of this epoch, before a resume
    if (resume_step > 0 && start) {
      seconds_before = start->partial_seconds;
      if (plan.rank == 0) {
        tally.sums.copy_(
            torch::tensor({start->partial_sums[0], start->partial_sums[1], start->partial_sums[2]},
                          torch::kFloat64));
      }
    }

    synchronize(plan.device);
    const auto start_time = std::chrono::steady_clock::now();
    const auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
    };
    int64_t steps = resume_step;
    int64_t images = resume_step * options.batch_size;
    int stop = 0;
    for (int64_t b = resume_step; b < batches_per_epoch; ++b) {
      if (options.max_steps > 0 && global_step >= options.max_steps) break;
      const auto [begin, end] = batch_range(num_train, options.batch_size, b);
      const int64_t global_batch = end - begin;
      const auto [shard_begin, shard_end] = shard_range(global_batch, plan.world_size, plan.rank);
      const auto index = order.narrow(0, begin + shard_begin, shard_end - shard_begin);  // (n)
      // x: (n, 1, 28, 28), y: (n), in buffers reused by every step.
      const auto [x, y] =
          assembler.gather(device_data.train_images, device_data.train_labels, index);

      // zero grad -> forward -> loss -> backward (buckets all-reduce as they fill) -> wait -> step
      reducer.zero_grad();
      torch::Tensor loss_sum, logits;
      if (index.size(0) > 0 || options.sync_bn) {
        {
          const AutocastGuard autocast(plan.device, options.amp);
          logits = model->forward(x);  // (n, 10)
        }
        logits = logits.to(torch::kFloat32);  // the loss in float32 whatever the forward's type
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
      ++global_step;
      const auto finite = gradients_finite(reducer);  // the same on every rank
      if (options.on_nonfinite == NonFinite::kSkip) {
        torch::NoGradGuard no_grad;
        communicator->wait_host("the non-finite check");
        if (!finite.item<bool>()) {
          for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved_buffers[i]);
          ++result.skipped_steps;
        } else {
          reducer.sgd_step(options.lr);
          tally.add(loss_sum, logits, y);
          for (size_t i = 0; i < buffers.size(); ++i) saved_buffers[i].copy_(buffers[i]);
        }
      } else {
        first_bad_step.masked_fill_(first_bad_step.lt(0).logical_and(finite.logical_not()),
                                    global_step);
        reducer.sgd_step(options.lr);
        tally.add(loss_sum, logits, y);
      }
      ++steps;
      images += global_batch;
      if (reporter && callbacks.on_step) {
        communicator->wait_host("the step callback");
        callbacks.on_step(StepStats{epoch + 1, steps, batches_per_epoch,
                                    loss_sum.item<double>() / std::max<int64_t>(index.size(0), 1)});
      }
      if (reporter && callbacks.on_progress && options.progress_every > 0 &&
          (steps % options.progress_every == 0 || steps == batches_per_epoch)) {
        communicator->wait_host("the progress report");
        const auto running = Tally::means(tally.read());
        callbacks.on_progress(ProgressStats{epoch + 1, options.epochs, steps, batches_per_epoch,
                                            images, seconds_before + elapsed(), running[0],
                                            running[1]});
      }
      if (options.check_replicas_every > 0 && global_step % options.check_replicas_every == 0) {
        check_replicas_identical(*model, *communicator, global_step);
      }
      if (global_step % check_every == 0 && b + 1 < batches_per_epoch) {
        communicator->wait_host("the step's host check");
        if (options.on_nonfinite == NonFinite::kStop) throw_if_nonfinite();
        stop = agreed_stop_signal(options.stop_signal, *communicator, plan.device);
        if (stop != 0) break;
      }
    }
    communicator->wait_host("the end of the epoch");
    synchronize(plan.device);
    const double seconds = seconds_before + elapsed();
    if (options.on_nonfinite == NonFinite::kStop) throw_if_nonfinite();

    if (stop != 0) {
      // Stopped inside the epoch: keep its sums so far, summed over the ranks, for the resume.
      result.stopped_by = stop;
      if (options.checkpoint_dir) {
        // The checkpoint holds one set of BatchNorm statistics, but mid-epoch each replica's
        // have followed its own shard: save their mean. The momentum update is linear, so the
        // mean after the epoch's end is the same (to rounding) as without the stop; rank 0's
        // alone would move it by (1 - momentum)^k times the replicas' spread.
        average_buffers(*model, *communicator);
        communicator->allreduce_sum(tally.sums, "partial epoch sums");
        communicator->wait_host("partial epoch sums");
        save(make_checkpoint(epoch, steps, tally.read(), seconds));
      }
      break;
    }

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
    const auto test_totals =
        evaluate(model, device_data, options.batch_size, options, *communicator);
    stats.test_loss = test_totals[0];
    stats.test_acc = test_totals[1];
    result.epochs.push_back(stats);
    if (reporter && callbacks.on_epoch) callbacks.on_epoch(stats);

    if (steps < batches_per_epoch) {
      // --max-steps cut this epoch short: its checkpoint records the position inside it (and
      // the sums so far, all-reduced by tally.reduce), so that a resume finishes the epoch.
      if (options.checkpoint_dir) {
        result.epochs.pop_back();  // the checkpoint's history holds finished epochs only
        save(make_checkpoint(epoch, steps, tally.read(), seconds));
        result.epochs.push_back(stats);
      }
      break;
    }
    const bool last = epoch + 1 == options.epochs;
    const bool scheduled = (epoch + 1) % options.checkpoint_every == 0 || last;
    if (options.checkpoint_dir && scheduled) save(make_checkpoint(epoch + 1, 0, {0, 0, 0}, 0));
    // A stop requested during the epoch's last step, the evaluation or the checkpoint ends the
    // run here, keeping the finished epoch even between scheduled checkpoints.
    if (!last) {
      stop = agreed_stop_signal(options.stop_signal, *communicator, plan.device);
      if (stop != 0) {
        result.stopped_by = stop;
        if (options.checkpoint_dir && !scheduled) save(make_checkpoint(epoch + 1, 0, {0, 0, 0}, 0));
        break;
      }
    }
  }
  if (options.check_replicas_every > 0)
    check_replicas_identical(*model, *communicator, global_step);
  if (plan.rank == 0 && options.save_model && result.stopped_by == 0) {
    communicator->wait_host("the saved model's copy of the weights");
    save_model_atomically(model, *options.save_model);
  }
  // No rank leaves while others may still talk to it.
  communicator->barrier("final barrier");
  communicator->shutdown();
  return result;
}

}  // namespace

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
  if (options.backend == Backend::kNccl && !backend_available(Backend::kNccl)) {
    throw UsageError(
        "--backend nccl: this build of dptrain has no NCCL (it needs a CUDA LibTorch with NCCL "
        "at build time); use --backend gloo");
  }
  if ((world.world_size > 1 || options.process_group_for_one) &&
      !backend_available(options.backend)) {
    throw UsageError("--backend " + backend_name(options.backend) +
                     ": not available in this build of dptrain (Gloo needs its headers, "
                     "libgloo-dev, at build time)");
  }
  if (options.sync_bn) check_sync_bn_devices(world.local_devices);
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

// run_rank, with an allocator's failure turned into one line that says what to change.
TrainResult run_rank_reporting_memory(const FashionMnist& data, const TrainOptions& options,
                                      const RankPlan& plan, const TrainCallbacks& callbacks) {
  try {
    return run_rank(data, options, plan, callbacks);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (what.find("out of memory") == std::string::npos &&
        what.find("can't allocate memory") == std::string::npos) {
      throw;
    }
    throw std::runtime_error("rank " + std::to_string(plan.rank) + " on " +
                             device_name(plan.device) + ": out of memory with --batch-size " +
                             std::to_string(options.batch_size) + " and --width " +
                             std::to_string(options.width) + "; lower one of them (" +
                             what.substr(0, what.find('\n')) + ")");
  }
}

// Runs one rank per local device (a thread each when there are several) and returns the first
// local replica's result.
TrainResult run_world(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                      RankPlan base, const TrainCallbacks& callbacks) {
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
    return run_world(data, contiguous, world, base, callbacks);
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
  if (const auto available = available_host_bytes(); available && world.local_devices[0].is_cpu()) {
    const int64_t shard =
        shard_range(std::min(options.batch_size, std::max<int64_t>(data.train.size(), 1)),
                    world.world_size, 0)
            .second;
    check_host_memory(options.width, shard, local, *available);
  }
  if (world.local_devices.front().is_cuda()) {
    at::globalContext().setBenchmarkCuDNN(options.cudnn_benchmark);
  }
  const int total_threads =
      options.threads > 0 ? static_cast<int>(options.threads) : at::get_num_threads();
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
    return run_rank_reporting_memory(data, options_for(plan.device), plan, callbacks);
  }

  // Replicas in this process: a thread each. The first failure aborts the others' process
  // groups and is reported; the others follow from it (their peer left) and would only hide
  // the cause.
  LocalReplicas replicas;
  base.local = &replicas;
  std::vector<TrainResult> results(static_cast<size_t>(local));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(local));
  std::vector<int> failure_order(static_cast<size_t>(local), 0);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < local; ++i) {
    threads.emplace_back([&, i] {
      RankPlan plan = base;
      plan.rank = world.first_rank + i;
      plan.first_local = i == 0;
      plan.device = world.local_devices[static_cast<size_t>(i)];
      try {
        results[static_cast<size_t>(i)] =
            run_rank_reporting_memory(data, options_for(plan.device), plan, callbacks);
      } catch (...) {
        failure_order[static_cast<size_t>(i)] = ++failures;
        errors[static_cast<size_t>(i)] = std::current_exception();
        replicas.abort_all();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  // Prefer a rank's own failure over a collective error that merely reports a missing peer,
  // and among collective errors the first to happen.
  std::exception_ptr first_collective;
  int first_order = 0;
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const CollectiveError&) {
      if (!first_collective || failure_order[i] < first_order) {
        first_collective = errors[i];
        first_order = failure_order[i];
      }
    } catch (...) {
      throw;
    }
  }
  if (first_collective) std::rethrow_exception(first_collective);
  return results.front();
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
  if (options.fresh) {
    if (!writer) return std::nullopt;
    for (const auto& name : checkpoint_file_names(directory)) {
      const std::string path = directory + "/" + name;
      if (::unlink(path.c_str()) != 0) {
        throw DataError("--fresh: cannot remove " + path + ": " + errno_text());
      }
      notice("--fresh: removed " + path);
    }
    sync_directory(directory);
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
  // File names sort by position, wider numbers (epoch 10000 and up) last.
  const auto later_name = [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() > b.size() : a > b;
  };
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
    if (later_name(path, start_name)) {
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
  if (checkpoint.config.train_digest.empty()) {
    if (callbacks.on_notice) {
      callbacks.on_notice("--resume: " + path +
                          " is of format version 1, which holds no digest of its training set; "
                          "only the set's size is compared");
    }
    return;
  }
  differ("the training set of SHA-256", checkpoint.config.train_digest, run.train_digest);
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
  if (options.resume && !options.checkpoint_dir) {
    throw UsageError("--resume needs --checkpoint-dir, where the checkpoints are");
  }
  if (options.fresh && !options.checkpoint_dir) {
    throw UsageError("--fresh needs --checkpoint-dir, whose checkpoints it removes");
  }
  if (options.fresh && options.resume) {
    throw UsageError("--fresh and --resume exclude each other: start over, or continue");
  }
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
  return run_world(data, options, world, base, callbacks);
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
                            const std::vector<std::pair<std::string, torch::Tensor>>& weights) {
  check_not_empty(data.test, "test");
  Checkpoint start;
  start.tensors = weights;
  RankPlan base;
  base.start = &start;
  base.start_name = "to evaluate";
  base.evaluate_only = true;
  base.settings = settings_text(
      run_settings(options, describe_set(data.train, dataset_digest(data.train)),
                   describe_set(data.test, dataset_digest(data.test)), "the weights to evaluate"));
  const auto result = run_world(data, options, world, base, TrainCallbacks{});
  EvalResult eval;
  eval.test_loss = result.epochs.front().test_loss;
  eval.test_acc = result.epochs.front().test_acc;
  eval.examples = result.epochs.front().steps;
  eval.devices = result.devices;
  return eval;
}

}  // namespace dptrain
