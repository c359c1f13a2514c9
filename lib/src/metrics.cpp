// Writing and reading the per-epoch metrics file. See metrics.h.
// File access is plain POSIX (open, write, fsync): not std::filesystem, whose symbols PyPI's
// libtorch.so interposes, and not iostreams, which cannot fsync.
#include "dptrain/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "dptrain/durable_file.h"
#include "dptrain/errors.h"

namespace dptrain {

namespace {

// The columns, in file order; the JSON keys are the same names.
const char* const kColumns[] = {"epoch",          "train_loss", "train_acc",         "test_loss",
                                "test_acc",       "seconds",    "images_per_second", "lr",
                                "steady_seconds", "devices"};
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

std::string errno_text() { return std::strerror(errno); }

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
          format_number(r.steady_seconds)};
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

// Reads [offset, offset + length) of `fd`; fewer bytes at the end of the file.
std::string read_at(int fd, off_t offset, size_t length, const std::string& path) {
  std::string bytes(length, '\0');
  size_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, &bytes[done], length - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw DataError("cannot read metrics file " + path + ": " + errno_text());
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

// The size of the file once a last line without its newline (a record cut short by a crash) is
// cut off: just after the last '\n', or 0.
off_t complete_lines_size(int fd, off_t size, const std::string& path) {
  constexpr off_t kChunk = 4096;
  for (off_t end = size; end > 0;) {
    const off_t begin = end > kChunk ? end - kChunk : 0;
    const std::string chunk = read_at(fd, begin, static_cast<size_t>(end - begin), path);
    const size_t newline = chunk.rfind('\n');
    if (newline != std::string::npos) return begin + static_cast<off_t>(newline) + 1;
    end = begin;
  }
  return 0;
}

// ============================================================================================
// Parsing

[[noreturn]] void malformed(const std::string& path, size_t line, const std::string& what) {
  throw DataError("metrics file " + path + " line " + std::to_string(line) + ": " + what);
}

// A decimal number as JSON writes one (a leading '+' allowed), or "" for a missing value (NaN).
bool parse_double(const std::string& text, double* value) {
  if (text.empty()) {
    *value = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  size_t i = 0;
  const auto digits = [&] {
    const size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i > start;
  };
  if (text[i] == '-' || text[i] == '+') ++i;
  if (!digits()) return false;
  if (i < text.size() && text[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    if (!digits()) return false;
  }
  if (i != text.size()) return false;
  *value = std::strtod(text.c_str(), nullptr);  // out of range gives +-inf, read as non-finite
  return true;
}

bool parse_epoch(const std::string& text, int64_t* epoch) {
  if (text.empty() || text.size() > 18) return false;  // 18 digits cannot overflow int64
  size_t i = text[0] == '-' ? 1 : 0;
  if (i == text.size()) return false;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
  }
  *epoch = std::strtoll(text.c_str(), nullptr, 10);
  return true;
}

// A record from its fields by column name: numbers as text ("" = missing), devices as is.
EpochRecord record_from_fields(const std::map<std::string, std::string>& fields,
                               const std::string& path, size_t line) {
  const auto field = [&](const char* name) -> const std::string& {
    const auto it = fields.find(name);
    if (it == fields.end()) malformed(path, line, std::string("no \"") + name + "\" field");
    return it->second;
  };
  EpochRecord record;
  if (!parse_epoch(field("epoch"), &record.epoch)) {
    malformed(path, line, "epoch \"" + field("epoch") + "\" is not a whole number");
  }
  const std::pair<const char*, double*> numbers[] = {
      {"train_loss", &record.train_loss},
      {"train_acc", &record.train_acc},
      {"test_loss", &record.test_loss},
      {"test_acc", &record.test_acc},
      {"seconds", &record.seconds},
      {"images_per_second", &record.images_per_second},
      {"lr", &record.lr}};
  for (const auto& [name, value] : numbers) {
    if (!parse_double(field(name), value)) {
      malformed(path, line, std::string(name) + " \"" + field(name) + "\" is not a number");
    }
  }
  record.devices = field("devices");
  return record;
}

// One CSV row and the line it starts on.
struct CsvRow {
  size_t line = 0;
  std::vector<std::string> fields;
  bool blank = false;  // an empty line
};

// RFC 4180: fields split on ',', rows on '\n' (a '\r' before it dropped), '"' quotes a field and
// '""' inside quotes is one '"'. Quoted fields may hold commas and newlines.
std::vector<CsvRow> parse_csv(const std::string& text, const std::string& path) {
  std::vector<CsvRow> rows;
  size_t line = 1, i = 0;
  while (i < text.size()) {
    CsvRow row;
    row.line = line;
    std::string field;
    bool row_done = false;
    while (!row_done) {
      if (i < text.size() && text[i] == '"') {
        ++i;
        while (true) {
          if (i >= text.size()) malformed(path, row.line, "a quoted field is never closed");
          if (text[i] == '"') {
            if (i + 1 < text.size() && text[i + 1] == '"') {
              field += '"';
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (text[i] == '\n') ++line;
          field += text[i++];
        }
        if (i < text.size() && text[i] == '\r') ++i;
        if (i < text.size() && text[i] != ',' && text[i] != '\n') {
          malformed(path, line, "text after a closing quote");
        }
      } else {
        while (i < text.size() && text[i] != ',' && text[i] != '\n') field += text[i++];
        if (!field.empty() && field.back() == '\r') field.pop_back();
      }
      row.fields.push_back(std::move(field));
      field.clear();
      if (i < text.size() && text[i] == ',') {
        ++i;
      } else {
        if (i < text.size()) ++i, ++line;  // the '\n'
        row_done = true;
      }
    }
    row.blank = row.fields.size() == 1 && row.fields[0].empty();
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<EpochRecord> read_csv(const std::string& text, const std::string& path) {
  std::vector<EpochRecord> records;
  bool have_header = false;
  for (const CsvRow& row : parse_csv(text, path)) {
    if (row.blank) continue;
    if (!have_header) {
      std::string header;
      for (size_t i = 0; i < row.fields.size(); ++i) header += (i ? "," : "") + row.fields[i];
      if (header != metrics_csv_header()) {
        malformed(path, row.line,
                  "the header is \"" + header + "\", expected \"" + metrics_csv_header() + "\"");
      }
      have_header = true;
      continue;
    }
    if (row.fields.size() != kColumnCount) {
      malformed(
          path, row.line,
          std::to_string(row.fields.size()) + " fields, expected " + std::to_string(kColumnCount));
    }
    std::map<std::string, std::string> fields;
    for (size_t i = 0; i < kColumnCount; ++i) fields[kColumns[i]] = row.fields[i];
    records.push_back(record_from_fields(fields, path, row.line));
  }
  return records;
}

// A small JSON reader for one flat object per line: string keys, values that are numbers,
// strings or null. Anything else (nesting, true/false) is an error: the file is not ours.
class JsonLine {
 public:
  JsonLine(const std::string& text, const std::string& path, size_t line)
      : text_(text), path_(path), line_(line) {}

  // Key to value: a number's text, a string's decoded content, "" for null.
  std::map<std::string, std::string> parse_object() {
    std::map<std::string, std::string> fields;
    skip_space();
    expect('{');
    skip_space();
    if (peek() == '}') {
      ++i_;
    } else {
      while (true) {
        skip_space();
        const std::string key = parse_string();
        skip_space();
        expect(':');
        skip_space();
        fields[key] = parse_value(key);
        skip_space();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect('}');
        break;
      }
    }
    skip_space();
    if (i_ != text_.size()) fail("text after the closing '}'");
    return fields;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    malformed(path_, line_, what + " (column " + std::to_string(i_ + 1) + ")");
  }
  char peek() const { return i_ < text_.size() ? text_[i_] : '\0'; }
  void skip_space() {
    while (i_ < text_.size() &&
           (text_[i_] == ' ' || text_[i_] == '\t' || text_[i_] == '\r' || text_[i_] == '\n')) {
      ++i_;
    }
  }
  void expect(char c) {
    if (peek() != c || i_ >= text_.size()) fail(std::string("expected '") + c + "'");
    ++i_;
  }

  std::string parse_value(const std::string& key) {
    const char c = peek();
    if (c == '"') return parse_string();
    if (text_.compare(i_, 4, "null") == 0) {
      i_ += 4;
      return "";
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      const size_t start = i_;
      while (i_ < text_.size() && std::strchr("+-.eE0123456789", text_[i_]) != nullptr) ++i_;
      return text_.substr(start, i_ - start);  // checked when the field is read
    }
    fail("the value of \"" + key + "\" is not a number, string or null");
  }

  unsigned parse_hex4() {
    if (i_ + 4 > text_.size()) fail("a \\u escape is cut short");
    unsigned code = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = text_[i_++];
      code <<= 4;
      if (h >= '0' && h <= '9') {
        code |= static_cast<unsigned>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        code |= static_cast<unsigned>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        code |= static_cast<unsigned>(h - 'A' + 10);
      } else {
        fail("a \\u escape has a bad hex digit");
      }
    }
    return code;
  }

  static void append_utf8(unsigned code, std::string& out) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xc0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xe0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    }
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (i_ >= text_.size()) fail("a string is never closed");
      const char c = text_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= text_.size()) fail("a string ends in a backslash");
      const char e = text_[i_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned code = parse_hex4();
          if (code >= 0xd800 && code < 0xdc00 && text_.compare(i_, 2, "\\u") == 0) {
            i_ += 2;
            const unsigned low = parse_hex4();
            if (low < 0xdc00 || low >= 0xe000) fail("a lone UTF-16 surrogate");
            code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
          } else if (code >= 0xd800 && code < 0xe000) {
            fail("a lone UTF-16 surrogate");
          }
          append_utf8(code, out);
          break;
        }
        default:
          fail(std::string("an unknown escape \\") + e);
      }
    }
  }

  const std::string& text_;
  const std::string& path_;
  size_t line_;
  size_t i_ = 0;
};

std::vector<EpochRecord> read_json_lines(const std::string& text, const std::string& path) {
  std::vector<EpochRecord> records;
  size_t line = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string content = text.substr(start, end - start);
    start = end + 1;
    ++line;
    if (content.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto fields = JsonLine(content, path, line).parse_object();
    records.push_back(record_from_fields(fields, path, line));
  }
  return records;
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

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : path_(path), format_(check_metrics_path(path)) {
  const int flags = O_CREAT | O_APPEND | O_CLOEXEC | (append ? O_RDWR : (O_WRONLY | O_TRUNC));
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0) throw DataError("cannot open metrics file " + path + ": " + errno_text());
  try {
    struct stat info {};
    if (::fstat(fd_, &info) != 0) {
      throw DataError("cannot stat metrics file " + path + ": " + errno_text());
    }
    if (!S_ISREG(info.st_mode)) throw DataError("metrics file " + path + " is not a regular file");
    off_t size = info.st_size;
    if (append && size > 0) {
      const off_t complete = complete_lines_size(fd_, size, path);
      if (complete != size) {
        if (::ftruncate(fd_, complete) != 0) {
          throw DataError("cannot cut the unfinished last line of metrics file " + path + ": " +
                          errno_text());
        }
        size = complete;
      }
      if (format_ == MetricsFormat::kCsv && size > 0) {
        const std::string expected = metrics_csv_header() + "\n";
        std::string first = read_at(fd_, 0, expected.size() + 1, path);
        first = first.substr(0, first.find('\n') + 1);
        if (first != expected && first != metrics_csv_header() + "\r\n") {
          throw DataError("cannot append to metrics file " + path +
                          ": its first line is not the header \"" + metrics_csv_header() + "\"");
        }
      }
    }
    needs_header_ = format_ == MetricsFormat::kCsv && size == 0;
  } catch (...) {
    ::close(fd_);
    throw;
  }
  sync_parent_directory(path);
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const EpochRecord& record) {
  std::string text = needs_header_ ? metrics_csv_header() + "\n" : "";
  text += format_metrics_record(record, format_);
  write_all(fd_, text, path_);
  if (::fsync(fd_) != 0) throw DataError("cannot sync metrics file " + path_ + ": " + errno_text());
  needs_header_ = false;
}

std::vector<EpochRecord> read_metrics(const std::string& path) {
  const MetricsFormat format = check_metrics_path(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError("cannot open metrics file " + path + ": " + errno_text());
  std::string text;
  char buffer[65536];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string reason = errno_text();
      ::close(fd);
      throw DataError("cannot read metrics file " + path + ": " + reason);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return format == MetricsFormat::kCsv ? read_csv(text, path) : read_json_lines(text, path);
}

}  // namespace dptrain
