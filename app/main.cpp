// dptrain's entry point: parse the command line, wire the library's pieces together, and turn
// every failure into one "error:" line and an exit status (2 for usage, 1 for run time).
#include <c10/util/Exception.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "download.h"
#include "dptrain/core/cpu_allocator.h"
#include "dptrain/core/devices.h"
#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/core/safetensors.h"
#include "dptrain/data/batching.h"
#include "dptrain/data/data.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/model/model.h"
#include "dptrain/model/numerics.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/rendezvous.h"
#include "dptrain/parallel/world_plan.h"
#include "dptrain/report/metrics.h"
#include "dptrain/report/plot.h"
#include "dptrain/report/report.h"
#include "dptrain/report/tensorboard.h"
#include "dptrain/train/accepted_model.h"
#include "dptrain/train/callbacks.h"
#include "dptrain/train/checked_world.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_directory.h"
#include "dptrain/train/checkpoint_types.h"
#include "dptrain/train/epoch_stats.h"
#include "dptrain/train/recipe.h"
#include "dptrain/train/run_configuration.h"
#include "dptrain/train/train.h"
#include "progress.h"
#include "rendezvous_watchdog.h"
#include "run_records.h"
#include "signals.h"

namespace {

constexpr int kExitRuntimeFailure = 1;
constexpr int kExitUsage = 2;

using dptrain::UsageError;

// A stop request that arrived before the first step: nothing trained, nothing to save.
class StoppedBeforeTheFirstStep : public std::exception {
 public:
  explicit StoppedBeforeTheFirstStep(int signal_number) : signal_number_(signal_number) {}
  int signal_number() const { return signal_number_; }
  const char* what() const noexcept override { return "stopped before the first step"; }

 private:
  int signal_number_;
};

// One line: c10 errors carry a C++ backtrace after the first line, which is not for users.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// Standard output, checked. Nobody sees what a run prints to a closed pipe or a full disk, so
// the first failed write asks the training to stop, keeping a checkpoint, and the exit status
// says what happened: 128 + SIGPIPE for a closed pipe (as if the signal had ended the
// process, but after the checkpoint), 1 for any other failure.
class CheckedStdout {
 public:
  // Writes one line; a failure is remembered and requests a stop.
  void line(const std::string& text) {
    // A standard output that was closed at start is /dev/null now (signals.h): still an error.
    const int error = dptrain::standard_output_was_closed()
                          ? EBADF
                          : dptrain::write_and_flush(stdout, text + "\n");
    if (error == 0 || error_ != 0) return;
    error_ = error;
    dptrain::request_stop(SIGPIPE);
  }
  int error() const { return error_; }
  // After a failed write: one line on stderr, `what` saying what became of the run, and the
  // exit status.
  int report_failure(const std::string& prefix, const std::string& what) const {
    if (error_ == EPIPE) {
      std::fprintf(stderr, "%sdptrain: standard output is a closed pipe; %s\n", prefix.c_str(),
                   what.c_str());
      return 128 + SIGPIPE;
    }
    std::fprintf(stderr, "%serror: cannot write to standard output: %s; %s\n", prefix.c_str(),
                 std::strerror(error_), what.c_str());
    return kExitRuntimeFailure;
  }

 private:
  int error_ = 0;
};

// The Fashion-MNIST files a run reads, packed or not, as inputs for check_distinct_files; none
// when no data directory resolves (the load says why, after the outputs' own checks).
std::vector<dptrain::RoleFile> data_files(const std::optional<std::string>& data_dir_flag) {
  std::vector<dptrain::RoleFile> files;
  std::string dir;
  try {
    dir = dptrain::resolve_data_dir(data_dir_flag);
  } catch (const dptrain::DataError&) {
    return files;
  }
  for (const std::string gz : {dptrain::kTrainImagesFile, dptrain::kTrainLabelsFile,
                               dptrain::kTestImagesFile, dptrain::kTestLabelsFile}) {
    const std::string plain = gz.substr(0, gz.size() - 3);
    files.push_back({"the data file " + gz, dir + "/" + gz});
    files.push_back({"the data file " + plain, dir + "/" + plain});
  }
  return files;
}

// Every output a writer holds for the run (Note [One writer per output] in files.h).
using OutputLocks = std::vector<std::unique_ptr<dptrain::OutputLock>>;

// Global rank 0 writes the files: their paths are checked before the data is read, so that a
// bad one fails now, not after the training (train() checks --save-model and the checkpoint
// directory the same way, for callers of the library), and then locked against a second run.
OutputLocks check_train_outputs(const dptrain::TrainCommand& command, bool writer) {
  if (command.options.checkpoint_dir) {
    // Every rank reads it (a shared file system under a launcher), so every rank checks it.
    try {
      dptrain::prepare_checkpoint_directory(*command.options.checkpoint_dir);
    } catch (const dptrain::DataError& e) {
      throw UsageError(std::string("--checkpoint-dir: ") + e.what());
    }
  }
  // Note [One file, two roles] in files.h. The TensorBoard directory counts as one output: a
  // file given its name would become a directory's name when the directory is made.
  std::vector<dptrain::RoleFile> outputs;
  if (command.options.save_model) outputs.push_back({"--save-model", *command.options.save_model});
  if (command.metrics) outputs.push_back({"--metrics", *command.metrics});
  if (command.plot) outputs.push_back({"--plot", *command.plot});
  if (command.tensorboard) {
    outputs.push_back({"--tensorboard", *command.tensorboard});
    outputs.push_back({"--tensorboard's lock file",
                       dptrain::OutputLock::directory_lock_path(*command.tensorboard)});
  }
  dptrain::check_distinct_files(outputs, data_files(command.data_dir));
  if (command.options.checkpoint_dir) {
    dptrain::check_outputs_apart_from_checkpoints(*command.options.checkpoint_dir, outputs);
  }
  if (command.metrics) dptrain::check_metrics_path(*command.metrics);
  if (command.plot) dptrain::check_plot_path(*command.plot);
  if (command.tensorboard) dptrain::require_tensorboard_support();
  if (!writer) return {};
  if (command.metrics) dptrain::check_output_file(*command.metrics, "--metrics");
  if (command.plot) dptrain::check_output_file(*command.plot, "--plot");
  if (command.tensorboard) dptrain::prepare_tensorboard_dir(*command.tensorboard);
  if (command.options.save_model) {
    dptrain::check_output_file(*command.options.save_model, "--save-model");
  }
  OutputLocks locks;
  for (const auto& output : outputs) {
    if (output.role == "--tensorboard's lock file") continue;  // the directory's, taken with it
    // The TensorBoard directory is locked as a whole: its runs are numbered folders in it
    // (Note [One folder per run] in report/tensorboard.cpp).
    const auto kind = output.role == "--tensorboard" ? dptrain::OutputKind::kDirectory
                                                     : dptrain::OutputKind::kFile;
    locks.push_back(std::make_unique<dptrain::OutputLock>(output.path, output.role, kind));
  }
  return locks;
}

// Under a launcher the world meets over TCP; the library's timeout bounds every wait it can
// interrupt, this bounds the one it cannot (rendezvous_watchdog.h), with a margin for the
// library's own diagnosis to come first.
std::unique_ptr<dptrain::RendezvousWatchdog> make_watchdog(const dptrain::WorldPlan& world,
                                                           std::chrono::milliseconds timeout,
                                                           const std::atomic<int>& stop_signal) {
  const auto& launch = world.launch;
  if (!world.multi_process) {
    return std::make_unique<dptrain::RendezvousWatchdog>(std::nullopt, "", stop_signal);
  }
  return std::make_unique<dptrain::RendezvousWatchdog>(
      timeout * 2 + std::chrono::seconds(10),
      "rank " + std::to_string(launch.rank) + ": rendezvous at " + launch.master_addr + ":" +
          std::to_string(launch.master_port) + " did not complete within " +
          std::to_string(2 * timeout.count() / 1000 + 10) +
          " s: the server there does not answer (is another program using that port?)",
      stop_signal);
}

// What a stop leaves of --save-model: it is written by a run that finished, and a stopped one
// did not, so a stop never writes it, and says so (with or without --checkpoint-dir: without
// one nothing of the run is kept, which the line says too).
std::string save_model_after_stop(const dptrain::TrainOptions& options) {
  if (!options.save_model) return "";
  return std::string("; --save-model ") + *options.save_model +
         " was not written (the run did not finish" +
         (options.checkpoint_dir ? ": resume to finish it)" : ", and without --checkpoint-dir "
                                                              "its weights are lost)");
}

// After train(): the skipped steps, the steady pace and the book's line, and the exit status.
// A resume that had nothing left to train (TrainResult::steps_run 0) measured nothing, so it
// prints no result: the history's last epoch is the checkpoint's figure, not this run's.
int report_training(const dptrain::TrainResult& result, bool reporter,
                    const dptrain::TrainCommand& command, const std::string& prefix,
                    const std::function<void(const std::string&)>& print,
                    const CheckedStdout& out) {
  const bool quiet = command.quiet;
  if (result.skipped_steps > 0 && reporter) {
    print("skipped " + std::to_string(result.skipped_steps) +
          " step(s) with a non-finite gradient (--on-nonfinite skip)");
  }
  const std::string resume =
      (result.last_checkpoint ? "; resume from " + *result.last_checkpoint : "") +
      (result.stopped_by != 0 ? save_model_after_stop(command.options) : "");
  if (result.stopped_by == 0 && reporter && result.steps_run > 0) {
    // The steady pace first (first-epoch warm-up left out), then the book's line, last.
    if (const auto steady = dptrain::format_steady_line(result); !steady.empty() && !quiet) {
      print(steady);
    }
    if (const auto times = dptrain::format_step_time_line(result); !times.empty() && !quiet) {
      print(times);
    }
    if (const auto graph = dptrain::format_graph_line(result); !graph.empty() && !quiet) {
      print(graph);
    }
    print(dptrain::format_final_line(result));
  }
  if (out.error() != 0) {
    return out.report_failure(
        prefix, result.stopped_by != 0 ? "stopped early" + resume : "the result line is lost");
  }
  if (result.stopped_by == 0) return 0;
  if (reporter) {
    std::fprintf(stderr, "%sdptrain: stopped by signal %d%s\n", prefix.c_str(), result.stopped_by,
                 resume.c_str());
  }
  return 128 + result.stopped_by;
}

// The world `train` and `eval` run in, prepared alike in two halves around the options the
// command completes: first where the ranks are (the devices, the launcher, the GPUs) and the
// backend chosen into the options ...
dptrain::WorldPlan plan_command_world(dptrain::TrainCommand& command) {
  const auto world =
      dptrain::plan_world(command.devices, command.gpus, dptrain::read_launch_environment(),
                          dptrain::cuda_device_count());
  command.options.backend = dptrain::choose_backend(
      command.backend, world, dptrain::backend_available(dptrain::Backend::kNccl));
  // A backend named on the command line runs even for one replica (e.g. NCCL on one GPU).
  command.options.process_group_for_one = command.backend.has_value();
  return world;
}

// ... then, once the options are complete (from here they are read, never written), their one
// check against the world: usage mistakes before the data load.
dptrain::CheckedWorld check_command_world(const dptrain::TrainOptions& options,
                                          const dptrain::WorldPlan& world) {
  const auto run = dptrain::check_world(options, world);
  // Before the first parallel region (the data load): --threads, else OMP_NUM_THREADS checked.
  dptrain::start_intra_op_threads(run);
  if (world.multi_process) dptrain::check_master_address(world.launch);
  return run;
}

// The run's first line: the data, the width, the rank, and what arithmetic runs: the layout
// kAuto resolved to, the precision, and on CUDA TF32 and cuDNN's benchmark mode, so an "fp32"
// figure is read for what it is.
std::string describe_run(const dptrain::FashionMnist& data, const std::string& data_dir,
                         const dptrain::TrainOptions& options, const dptrain::WorldPlan& world) {
  const auto& device = world.local_devices.front();
  const auto cpu = dptrain::detect_cpu_kernels();
  const auto layout = dptrain::resolve_memory_format(options.memory_format, device, cpu);
  // "59000 train / 1000 validation / 10000 test" with --val-split, else as it always was.
  const std::string validation =
      data.validation.size() > 0 ? std::to_string(data.validation.size()) + " validation / " : "";
  char header[512];
  std::snprintf(header, sizeof header,
                "dptrain: %lld train / %s%lld test images from %s; width %lld; rank %d of %d; %s: ",
                static_cast<long long>(data.train.size()), validation.c_str(),
                static_cast<long long>(data.test.size()), data_dir.c_str(),
                static_cast<long long>(options.width), world.first_rank, world.world_size,
                dptrain::device_name(device).c_str());
  // The threads, and where the figure came from: ranks on one host that each took every core
  // would run several times slower, with nothing to say why.
  // The recipe where it is not the book's, and what is evaluated and saved with --ema.
  std::string recipe;
  if (!dptrain::is_book_recipe(options.recipe)) {
    recipe = "; recipe: " + dptrain::recipe_flags(options.recipe);
    if (options.recipe.ema_decay != 0) {
      recipe += "; evaluated and saved: the weights' moving average";
    }
  }
  // --conv-bias-grad fused takes effect only where the fused BatchNorm trains (the CPU in
  // channels-last, without --sync-bn); the line says so only where it does.
  dptrain::ResNetOptions model_options;
  model_options.fused_conv_bias_grad = options.fused_conv_bias_grad;
  const bool fused_bias_grad =
      dptrain::fuses_conv_bias_gradients(model_options, device, layout, options.sync_bn);
  return header +
         dptrain::describe_arithmetic(device, layout, options.amp, options.cudnn_benchmark, cpu) +
         (fused_bias_grad ? ", conv bias gradients fused" : "") + "; " +
         dptrain::intra_op_threads(options, world).reason + recipe;
}

// `train()`, where a failure that a stop request caused before the first step (`started` still
// false) is that stop: the request interrupts the rendezvous's socket calls ("Interrupted system
// call"), and before the first step that is the stop, not a failure.
dptrain::TrainResult train_answering_a_stop(const std::function<dptrain::TrainResult()>& train,
                                            const std::atomic<int>& stop_signal,
                                            const bool& started,
                                            dptrain::RendezvousWatchdog& watchdog) {
  try {
    return train();
  } catch (...) {
    if (const int stop = stop_signal.load(); stop != 0 && stop != SIGPIPE && !started) {
      watchdog.cancel();
      throw StoppedBeforeTheFirstStep(stop);
    }
    throw;
  }
}

// The files this driver writes itself, among the settings every rank must agree on.
void add_driver_outputs(dptrain::TrainCommand& command) {
  auto& outputs = command.options.driver_outputs;
  if (command.metrics) outputs.push_back("--metrics");
  if (command.plot) outputs.push_back("--plot");
  if (command.tensorboard) outputs.push_back("--tensorboard");
}

// What the event file's text says of a run: the settings its ranks compare, its devices, and
// where it started (`start`: "the beginning" or the checkpoint's path and step).
std::vector<dptrain::RunSetting> event_file_settings(const dptrain::TrainOptions& options,
                                                     const dptrain::FashionMnist& data,
                                                     const std::string& data_dir,
                                                     const std::vector<std::string>& devices,
                                                     const std::string& start) {
  auto settings = dptrain::run_settings(
      options, std::to_string(data.train.size()) + " images in " + data_dir,
      std::to_string(data.test.size()) + " images", start);
  std::string where;
  for (const auto& device : devices) where += (where.empty() ? "" : ",") + device;
  settings.emplace_back("devices", where);
  settings.emplace_back("--tensorboard-every", std::to_string(options.loss_every));
  if (data.validation.size() > 0) {
    settings.emplace_back("--val-split", std::to_string(data.validation.size()) + " images");
  }
  return settings;
}

// Note [A failed record costs only itself] in run_records.cpp: one line, and the run goes on.
void say_when_a_record_is_lost(dptrain::RunRecords& records, dptrain::ProgressPrinter& progress,
                               const std::string& prefix) {
  records.on_lost([&progress, prefix](const std::string& flag, const std::string& what) {
    progress.clear();
    std::fprintf(stderr, "%serror: %s; the run goes on without %s (checkpoints and --save-model "
                 "are kept) and will exit 1\n", prefix.c_str(),
                 dptrain::message_line(first_line(what)).c_str(),
                 flag.c_str());
  });
}

int run_train(dptrain::TrainCommand command, CheckedStdout& out) {
  const auto world = plan_command_world(command);
  auto& options = command.options;
  const bool records_writer = world.first_rank == 0;
  add_driver_outputs(command);
  const bool reporter = world.first_rank == 0 || command.verbose;
  const bool talk = reporter && !command.quiet;
  // With every rank of a launch printing, each line says whose it is.
  const std::string prefix = world.multi_process && command.verbose
                                 ? "[rank " + std::to_string(world.first_rank) + "] "
                                 : "";
  dptrain::ProgressPrinter progress(isatty(STDERR_FILENO) == 1, command.quiet || !reporter,
                                    command.log_every, prefix);
  options.progress_every = progress.steps_between_updates();
  // From here a stop request is answered: before the first step by the watchdog, which ends the
  // process (nothing has trained), then by the training loop, which saves a checkpoint.
  options.stop_signal = &dptrain::install_stop_handlers();
  const auto run = check_command_world(options, world);
  const auto output_locks = check_train_outputs(command, records_writer);
  const auto watchdog = make_watchdog(world, options.timeout, *options.stop_signal);

  const auto data_dir = dptrain::resolve_data_dir(command.data_dir);
  // The validation images are held out here, so the training set's digest and size, which the
  // checkpoints record and a resume compares, are those of the set actually trained on.
  const auto data = dptrain::load_fashion_mnist(data_dir, command.train_limit, command.test_limit,
                                                command.val_split);
  const std::function<void(const std::string&)> print = [&](const std::string& line) {
    progress.clear();
    out.line(prefix + line);
  };
  if (talk) print(describe_run(data, data_dir, options, world));

  dptrain::RunRecords records(command.metrics, command.plot, options.lr, options.batch_size,
                              options.epochs,
                              dptrain::num_batches(data.train.size(), options.batch_size));
  records.follow_schedule(options.recipe.schedule);
  say_when_a_record_is_lost(records, progress, prefix);
  if (command.tensorboard) {
    records.log_tensorboard(*command.tensorboard, options.checkpoint_dir);
  }
  dptrain::TrainCallbacks callbacks;
  bool started = false;
  callbacks.on_start = [&](const std::vector<std::string>& devices,
                           const std::vector<dptrain::EpochStats>& done, int64_t start_step,
                           const std::optional<std::string>& resumed_from) {
    watchdog->cancel();
    started = true;
    if (resumed_from && talk) print("resuming from " + *resumed_from);
    if (!records_writer) return;
    const auto start = resumed_from
                           ? *resumed_from + " (global step " + std::to_string(start_step) + ")"
                           : "the beginning";
    records.start(devices, done, start_step,
                  event_file_settings(options, data, data_dir, devices, start),
                  resumed_from.has_value());
  };
  callbacks.on_notice = [&](const std::string& text) {
    progress.clear();
    std::fprintf(stderr, "%sdptrain: %s\n", prefix.c_str(), dptrain::message_line(text).c_str());
  };
  callbacks.on_progress = [&](const dptrain::ProgressStats& stats) { progress.show(stats); };
  // Only the writer reads the running loss: elsewhere the steps never wait for it.
  if (records_writer && command.tensorboard) {
    callbacks.on_loss = [&](const dptrain::LossStats& loss) { records.add_loss(loss); };
  }
  callbacks.on_epoch = [&](const dptrain::EpochStats& stats) {
    if (talk) print(dptrain::format_epoch_line(stats));
    if (records_writer) records.add(stats);
  };
  callbacks.on_checkpoint = [&](const std::string& path) {
    if (talk) print("checkpoint: " + path);
  };
  const auto result = train_answering_a_stop([&] { return dptrain::train(data, run, callbacks); },
                                             *options.stop_signal, started, *watchdog);
  progress.clear();
  const int status = report_training(result, reporter, command, prefix, print, out);
  return status == 0 && !records.lost().empty() ? kExitRuntimeFailure : status;
}

// The weights to evaluate: a checkpoint, a --save-model file, or any safetensors file of the
// model's tensors (checkpoint.h: read_model_weights); each knows its width.
dptrain::ModelWeights load_weights(const dptrain::EvalCommand& command) {
  // What this eval can build, before a byte of the file's data is read (Note [A file is bounded
  // by what the run can use, not by its own word] in checkpoint.h): --width when given, else the
  // widest model that fits the memory.
  const auto accepted = command.width_given
                            ? dptrain::accepted_run_model(command.common.options.width,
                                                          /*width_from_flag=*/true)
                            : dptrain::accepted_in_memory(/*model_tensors=*/true);
  if (command.checkpoint) {
    auto checkpoint = dptrain::read_checkpoint(*command.checkpoint, "checkpoint", accepted);
    dptrain::CheckpointConfig model;  // what this dptrain builds, at the file's width
    model.width = checkpoint.config.width;
    model.num_classes = dptrain::kNumClasses;
    model.in_channels = 1;
    dptrain::check_checkpoint_matches(checkpoint.config, model, *command.checkpoint);
    // With --ema the run evaluated (and saved) its averaged weights: so does this.
    const bool averaged = checkpoint.config.recipe.ema_decay != 0;
    return {dptrain::evaluated_weights(checkpoint, *command.checkpoint), checkpoint.config.width,
            averaged ? "its weights' moving average (--ema), which its run evaluated" : ""};
  }
  auto weights = dptrain::read_model_weights(*command.model, "--model", accepted);
  const int64_t width = command.common.options.width;
  if (command.width_given && width != weights.width) {
    throw UsageError("--width " + std::to_string(width) + ": --model " + *command.model +
                     " holds a model of width " + std::to_string(weights.width) +
                     " (leave --width out: the file records it)");
  }
  return weights;
}

// --logits: the test images' logits and labels, in test-set order, as safetensors.
void write_logits(const dptrain::EvalResult& result, const torch::Tensor& labels,  // (N)
                  const std::string& path, const std::string& weights) {
  const auto n = static_cast<int64_t>(result.logits.size()) / dptrain::kNumClasses;
  const auto logits =
      torch::from_blob(const_cast<float*>(result.logits.data()), {n, dptrain::kNumClasses},
                       torch::kFloat32);  // (N, 10), borrowed for the write
  const auto bytes = dptrain::serialize_safetensors(
      {{"logits", logits}, {"labels", labels.to(torch::kInt64)}},
      {{"dptrain.kind", "logits"}, {"dptrain.weights", weights}});
  dptrain::write_file_atomically(path, bytes.data(), bytes.size(), "--logits " + path);
}

int run_download(const dptrain::DownloadCommand& command, CheckedStdout& out) {
  dptrain::DownloadOptions options;
  options.directory = command.directory;
  if (command.url) options.base_url = *command.url;
  options.force = command.force;
  options.low_speed_bytes_per_second = command.speed_limit;
  options.low_speed_timeout = std::chrono::seconds(command.speed_time);
  options.deadline = std::chrono::seconds(command.max_time);
  options.stop_signal = &dptrain::install_stop_handlers(/*announce=*/false);
  const bool terminal = isatty(STDERR_FILENO) == 1;
  const auto show = [&](const dptrain::DownloadProgress& p) {
    using Stage = dptrain::DownloadStage;
    switch (p.stage) {
      case Stage::kSkipped:
        std::fprintf(stderr, "%s: present, checksum correct\n", p.file.c_str());
        break;
      case Stage::kRetrying:
        if (terminal) std::fputs("\r\033[K", stderr);
        std::fprintf(stderr, "%s: attempt %d failed (%s); retrying\n", p.file.c_str(), p.attempt,
                     dptrain::message_line(p.message).c_str());
        break;
      case Stage::kReceiving:
        if (terminal) {  // a live byte count; without a terminal only the final line
          std::fprintf(stderr, "\r%s: %.1f", p.file.c_str(), p.bytes_done / 1e6);
          if (p.bytes_total > 0) std::fprintf(stderr, " / %.1f", p.bytes_total / 1e6);
          std::fputs(" MB\033[K", stderr);
        }
        break;
      case Stage::kDone:
        if (terminal) std::fputs("\r\033[K", stderr);
        std::fprintf(stderr, "%s: %.1f MB, SHA-256 verified\n", p.file.c_str(), p.bytes_done / 1e6);
        break;
    }
    std::fflush(stderr);
  };
  try {
    dptrain::download_fashion_mnist(options, show);
  } catch (const dptrain::DownloadStopped& stopped) {
    if (terminal) std::fputs("\r\033[K", stderr);
    std::fprintf(stderr, "dptrain: download stopped by signal %d; no partial file is left\n",
                 stopped.signal_number());
    return 128 + stopped.signal_number();
  }
  out.line("Fashion-MNIST is in " + command.directory);
  return out.error() != 0 ? out.report_failure("", "the files are in place") : 0;
}

int run_eval(dptrain::EvalCommand command, CheckedStdout& out) {
  const auto world = plan_command_world(command.common);
  const auto run = check_command_world(command.common.options, world);
  const bool writer = world.first_rank == 0;
  std::unique_ptr<dptrain::OutputLock> logits_lock;
  if (command.logits) {
    // Note [One file, two roles] in files.h: the logits never replace what eval reads.
    auto inputs = data_files(command.common.data_dir);
    if (command.model) inputs.push_back({"--model", *command.model});
    if (command.checkpoint) inputs.push_back({"--checkpoint", *command.checkpoint});
    dptrain::check_distinct_files({{"--logits", *command.logits}}, inputs);
  }
  if (command.logits && writer) {
    dptrain::check_output_file(*command.logits, "--logits");
    logits_lock = std::make_unique<dptrain::OutputLock>(*command.logits, "--logits");
  }
  const auto weights = load_weights(command);
  // Note [A state dict from PyTorch is read as PyTorch reads it] in checkpoint.cpp: once a run.
  if (!weights.notice.empty() && writer) {
    const std::string flag =
        command.model ? "--model " + *command.model : "--checkpoint " + *command.checkpoint;
    std::fprintf(stderr, "dptrain: %s\n",
                 dptrain::message_line(flag + ": " + weights.notice).c_str());
  }
  const auto data_dir = dptrain::resolve_data_dir(command.common.data_dir);
  // Only the test set is evaluated; one training image keeps the data set's shape valid.
  const auto data = dptrain::load_fashion_mnist(data_dir, 1, command.common.test_limit);
  const std::string& source = command.model ? *command.model : *command.checkpoint;
  const auto result = dptrain::evaluate_weights(data, run, weights.tensors, weights.width, source,
                                                command.logits.has_value());
  if (command.logits && writer) write_logits(result, data.test.labels, *command.logits, source);
  if (writer || command.common.verbose) {
    out.line(dptrain::format_eval_line(result));
  }
  return out.error() != 0 ? out.report_failure("", "the result line is lost") : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything is opened: a closed 0, 1 or 2 would be taken by the first file dptrain
  // opens (the lock, the metrics), which would then receive the progress and error lines.
  dptrain::reserve_standard_descriptors();
  // Before any thread exists: LibTorch's NCCL reads these when a process group is made.
  dptrain::prepare_nccl_environment();
  // A closed stdout is a failed write (CheckedStdout); a file over `ulimit -f` is a failed
  // write that the writer reports and cleans up after.
  dptrain::ignore_write_signals();
  CheckedStdout out;
  try {
    const auto parsed = dptrain::parse_command_line(argc, argv);
    if (parsed.action == dptrain::ParsedCommandLine::Action::kHelp) {
      std::string help = parsed.help;
      if (!help.empty() && help.back() == '\n') help.pop_back();
      out.line(help);
      return out.error() != 0 ? out.report_failure("", "the help is lost") : 0;
    }
    // Before the first tensor and the first thread: LibTorch's SetAllocator is not thread-safe.
    // Note [CPU memory: tcmalloc, not a cache of our own] in cpu_allocator.h.
    if (parsed.action == dptrain::ParsedCommandLine::Action::kTrain) {
      dptrain::install_cpu_allocator(parsed.train.cpu_allocator);
    } else if (parsed.action == dptrain::ParsedCommandLine::Action::kEval) {
      dptrain::install_cpu_allocator(parsed.eval.common.cpu_allocator);
    }
    switch (parsed.action) {
      case dptrain::ParsedCommandLine::Action::kTrain:
        return run_train(parsed.train, out);
      case dptrain::ParsedCommandLine::Action::kEval:
        return run_eval(parsed.eval, out);
      case dptrain::ParsedCommandLine::Action::kDownload:
        return run_download(parsed.download, out);
      case dptrain::ParsedCommandLine::Action::kHelp:
        break;
    }
    return 0;
  } catch (const StoppedBeforeTheFirstStep& stopped) {
    std::fprintf(stderr, "dptrain: stopped by signal %d before the first step; nothing to save\n",
                 stopped.signal_number());
    return 128 + stopped.signal_number();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", dptrain::message_line(e.what()).c_str());
    return kExitUsage;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "error: %s\n",
                 dptrain::message_line(first_line(e.what_without_backtrace())).c_str());
  } catch (const std::exception& e) {  // ours (DataError, CollectiveError) and the library's
    std::fprintf(stderr, "error: %s\n", dptrain::message_line(e.what()).c_str());
  } catch (...) {
    std::fprintf(stderr, "error: unknown failure\n");
  }
  return kExitRuntimeFailure;
}
