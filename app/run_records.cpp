// The metrics file and the plot of a training run. See run_records.h.
#include "run_records.h"

#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/report/metrics.h"
#include "dptrain/report/plot.h"
#include "dptrain/report/tensorboard.h"
#include "dptrain/train/callbacks.h"
#include "dptrain/train/epoch_stats.h"
#include "dptrain/train/lr_schedule.h"
#include "dptrain/train/run_configuration.h"

namespace dptrain {

RunRecords::RunRecords(std::optional<std::string> metrics, std::optional<std::string> plot,
                       double lr, int64_t batch_size, int64_t epochs, int64_t steps_per_epoch)
    : metrics_path_(std::move(metrics)),
      plot_path_(std::move(plot)),
      lr_(lr),
      batch_size_(batch_size),
      epochs_(epochs),
      steps_per_epoch_(steps_per_epoch) {}

void RunRecords::log_tensorboard(const std::string& dir,
                                 const std::optional<std::string>& checkpoint_dir) {
  tensorboard_dir_ = dir;
  checkpoint_dir_ = checkpoint_dir;
}

void RunRecords::follow_schedule(const LrSchedule& schedule) { schedule_ = schedule; }

// Note [A failed record costs only itself]
// The records are written at the end of each epoch, beside the checkpoint, and a full disk or a
// file-size limit fails them first (they are written more often). Ending the run there would
// lose that epoch's checkpoint and --save-model: the records, which say what happened, would
// cost the weights, which are the run. So the library writes the checkpoint before it rethrows
// a callback's failure (rank.cpp), and here a failed write of one output drops that output
// only: one line says so, the run goes on with its checkpoints, the other records and
// --save-model, and the driver exits 1 at the end (the run did not leave everything asked of
// it). Stopping instead would save nothing more: the checkpoint is already safe.
template <typename Write>
void RunRecords::guarded(const char* flag, Write write) {
  try {
    write();
  } catch (const std::exception& e) {
    const std::string name = flag;
    if (name == "--metrics") {
      metrics_.reset();
      metrics_path_.reset();
    } else if (name == "--plot") {
      plot_path_.reset();
    } else {
      tensorboard_.reset();
      tensorboard_dir_.reset();
    }
    lost_.push_back(name);
    if (report_lost_) report_lost_(name, e.what());
  }
}

void RunRecords::on_lost(
    std::function<void(const std::string& flag, const std::string& what)> report) {
  report_lost_ = std::move(report);
}

void RunRecords::start(const std::vector<std::string>& devices,
                       const std::vector<EpochStats>& done, int64_t start_step,
                       const std::vector<RunSetting>& settings, bool resumed) {
  devices_ = devices;
  for (const auto& stats : done) append_record(stats);
  if (metrics_path_) {
    guarded("--metrics", [&] {
      metrics_ = std::make_unique<MetricsWriter>(*metrics_path_);
      metrics_->write(records_);
    });
  }
  if (!done.empty()) redraw_plot();
  if (tensorboard_dir_) {
    guarded("--tensorboard", [&] {
      tensorboard_ = std::make_unique<TensorBoardLog>(
          tensorboard_run_folder(*tensorboard_dir_, checkpoint_dir_, resumed), steps_per_epoch_);
      tensorboard_->start(start_step, settings_markdown(settings));
    });
  }
}

void RunRecords::add(const EpochStats& stats) {
  append_record(stats);
  if (metrics_) guarded("--metrics", [&] { metrics_->write(records_.back()); });
  redraw_plot();
  if (tensorboard_) guarded("--tensorboard", [&] { tensorboard_->add_epoch(stats); });
}

void RunRecords::add_loss(const LossStats& loss) {
  if (tensorboard_) guarded("--tensorboard", [&] { tensorboard_->add_loss(loss); });
}

void RunRecords::append_record(const EpochStats& stats) {
  // The epoch's last step is global step epoch * S - 1 (0-based).
  const double lr = schedule_ ? lr_at(lr_, *schedule_, stats.epoch * steps_per_epoch_ - 1,
                                      steps_per_epoch_, epochs_)
                              : lr_;
  records_.push_back(make_epoch_record(stats, lr, devices_));
  // The first epoch carries the warm-up and stays out of the steady figure (report.h).
  if (records_.size() > 1) {
    if (upper_.empty() || stats.seconds >= upper_.top()) {
      upper_.push(stats.seconds);
    } else {
      lower_.push(stats.seconds);
    }
    if (upper_.size() > lower_.size() + 1) {
      lower_.push(upper_.top());
      upper_.pop();
    } else if (lower_.size() > upper_.size()) {
      upper_.push(lower_.top());
      lower_.pop();
    }
  }
  records_.back().steady_seconds =
      upper_.empty()                       ? std::nan("")
      : upper_.size() > lower_.size()      ? upper_.top()
                                           : (lower_.top() + upper_.top()) / 2;
}

void RunRecords::redraw_plot() {
  if (!plot_path_) return;
  PlotOptions plot;
  plot.title = plot_title(lr_, batch_size_, devices_);
  plot.epochs = epochs_;
  guarded("--plot",
          [&] { write_plot_atomically(*plot_path_, render_training_plot(records_, plot)); });
}

}  // namespace dptrain
