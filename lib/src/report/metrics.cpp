// Writing the per-epoch metrics file. See metrics.h.
// File access is plain POSIX (open, write, fsync; files.h): not iostreams, which cannot fsync.
#include "dptrain/report/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/train/epoch_stats.h"

namespace dptrain {

namespace {

// The columns, in file order; the JSON keys are the same names.
// clang-format off
const char* const kColumns[] = {
    "epoch",          "train_loss",       "train_acc",         "test_loss",
    "test_acc",       "seconds",          "images_per_second", "lr",
    "steady_seconds", "wall_ms_per_step", "gpu_ms_per_step",   "tflops",
    "mfu",            "peak_host_bytes",  "peak_device_bytes", "gpu_samples_dropped",
    "gpu_spin_ms",    "devices"};
// clang-format on
constexpr size_t kColumnCount = sizeof kColumns / sizeof kColumns[0];

std::string lowercase(std::string text) {
  for (char& c : text) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return text;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ============================================================================================
// Formatting

// The shortest of %.15g, %.16g and %.17g that reads back as the same double; "" if non-finite.
std::string format_number(double value) {
  if (!std::isfinite(value)) return "";
  char text[64];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

std::string json_string(const std::string& text) {
  // The two-character escapes JSON has; other control characters become \u00XX.
  static const char kEscaped[] = "\"\\\b\f\n\r\t";
  static const char kEscapeLetter[] = "\"\\bfnrt";
  std::string out = "\"";
  for (char c : text) {
    const char* escaped = c == '\0' ? nullptr : std::strchr(kEscaped, c);
    if (escaped != nullptr) {
      out += '\\';
      out += kEscapeLetter[escaped - kEscaped];
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\u%04x", static_cast<unsigned>(c));
      out += escape;
    } else {
      out += c;  // UTF-8 passes through as it is
    }
  }
  return out + "\"";
}

// The record's values as text, in kColumns order, before CSV or JSON quoting.
std::vector<std::string> record_numbers(const EpochRecord& r) {
  return {std::to_string(r.epoch),
          format_number(r.train_loss),
          format_number(r.train_acc),
          format_number(r.test_loss),
          format_number(r.test_acc),
          format_number(r.seconds),
          format_number(r.images_per_second),
          format_number(r.lr),
          format_number(r.steady_seconds),
          format_number(r.wall_ms_per_step),
          format_number(r.gpu_ms_per_step),
          format_number(r.tflops),
          format_number(r.mfu),
          format_number(r.peak_host_bytes),
          format_number(r.peak_device_bytes),
          format_number(r.gpu_samples_dropped),
          format_number(r.gpu_spin_ms)};
}

// ============================================================================================
// POSIX file helpers

void write_all(int fd, const std::string& text, const std::string& path) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw DataError("cannot write metrics file " + path + ": " + errno_text());
    done += static_cast<size_t>(n);
  }
}

}  // namespace

// ============================================================================================
// Public functions

EpochRecord make_epoch_record(const EpochStats& stats, double lr,
                              const std::vector<std::string>& devices) {
  EpochRecord record;
  record.epoch = stats.epoch;
  record.train_loss = stats.train_loss;
  record.train_acc = stats.train_acc;
  record.test_loss = stats.test_loss;
  record.test_acc = stats.test_acc;
  record.seconds = stats.seconds;
  record.images_per_second = stats.images_per_second;
  record.lr = lr;
  record.wall_ms_per_step = wall_ms_per_step(stats);
  record.gpu_ms_per_step = stats.gpu_ms_per_step;
  record.tflops = stats.tflops;
  record.mfu = stats.mfu;
  record.peak_host_bytes = stats.peak_host_bytes;
  record.peak_device_bytes = stats.peak_device_bytes;
  record.gpu_samples_dropped = stats.gpu_samples_dropped;
  record.gpu_spin_ms = stats.gpu_spin_ms;
  for (size_t i = 0; i < devices.size(); ++i) record.devices += (i ? "," : "") + devices[i];
  return record;
}

MetricsFormat check_metrics_path(const std::string& path) {
  const std::string lower = lowercase(path);
  const size_t slash = lower.rfind('/');
  const std::string name = slash == std::string::npos ? lower : lower.substr(slash + 1);
  if (ends_with(name, ".csv") && name.size() > 4) return MetricsFormat::kCsv;
  if ((ends_with(name, ".jsonl") && name.size() > 6) ||
      (ends_with(name, ".ndjson") && name.size() > 7)) {
    return MetricsFormat::kJsonLines;
  }
  throw UsageError("--metrics " + path +
                   ": the file name must end in .csv, .jsonl or .ndjson (the extension picks the "
                   "format)");
}

std::string metrics_csv_header() {
  std::string header;
  for (size_t i = 0; i < kColumnCount; ++i) header += std::string(i ? "," : "") + kColumns[i];
  return header;
}

std::string format_metrics_record(const EpochRecord& record, MetricsFormat format) {
  const std::vector<std::string> numbers = record_numbers(record);
  std::string line;
  if (format == MetricsFormat::kCsv) {
    for (const std::string& number : numbers) line += number + ",";
    return line + csv_field(record.devices) + "\n";
  }
  line = "{";
  for (size_t i = 0; i < numbers.size(); ++i) {
    line += json_string(kColumns[i]) + ":" + (numbers[i].empty() ? "null" : numbers[i]) + ",";
  }
  return line + json_string("devices") + ":" + json_string(record.devices) + "}\n";
}

MetricsWriter::MetricsWriter(const std::string& path)
    : path_(path), format_(check_metrics_path(path)) {
  // A new name or a regular file only (the driver checks the path before the run, with
  // check_output_file): O_NONBLOCK keeps a FIFO from hanging the open, O_NOFOLLOW a link from
  // sending the records elsewhere, and anything else is refused after the open.
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC,
               0644);
  if (fd_ < 0) throw DataError("cannot open metrics file " + path + ": " + errno_text());
  struct stat info {};
  std::string problem;
  if (::fstat(fd_, &info) != 0) {
    problem = "cannot stat metrics file " + path + ": " + errno_text();
  } else if (!S_ISREG(info.st_mode)) {
    problem = "metrics file " + path + " is not a regular file";
  }
  if (!problem.empty()) {
    ::close(fd_);
    throw DataError(problem);
  }
  needs_header_ = format_ == MetricsFormat::kCsv;
  sync_parent_directory(path);
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const EpochRecord& record) { write(std::vector<EpochRecord>{record}); }

void MetricsWriter::write(const std::vector<EpochRecord>& records) {
  if (records.empty()) return;
  std::string text = needs_header_ ? metrics_csv_header() + "\n" : "";
  for (const auto& record : records) text += format_metrics_record(record, format_);
  write_all(fd_, text, path_);
  if (::fsync(fd_) != 0) throw DataError("cannot sync metrics file " + path_ + ": " + errno_text());
  needs_header_ = false;
}

}  // namespace dptrain
