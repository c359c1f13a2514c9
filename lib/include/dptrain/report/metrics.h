// The machine-readable record of a run: one line per epoch in a CSV or JSON Lines file (the
// --metrics flag), each written and synced as soon as the epoch ends. Written anew by each run
// (a resumed run rewrites the epochs its checkpoint holds). Not here: what a person reads on the
// terminal (report.h) or the figure drawn from it (plot.h).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dptrain/train/epoch_stats.h"

namespace dptrain {

// One epoch as the metrics file holds it. Non-finite figures are written as missing values
// (an empty CSV field, JSON null).
struct EpochRecord {
  int64_t epoch = 0;  // 1-based
  double train_loss = 0;
  double train_acc = 0;
  double test_loss = 0;
  double test_acc = 0;
  double seconds = 0;  // training only, as EpochStats::seconds
  double images_per_second = 0;
  double lr = 0;
  // The median seconds of epochs 2 to this one (steady_epoch_seconds in report.h): the pace
  // without the first epoch's warm-up. Missing (NaN) for the first epoch.
  double steady_seconds = std::numeric_limits<double>::quiet_NaN();
  // The epoch's training seconds per step, in milliseconds, and beside it the median GPU
  // milliseconds of its timed steps (EpochStats::gpu_ms_per_step; missing on the CPU).
  double wall_ms_per_step = std::numeric_limits<double>::quiet_NaN();
  double gpu_ms_per_step = std::numeric_limits<double>::quiet_NaN();
  // The epoch's efficiency, as EpochStats has it: achieved TFLOP/s over all ranks, MFU (a
  // fraction; missing where no peak is known), the process's peak resident set in bytes, and on
  // CUDA the allocator's peak bytes on the reporting rank's GPU (missing on the CPU). All four are
  // missing for a resumed run's earlier epochs.
  double tflops = std::numeric_limits<double>::quiet_NaN();
  double mfu = std::numeric_limits<double>::quiet_NaN();
  double peak_host_bytes = std::numeric_limits<double>::quiet_NaN();
  double peak_device_bytes = std::numeric_limits<double>::quiet_NaN();
  // The step timer's dropped samples and its spins' milliseconds in the epoch, as EpochStats
  // has them (missing where nothing is timed).
  double gpu_samples_dropped = std::numeric_limits<double>::quiet_NaN();
  double gpu_spin_ms = std::numeric_limits<double>::quiet_NaN();
  std::string devices;  // every rank's device in rank order, comma-separated: "cuda:0,cuda:1"
};

// The record for `stats`, trained at learning rate `lr` on `devices` (rank order).
EpochRecord make_epoch_record(const EpochStats& stats, double lr,
                              const std::vector<std::string>& devices);

enum class MetricsFormat {
  kCsv,        // ".csv": a header line, then one row per epoch (RFC 4180 quoting)
  kJsonLines,  // ".jsonl" or ".ndjson": one JSON object per line
};

// The format `path`'s extension asks for (case-insensitive). Throws UsageError naming --metrics
// and the accepted extensions otherwise. Call it before training, so a typo costs nothing.
MetricsFormat check_metrics_path(const std::string& path);

// The CSV header line, without its newline: the column names in file order.
std::string metrics_csv_header();

// One record as a line of `format`, newline included. Numbers carry enough digits to read back
// bit for bit (the shortest of %.15g, %.16g, %.17g that does).
std::string format_metrics_record(const EpochRecord& record, MetricsFormat format);

// Writes one record per epoch to a metrics file. Each write() is one system call followed by
// fsync, so a crash keeps every epoch finished before it.
class MetricsWriter {
 public:
  // Creates or truncates `path` (format from check_metrics_path). Throws UsageError for the
  // extension, DataError (path and reason) when the file cannot be opened.
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends `record` and syncs it to disk. Throws DataError naming the path on failure.
  void write(const EpochRecord& record);
  // Appends `records` in one write and one sync (a resumed run's history).
  void write(const std::vector<EpochRecord>& records);

  const std::string& path() const { return path_; }
  MetricsFormat format() const { return format_; }

 private:
  std::string path_;
  MetricsFormat format_;
  int fd_ = -1;
  bool needs_header_ = false;  // CSV only: the next write starts with the header
};

}  // namespace dptrain
