// Writing the per-epoch metrics file. See metrics.h.
// File access is plain POSIX (open, write, fsync; files.h): not iostreams, which cannot fsync.
#include "dptrain/report/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
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

// One value of a record as the file holds it: a number's text ("" where it is missing), or text
// that CSV and JSON quote.
struct Cell {
  std::string text;
  bool quoted;
};

Cell cell(int64_t value) { return {std::to_string(value), false}; }
Cell cell(double value) { return {format_number(value), false}; }
Cell cell(const std::string& value) { return {value, true}; }

// The rows of epoch_figures.def written to the metrics file, in its order: their names, and their
// values in `record`.
std::vector<const char*> metrics_columns() {
  std::vector<const char*> names;
  for (const EpochFigure& figure : kEpochFigures) {
    if (writes_metrics(figure.written)) names.push_back(figure.name);
  }
  return names;
}

std::vector<Cell> metrics_cells(const EpochRecord& record) {
  std::vector<Cell> cells;
#define DPTRAIN_EPOCH_FIGURE(name, of, type, initial, unit, kept, written) \
  if (writes_metrics(EpochFigureWritten::written)) cells.push_back(cell(record.name));
#include "dptrain/train/epoch_figures.def"
#undef DPTRAIN_EPOCH_FIGURE
  return cells;
}

}  // namespace

// ============================================================================================
// Public functions

EpochRecord::EpochRecord(const EpochStats& stats)
    : EpochStats(stats), wall_ms_per_step(dptrain::wall_ms_per_step(stats)) {}

EpochRecord make_epoch_record(const EpochStats& stats, double lr,
                              const std::vector<std::string>& devices) {
  EpochRecord record(stats);
  record.lr = lr;
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
  for (const char* name : metrics_columns()) {
    header += std::string(header.empty() ? "" : ",") + name;
  }
  return header;
}

std::string format_metrics_record(const EpochRecord& record, MetricsFormat format) {
  static const std::vector<const char*> names = metrics_columns();
  const std::vector<Cell> cells = metrics_cells(record);
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) {
    const Cell& c = cells[i];
    line += i ? "," : "";
    if (format == MetricsFormat::kCsv) {
      line += c.quoted ? csv_field(c.text) : c.text;
    } else if (c.quoted) {
      line += json_string(names[i]) + ":" + json_string(c.text);
    } else {
      line += json_string(names[i]) + ":" + (c.text.empty() ? "null" : c.text);
    }
  }
  return format == MetricsFormat::kCsv ? line + "\n" : "{" + line + "}\n";
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
  if (const int error = write_all(fd_, text.data(), text.size())) {
    throw DataError("cannot write metrics file " + path_ + ": " + errno_text(error));
  }
  if (::fsync(fd_) != 0) throw DataError("cannot sync metrics file " + path_ + ": " + errno_text());
  needs_header_ = false;
}

}  // namespace dptrain
