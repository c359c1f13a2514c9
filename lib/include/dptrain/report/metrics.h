// The machine-readable record of a run: one line per epoch in a CSV or JSON Lines file (the
// --metrics flag), each written and synced as soon as the epoch ends. Written anew by each run
// (a resumed run rewrites the epochs its checkpoint holds). Not here: what a person reads on the
// terminal (report.h) or the figure drawn from it (plot.h).
#pragma once

#include <string>
#include <vector>

#include "dptrain/train/epoch_stats.h"

namespace dptrain {

// One epoch as the metrics file and TensorBoard hold it: its EpochStats and the rows of
// epoch_figures.def that are not (`of` derived or run), in the table's order: the learning rate;
// the median seconds of epochs 2 to this one (steady_epoch_seconds in report.h), the pace without
// the first epoch's warm-up, missing for the first epoch; the epoch's training seconds per step
// in milliseconds, beside EpochStats::gpu_ms_per_step; every rank's device in rank order,
// comma-separated ("cuda:0,cuda:1"). Non-finite figures are written as missing values (an empty
// CSV field, JSON null).
struct EpochRecord : EpochStats {
  EpochRecord() = default;
  // `stats` and the figures derived from them alone; those the run adds keep their initial values.
  explicit EpochRecord(const EpochStats& stats);

#define DPTRAIN_EPOCH_FIGURE(name, of, type, initial, unit, kept, written) \
  DPTRAIN_EPOCH_RECORD_MEMBER_##of(type, name, initial)
#define DPTRAIN_EPOCH_RECORD_MEMBER_stats(type, name, initial)
#define DPTRAIN_EPOCH_RECORD_MEMBER_derived(type, name, initial) type name = initial;
#define DPTRAIN_EPOCH_RECORD_MEMBER_run(type, name, initial) type name = initial;
#include "dptrain/train/epoch_figures.def"
#undef DPTRAIN_EPOCH_RECORD_MEMBER_run
#undef DPTRAIN_EPOCH_RECORD_MEMBER_derived
#undef DPTRAIN_EPOCH_RECORD_MEMBER_stats
#undef DPTRAIN_EPOCH_FIGURE
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
