// The metrics file and the plot of a training run. See run_records.h.
#include "run_records.h"

#include <cmath>
#include <utility>

#include "dptrain/io/plot.h"
#include "dptrain/io/report.h"

namespace dptrain {

RunRecords::RunRecords(std::optional<std::string> metrics, std::optional<std::string> plot,
                       double lr, int64_t batch_size, int64_t epochs)
    : metrics_path_(std::move(metrics)),
      plot_path_(std::move(plot)),
      lr_(lr),
      batch_size_(batch_size),
      epochs_(epochs) {}

void RunRecords::start(const std::vector<std::string>& devices,
                       const std::vector<EpochStats>& done) {
  devices_ = devices;
  if (metrics_path_) metrics_ = std::make_unique<MetricsWriter>(*metrics_path_);
  for (const auto& stats : done) add(stats);
}

void RunRecords::add(const EpochStats& stats) {
  records_.push_back(make_epoch_record(stats, lr_, devices_));
  std::vector<double> seconds;
  for (const auto& r : records_) seconds.push_back(r.seconds);
  records_.back().steady_seconds = steady_epoch_seconds(seconds).value_or(std::nan(""));
  if (metrics_) metrics_->write(records_.back());
  if (plot_path_) {
    PlotOptions plot;
    plot.title = plot_title(lr_, batch_size_, devices_);
    plot.epochs = epochs_;
    write_plot_atomically(*plot_path_, render_training_plot(records_, plot));
  }
}

}  // namespace dptrain
