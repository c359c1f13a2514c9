// TensorBoard event files (--tensorboard DIR, written by global rank 0): the record framing of
// TensorBoard's format, the run's folder in DIR, a writer of one event file, and what a training
// run logs into it: each epoch's figures, the running training loss every N steps, its settings
// as text, and on a resume the marker that keeps TensorBoard from showing a step twice. Built
// where protobuf and ISA-L were found (third_party/dependencies.cmake); elsewhere the flag is
// refused in one line.
// Not here: the metrics file (metrics.h), the terminal's lines (report.h), the flag (app/cli.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/train/callbacks.h"
#include "dptrain/train/epoch_stats.h"
#include "dptrain/train/run_configuration.h"

namespace dptrain {

// ---- Whether this build can, and the directory ------------------------------------------------

// Whether this build writes event files (protobuf and ISA-L were found when it was built).
bool tensorboard_supported();
// Throws UsageError "--tensorboard: this dptrain was built without ... (<what it lacked>) ..."
// where !tensorboard_supported(). Every rank calls it, before the data load.
void require_tensorboard_support();
// Before the run, on the rank that writes: creates `dir` if needed (mkdir -p) and checks that it
// takes a new file. Throws UsageError "--tensorboard DIR: ..." (a file there, no permission).
void prepare_tensorboard_dir(const std::string& dir);
// The folder in `dir` that this run's event files go into (Note [One folder per run] in
// tensorboard.cpp): a `resumed` run's, the largest run-N whose recorded checkpoint directory is
// `checkpoint_dir`; else a new dir/run-N, one past the largest, which records `checkpoint_dir`
// (when given). The caller holds dir's writer lock. Throws DataError naming the folder.
std::string tensorboard_run_folder(const std::string& dir,
                                   const std::optional<std::string>& checkpoint_dir, bool resumed);

// ---- The record framing (TensorFlow's TFRecord) ------------------------------------------------

// CRC-32C (Castagnoli) of `size` bytes; "123456789" gives 0xE3069283.
uint32_t crc32c(const void* data, size_t size);
// TensorFlow's masked CRC-32C: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);
// One record: the data's length (uint64, little-endian), the masked CRC of those 8 bytes, the
// data, and the masked CRC of the data (uint32s, little-endian).
std::string frame_tensorboard_record(const std::string& data);

// ---- Events as bytes (tensorboard_event.cpp) --------------------------------------------------
// Note [Protobuf apart from LibTorch's headers] in tensorboard_event.cpp: these are the only
// functions that touch the code protoc generates. Each returns one serialised Event.

struct TensorBoardScalar {
  std::string tag;  // "epoch/train_loss"
  double value;     // stored as float32, TensorBoard's simple_value
};

std::string file_version_event(double wall_time);  // "brain.Event:2", at step 0
std::string scalars_event(double wall_time, int64_t step,
                          const std::vector<TensorBoardScalar>& scalars);
// `text` (markdown) under `tag`, for TensorBoard's text plugin: a scalar DT_STRING tensor.
std::string text_event(double wall_time, int64_t step, const std::string& tag,
                       const std::string& text);
std::string session_start_event(double wall_time, int64_t step);  // SessionLog START

// An event read back, field by field as TensorBoard's format has it (for tests).
struct DecodedTensorBoardEvent {
  struct Value {
    std::string tag;
    float simple_value = 0;
    std::string plugin_name;           // the metadata's ("text" for a text summary)
    int dtype = 0;                     // the tensor's (7: DT_STRING); 0 without a tensor
    int dims = -1;                     // the tensor's dimensions (0: a scalar); -1: no tensor
    std::vector<std::string> strings;  // the tensor's string_val
  };
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;    // "" but in the file's first event
  bool session_start = false;  // a SessionLog with status START
  std::vector<Value> values;   // the summary's
};
// Parses one serialised Event; false when `data` is none.
bool decode_tensorboard_event(const std::string& data, DecodedTensorBoardEvent& event);

// ---- One event file --------------------------------------------------------------------------

// A new event file in a directory: events.out.tfevents.<unix seconds>.<host>.<pid>, its first
// event the file version. Each write_* is one event, one write(2), so that a crash keeps every
// event written before it whole; sync() makes them durable. Errors are DataError naming the file.
class TensorBoardWriter {
 public:
  // Opens the file in `dir` (prepare_tensorboard_dir has made it). TensorBoard reads a
  // directory's files in name order, and a resume's START marker must come after what it
  // replaces: the file's seconds are moved past those of any event file already there.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at `step` holding the scalars (a non-finite value is written as it is).
  void write_scalars(int64_t step, const std::vector<TensorBoardScalar>& scalars);
  // `text` (markdown) under `tag`, for TensorBoard's text plugin.
  void write_text(int64_t step, const std::string& tag, const std::string& text);
  // SessionLog START: TensorBoard's reader drops the events that earlier files hold at `step`
  // and after (EventAccumulator, purge_orphaned_data, its default).
  void write_session_start(int64_t step);
  void sync();

  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);  // a serialised Event, framed and written

  std::string path_;
  int fd_ = -1;
};

// ---- What a training run logs ----------------------------------------------------------------

// The scalars of an epoch: each row of train/epoch_figures.def written to TensorBoard
// (metrics_tensorboard), tagged "epoch/<name>", in the table's order, where it is finite.
std::vector<TensorBoardScalar> epoch_scalars(const EpochStats& stats);

// The settings as a markdown table, "| setting | value |", for the text summary.
std::string settings_markdown(const std::vector<RunSetting>& settings);

// Every scalar sits at the global step it was measured at, so that epochs and steps share one
// axis: an epoch's figures at its last step, the running loss at the steps it covers up to.
// Note [Resuming without a step twice] in tensorboard.cpp says how a resume continues.
class TensorBoardLog {
 public:
  // `dir` as prepare_tensorboard_dir left it; `steps_per_epoch` maps an epoch to its last step.
  TensorBoardLog(const std::string& dir, int64_t steps_per_epoch);

  // Once the world is up: `start_step` is the global step the run starts after (0, or a resumed
  // checkpoint's); `settings` the run's, written as text.
  void start(int64_t start_step, const std::string& settings);
  // After each whole epoch, at its last step, synced to disk (an epoch cut short by --max-steps
  // is left out: a resume logs it whole).
  void add_epoch(const EpochStats& stats);
  // Every --tensorboard-every steps: "step/train_loss".
  void add_loss(const LossStats& loss);

  const std::string& path() const { return writer_.path(); }

 private:
  TensorBoardWriter writer_;
  int64_t steps_per_epoch_;
};

}  // namespace dptrain
