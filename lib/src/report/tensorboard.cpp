// TensorBoard event files. See tensorboard.h.
// The records framed with ISA-L's CRC-32C, the event file written with plain POSIX (open, write,
// fsync), and what a run logs where. Not here: the events' bytes (tensorboard_event.cpp, the one
// file that includes protobuf) or choosing what to log when (the driver, app/run_records.cpp).
#include "dptrain/report/tensorboard.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/report/metrics.h"
#include "dptrain/train/callbacks.h"
#include "dptrain/train/epoch_stats.h"
#include "dptrain/train/run_configuration.h"

#if defined(DPTRAIN_WITH_TENSORBOARD)
#include <isa-l/crc.h>
#endif

// Note [TensorBoard's format from protobuf and ISA-L]
// An event file is TensorFlow's TFRecord framing around serialised `tensorboard.Event` protocol
// buffers. Two ways were weighed. Hand-written varints and a table CRC would be some 150 lines
// with no dependency, but each field's wire type, each nested length and the checksum's
// reflection and mask would be ours to get right and to keep right. protoc over a .proto of our
// own (TensorBoard's field numbers; tensorboard_event.proto says where they were checked) leaves
// the encoding to the library TensorBoard itself reads with, and Debian's libprotobuf is already
// in every dptrain process (Debian's libtorch-dev links it). The lite runtime is enough
// (serialising only) and registers no descriptors beside LibTorch's onnx ones; none of the
// protobuf symbols a PyPI LibTorch 2.11 exports (15, outside onnx_torch) is among protobuf-lite's
// or our generated code's (checked with nm), so the two cannot bind to each other. The CRC-32C is
// ISA-L's crc32_iscsi, packaged by Debian (libisal-dev) and vectorised; its convention is
// crc32_iscsi(buf, len, 0xFFFFFFFF) ^ 0xFFFFFFFF, which the unit test pins to the standard check
// value (CRC-32C("123456789") = 0xE3069283). What remains ours is the 16 bytes of framing per
// record and the file's name. Checked against TensorBoard's own reader (PyPI tensorboard's
// EventAccumulator, tests/integration/test_tensorboard.py): every scalar of a run read back equal
// to the metrics file's (to float32), the text, and a resume's purge of the steps it replaces.

// Note [Resuming without a step twice]
// A run that stops (a signal, --max-steps, a crash) has logged up to some step S in its file;
// its last checkpoint is at global step G <= S. The resumed run appends a new file to the same
// directory and trains steps G + 1 on, so steps G + 1 .. S would appear twice. TensorBoard's own
// mechanism, from TensorFlow's Supervisor, is a SessionLog START event: on reading one at step
// s, EventAccumulator (purge_orphaned_data=True, its default) drops every event it has read
// from earlier files at steps >= s. So each run's file starts with START at its first step,
// start + 1 (G + 1 when resumed), then its settings at that step, then its scalars; the
// stopped run's events at steps <= G stay, the resumed run does not log them again. The reader
// reads a directory's files in name order, so a new file's name must sort after every earlier
// one: its seconds are moved past theirs when the clock has not (two runs in one second).
// The marker acts on the files of one folder, which is why each run has a folder of its own
// (Note [One folder per run]): in a shared one, a fresh run's START at step 1 hides every run
// before it.

// Note [One folder per run]
// TensorBoard shows each folder under --logdir that holds event files as a run, side by side
// with the others; in one folder its reader joins the files into one run, and a START marker
// drops what earlier files logged from its step on. So --tensorboard DIR is a directory of runs:
// a fresh run makes DIR/run-N, N one past the largest run-N there (run-1 in a new DIR; gaps,
// from folders removed, are not filled), so that two runs one after the other are run-1 and
// run-2, in the order they started, each whole. A resumed run (--resume from a checkpoint)
// continues the run it resumes: every run made with --checkpoint-dir records that directory's
// real path in its folder (".dptrain-checkpoint-dir"), and a resume continues the largest run-N
// that recorded its own checkpoint directory, appending an event file there (Note [Resuming
// without a step twice]). A checkpoint directory holds one line of checkpoints at a time (a
// fresh start there needs it empty, or --fresh to empty it), so the newest run recorded with it
// is the one its checkpoints came from. Where none is (the first run had no --tensorboard, or
// wrote elsewhere, or the directory moved), the resume starts a new run-N, from its checkpoint's
// step. The name is recorded beside the events, not in the checkpoint: the checkpoint stays
// what it is, and a run folder read with its events says which checkpoints it goes with. Runs
// are numbered rather than named by time, host and pid: the names sort as the runs started and
// a script can name the folder a run will take. Choosing N and making the folder must not race
// a second run: the caller holds DIR's writer lock (OutputLock, Note [One writer per output]
// in core/files.h) for the whole run, and a second run into DIR while one is live is refused
// with the holder's pid, host and start. Event files of an older dptrain, written into DIR
// itself, stay there and show as a run of their own (".").

namespace dptrain {
namespace {

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xff);
}

// `text` as one cell of a markdown table row.
std::string markdown_cell(const std::string& text) {
  std::string cell;
  for (char c : text) {
    if (c == '|') {
      cell += "\\|";  // a bar would end the cell
    } else if (c == '\n' || c == '\r') {
      cell += ' ';
    } else {
      cell += c;
    }
  }
  return cell;
}

}  // namespace

// ============================================================================================
// Whether this build can, and the directory

bool tensorboard_supported() {
#if defined(DPTRAIN_WITH_TENSORBOARD)
  return true;
#else
  return false;
#endif
}

void require_tensorboard_support() {
#if !defined(DPTRAIN_WITH_TENSORBOARD)
  throw UsageError(std::string("--tensorboard: this dptrain was built without TensorBoard event "
                               "files (") +
                   DPTRAIN_TENSORBOARD_MISSING +
                   "); install libprotobuf-dev, protobuf-compiler and libisal-dev "
                   "(scripts/install-deps.sh) and build again");
#endif
}

void prepare_tensorboard_dir(const std::string& dir) {
  struct stat info {};
  if (::stat(dir.c_str(), &info) == 0 && !S_ISDIR(info.st_mode)) {
    throw UsageError("--tensorboard " + dir + ": is " + file_kind(info.st_mode) +
                     ", not a directory (the event files go into DIR, made if missing)");
  }
  try {
    make_directories(dir, "--tensorboard " + dir);
  } catch (const DataError& e) {
    throw UsageError(e.what());
  }
  // The writer will create files there (in a run's folder); a read-only place fails now.
  if (const int error = try_create_beside(dir + "/.dptrain-tensorboard-check")) {
    throw UsageError("--tensorboard " + dir + ": cannot create a file there: " + errno_text(error));
  }
}

// ============================================================================================
// One folder per run

namespace {

constexpr const char* kRunPrefix = "run-";
constexpr const char* kCheckpointDirRecord = ".dptrain-checkpoint-dir";

// N of a folder name "run-N" (1 to 999999999, no leading zero), else 0.
int64_t run_number(const std::string& name) {
  const std::string prefix = kRunPrefix;
  if (name.compare(0, prefix.size(), prefix) != 0) return 0;
  const std::string digits = name.substr(prefix.size());
  if (digits.empty() || digits.size() > 9 || digits[0] == '0') return 0;
  int64_t n = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return 0;
    n = n * 10 + (c - '0');
  }
  return n;
}

// Whether run folder `folder` recorded checkpoint directory `real_path` (an unreadable record
// is no record: the run is not continued, a new one starts).
bool records_checkpoint_dir(const std::string& folder, const std::string& real_path) {
  struct stat info {};
  if (::lstat(folder.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) return false;
  try {
    const auto bytes = read_regular_file(folder + "/" + kCheckpointDirRecord,
                                         "TensorBoard run record", 1 << 16);
    return std::string(bytes.begin(), bytes.end()) == real_path;
  } catch (const DataError&) {
    return false;
  }
}

}  // namespace

std::string tensorboard_run_folder(const std::string& dir,
                                   const std::optional<std::string>& checkpoint_dir,
                                   bool resumed) {
  // Note [One folder per run]
  const std::string checkpoints = checkpoint_dir ? file_identity(*checkpoint_dir).real_path : "";
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) {
    throw DataError("--tensorboard " + dir + ": cannot list the directory: " + errno_text());
  }
  int64_t largest = 0, continued = 0;
  while (const dirent* entry = ::readdir(listing)) {
    const int64_t n = run_number(entry->d_name);
    if (n == 0) continue;
    largest = std::max(largest, n);
    if (resumed && !checkpoints.empty() && n > continued &&
        records_checkpoint_dir(dir + "/" + entry->d_name, checkpoints)) {
      continued = n;
    }
  }
  ::closedir(listing);
  if (continued > 0) return dir + "/" + kRunPrefix + std::to_string(continued);
  const std::string folder = dir + "/" + kRunPrefix + std::to_string(largest + 1);
  if (::mkdir(folder.c_str(), 0755) != 0) {
    throw DataError("--tensorboard " + dir + ": cannot create the run's folder " + folder + ": " +
                    errno_text());
  }
  if (!checkpoints.empty()) {
    write_file_atomically(folder + "/" + kCheckpointDirRecord, checkpoints.data(),
                          checkpoints.size(), "--tensorboard " + folder);
  }
  sync_directory(dir);
  return folder;
}

// ============================================================================================
// The record framing

#if defined(DPTRAIN_WITH_TENSORBOARD)

uint32_t crc32c(const void* data, size_t size) {
  // crc32_iscsi takes an int length and the running (uninverted) CRC: chained in pieces.
  auto* bytes = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t crc = 0xFFFFFFFFu;
  while (size > 0) {
    const int piece = size > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(size);
    crc = crc32_iscsi(bytes, piece, crc);
    bytes += piece;
    size -= static_cast<size_t>(piece);
  }
  return crc ^ 0xFFFFFFFFu;
}

#else

uint32_t crc32c(const void*, size_t) {
  require_tensorboard_support();
  return 0;
}

#endif

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string frame_tensorboard_record(const std::string& data) {
  std::string record;
  record.reserve(data.size() + 16);
  put_le(record, data.size(), 8);
  put_le(record, masked_crc32c(record.data(), 8), 4);
  record += data;
  put_le(record, masked_crc32c(data.data(), data.size()), 4);
  return record;
}

// ============================================================================================
// One event file

#if defined(DPTRAIN_WITH_TENSORBOARD)

namespace {

constexpr const char* kFilePrefix = "events.out.tfevents.";

double wall_time_now() {
  timeval now {};
  ::gettimeofday(&now, nullptr);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_usec) * 1e-6;
}

// The largest <seconds> of the event files already in `dir`, or -1.
long long newest_event_file_seconds(const std::string& dir) {
  long long newest = -1;
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) return newest;
  const size_t prefix = std::strlen(kFilePrefix);
  while (const dirent* entry = ::readdir(listing)) {
    const char* name = entry->d_name;
    if (std::strncmp(name, kFilePrefix, prefix) != 0) continue;
    char* end = nullptr;
    const long long seconds = std::strtoll(name + prefix, &end, 10);
    if (end != name + prefix && seconds > newest) newest = seconds;
  }
  ::closedir(listing);
  return newest;
}

// The host's name as a file name's part: a '/' would make it a path; TensorBoard needs none of
// the name but "tfevents".
std::string host_name_for_file() {
  std::string name = host_name();
  std::replace(name.begin(), name.end(), '/', '_');
  return name;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  const long long now = static_cast<long long>(std::time(nullptr));
  const long long newest = newest_event_file_seconds(dir);
  const long long seconds = newest >= now ? newest + 1 : now;
  path_ = dir + "/" + kFilePrefix + std::to_string(seconds) + "." + host_name_for_file() + "." +
          std::to_string(::getpid());
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_NOFOLLOW | O_CLOEXEC,
               0644);
  if (fd_ < 0) {
    throw DataError("cannot create TensorBoard event file " + path_ + ": " + errno_text());
  }
  sync_parent_directory(path_);
  write_event(file_version_event(wall_time_now()));
}

void TensorBoardWriter::write_scalars(int64_t step,
                                      const std::vector<TensorBoardScalar>& scalars) {
  write_event(scalars_event(wall_time_now(), step, scalars));
}

void TensorBoardWriter::write_text(int64_t step, const std::string& tag,
                                   const std::string& text) {
  write_event(text_event(wall_time_now(), step, tag, text));
}

void TensorBoardWriter::write_session_start(int64_t step) {
  write_event(session_start_event(wall_time_now(), step));
}

#else

TensorBoardWriter::TensorBoardWriter(const std::string&) { require_tensorboard_support(); }
void TensorBoardWriter::write_scalars(int64_t, const std::vector<TensorBoardScalar>&) {}
void TensorBoardWriter::write_text(int64_t, const std::string&, const std::string&) {}
void TensorBoardWriter::write_session_start(int64_t) {}

#endif

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::write_event(const std::string& event) {
  const std::string record = frame_tensorboard_record(event);
  if (const int error = write_all(fd_, record.data(), record.size())) {
    throw DataError("cannot write TensorBoard event file " + path_ + ": " + errno_text(error));
  }
}

void TensorBoardWriter::sync() {
  if (::fsync(fd_) != 0) {
    throw DataError("cannot sync TensorBoard event file " + path_ + ": " + errno_text());
  }
}

// ============================================================================================
// What a training run logs

namespace {

// A figure as a scalar where it is finite (a text figure is never one: epoch_scalars' check).
std::optional<double> scalar_value(double value) {
  return std::isfinite(value) ? std::optional<double>(value) : std::nullopt;
}
std::optional<double> scalar_value(int64_t value) { return static_cast<double>(value); }
std::optional<double> scalar_value(const std::string&) { return std::nullopt; }

}  // namespace

std::vector<TensorBoardScalar> epoch_scalars(const EpochStats& stats) {
  // The rows of epoch_figures.def written to TensorBoard, in its order. A figure unknown here is
  // NaN (the CPU has no GPU time or device memory; no peak is known for an MFU): left out rather
  // than drawn as a value, as the metrics file leaves it empty.
  const EpochRecord record(stats);
  std::vector<TensorBoardScalar> known;
#define DPTRAIN_EPOCH_FIGURE(name, of, type, initial, unit, kept, written)          \
  static_assert(!writes_tensorboard(EpochFigureWritten::written) ||                 \
                    (std::is_arithmetic_v<type> && std::string_view(#of) != "run"), \
                "TensorBoard logs numbers the epoch's stats give alone: " #name);  \
  if (const auto value = scalar_value(record.name);                                 \
      value && writes_tensorboard(EpochFigureWritten::written)) {                   \
    known.push_back({"epoch/" #name, *value});                                      \
  }
#include "dptrain/train/epoch_figures.def"
#undef DPTRAIN_EPOCH_FIGURE
  return known;
}

std::string settings_markdown(const std::vector<RunSetting>& settings) {
  std::string table = "| setting | value |\n|---|---|\n";
  for (const auto& [name, value] : settings) {
    table += "| " + markdown_cell(name) + " | " + markdown_cell(value) + " |\n";
  }
  return table;
}

TensorBoardLog::TensorBoardLog(const std::string& dir, int64_t steps_per_epoch)
    : writer_(dir), steps_per_epoch_(steps_per_epoch) {}

void TensorBoardLog::start(int64_t start_step, const std::string& settings) {
  // Note [Resuming without a step twice]
  writer_.write_session_start(start_step + 1);
  writer_.write_text(start_step + 1, "run/settings", settings);
  writer_.sync();
}

void TensorBoardLog::add_epoch(const EpochStats& stats) {
  // An epoch cut short by --max-steps is reported on the terminal but not recorded (as in the
  // checkpoint's history): its figures cover part of an epoch, and a resume trains the rest and
  // logs the whole epoch at its last step, where the part would otherwise stay beside it.
  if (stats.steps < steps_per_epoch_) return;
  writer_.write_scalars(stats.epoch * steps_per_epoch_, epoch_scalars(stats));
  writer_.sync();
}

void TensorBoardLog::add_loss(const LossStats& loss) {
  writer_.write_scalars(loss.global_step, {{"step/train_loss", loss.loss}});
}

}  // namespace dptrain
