// The files a training run leaves beside its output: the metrics file (--metrics) and the plot
// (--plot), both written by global rank 0, anew from the epochs a resumed run starts with (in
// one write, one drawing) and then after every epoch, so that each holds every epoch once; and
// the TensorBoard event file (--tensorboard), a new one per run in the run's folder, which holds
// this run's epochs and running loss only (a resumed run's earlier ones are in the stopped run's
// file, beside it).
// They are auxiliary: a write that fails drops that output for the rest of the run and says so
// once (Note [A failed record costs only itself] in run_records.cpp); nothing here throws.
// Not here: their formats (metrics.h, plot.h, tensorboard.h), checkpoints (train/checkpoint.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <vector>

#include "dptrain/report/metrics.h"
#include "dptrain/report/tensorboard.h"
#include "dptrain/train/callbacks.h"
#include "dptrain/train/epoch_stats.h"
#include "dptrain/train/lr_schedule.h"
#include "dptrain/train/run_configuration.h"

namespace dptrain {

class RunRecords {
 public:
  // `metrics`, `plot`: the paths, or none; lr, batch size and epochs for the records and title;
  // `steps_per_epoch`, the steps of each epoch, to place an epoch at its last step (the
  // schedule's rate, TensorBoard's step).
  RunRecords(std::optional<std::string> metrics, std::optional<std::string> plot, double lr,
             int64_t batch_size, int64_t epochs, int64_t steps_per_epoch);

  // --tensorboard: from start() on, also an event file in the run's folder in `dir` (prepared
  // and locked; tensorboard_run_folder, with the run's `checkpoint_dir`), whose epochs are
  // placed at their last step.
  void log_tensorboard(const std::string& dir, const std::optional<std::string>& checkpoint_dir);
  // The records' `lr` is then the rate of each epoch's last step under `schedule` (lr_at);
  // without this call, or with the book's constant rate, it is the base `lr` itself.
  void follow_schedule(const LrSchedule& schedule);
  // Once the world is up: every rank's device, and the epochs a resumed run already has. Opens
  // (truncates) the metrics file and writes those epochs. With --tensorboard, opens the event
  // file (in the run's folder: a new one, or the resumed run's when `resumed`) and writes
  // `settings`, marking the run's start after global step `start_step`.
  void start(const std::vector<std::string>& devices, const std::vector<EpochStats>& done,
             int64_t start_step = 0, const std::vector<RunSetting>& settings = {},
             bool resumed = false);
  // After each epoch: appends it to the metrics file and the event file and redraws the plot.
  void add(const EpochStats& stats);
  // Every --tensorboard-every steps: the running loss, into the event file.
  void add_loss(const LossStats& loss);
  // Called once per output whose write failed, with its flag and the failure, before it is
  // dropped (the driver prints the one line).
  void on_lost(std::function<void(const std::string& flag, const std::string& what)> report);
  // The flags of the outputs dropped after a failed write, in order.
  const std::vector<std::string>& lost() const { return lost_; }

 private:
  // Runs one output's write; a failure drops that output (`flag`) and is reported.
  template <typename Write>
  void guarded(const char* flag, Write write);
  // Appends the record of `stats`, its steady seconds the median of epochs 2 on so far.
  void append_record(const EpochStats& stats);
  void redraw_plot();

  std::optional<std::string> metrics_path_;
  std::optional<std::string> plot_path_;
  double lr_;
  std::optional<LrSchedule> schedule_;
  int64_t batch_size_;
  int64_t epochs_;
  int64_t steps_per_epoch_;
  std::vector<std::string> devices_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::optional<std::string> tensorboard_dir_;
  std::optional<std::string> checkpoint_dir_;
  std::unique_ptr<TensorBoardLog> tensorboard_;
  std::vector<EpochRecord> records_;
  // The seconds of epochs 2 on, split at their median (a running median: a resumed history of
  // n epochs costs n log n, not n^2): `lower_` a max-heap of the smaller half, `upper_` a
  // min-heap of the rest, never more than one longer than `lower_`.
  std::priority_queue<double> lower_;
  std::priority_queue<double, std::vector<double>, std::greater<double>> upper_;
  std::function<void(const std::string&, const std::string&)> report_lost_;
  std::vector<std::string> lost_;
};

}  // namespace dptrain
