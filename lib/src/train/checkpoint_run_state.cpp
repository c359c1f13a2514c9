// A checkpoint's run state (everything but its tensors) as the JSON that a version 3 file keeps
// in "dptrain.run_state", and the checks of its contents that every format version shares. See
// checkpoint_run_state.h; the file around it is checkpoint.cpp's.
#include "checkpoint_run_state.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/core/peak_tflops.h"
#include "dptrain/core/safetensors.h"
#include "dptrain/data/augment.h"
#include "dptrain/model/model.h"
#include "dptrain/train/checkpoint_types.h"
#include "dptrain/train/epoch_stats.h"
#include "dptrain/train/lr_schedule.h"
#include "dptrain/train/recipe.h"

namespace dptrain {
namespace {

using Json = nlohmann::json;

// What a file may claim of the run that wrote it beyond the model's shape: the command line's own
// limits (cli.cpp).
constexpr int64_t kMaxCount = (int64_t{1} << 31) - 1;  // --batch-size, the training set
constexpr int64_t kMaxWorldSize = int64_t{1} << 20;
constexpr int64_t kMaxEpochs = 1000000;
// No run is older than about 31 years, nor trains more than 10^12 images a second: figures past
// these would garble the epoch line and the final line (fixed buffers of 256 and 128 bytes).
constexpr double kMaxSeconds = 1e9;
constexpr double kMaxImagesPerSecond = 1e12;
// No host nor device holds a pebibyte (the largest hosts sold today hold some 32 TiB, the largest
// GPUs 288 GB); below 2^53 a double holds every whole byte count exactly.
constexpr double kMaxBytes = 1125899906842624.0;  // 2^50

// "is 1000000, ..." for the impossible-contents messages.
std::string value_text(double value) {
  if (value == std::trunc(value) && std::fabs(value) < 1e18) {
    return std::to_string(static_cast<int64_t>(value));
  }
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

// Note [A checkpoint's contents are checked, not only its digest]
// The digest (the CRC-32 of versions 1 and 2) tells a damaged file from an intact one, not a file
// dptrain wrote from one made to look like it: a crafted file with a fitting CRC claimed step
// 10^6 of a 2-step epoch, which trained nothing and reported 0 img/s, or a global step of
// 2^63 - 1, which wrapped. So every field is checked against what the command line allows and
// against the others: the position
// must lie inside the epoch that the batch size and training-set size make, the history must
// hold exactly the finished epochs, and every figure must lie in its range. A loss may be NaN
// or +inf besides a number >= 0: a run that diverges writes such losses (the test loss of
// weights grown huge, under --on-nonfinite skip or before a step's gradient overflows), and its
// checkpoints must stay readable; a negative loss no run has. The unfinished epoch's sums are
// those of the steps before its position (each a full global batch, a skipped one none: at most
// step x batch examples, whole numbers, none at step 0), seconds and speeds stay below what any
// run can take (kMaxSeconds), and a version 2 or 3 file carries its training set's digest (an
// emptied one would pass for version 1, which has none, and skip the comparison). The weights
// themselves are finite, and a BatchNorm running variance >= 0 (check_checkpoint_tensors): a
// resume from anything else fails only later, with advice about --lr that does not apply.
// The efficiency figures get their ranges too (a history claiming -5 TFLOP/s, an MFU of 1e300 or
// a peak of -1 bytes, once resumed, would reappear in the new run's metrics): each is NaN where the
// writer writes "no figure" (the GPU's milliseconds, the TFLOP/s of an epoch of no seconds, an
// MFU without a known peak, the memory peaks where none is read), else an MFU is a fraction from
// 0 to 1 (the writer gives no MFU above 1, Note [A plausible device's peak] in core/peak_tflops.h,
// and a double read back is the double written, so no slack is needed), a TFLOP/s figure at most
// kMaxPeakTflops a device, a byte count a whole number below a pebibyte. An epoch in which every
// step was skipped has no training loss, accuracy or speed: NaN there is a run's too. Every epoch
// lies inside its own run (1 <= epoch <= epochs <= 10^6; a resumed run may have changed --epochs,
// so the entries need not agree on it). The width is checked before anything else uses it
// (check_claimed_width): the size bound and the model built for the tensors' shapes read it
// before the rest of the contents.
namespace {

// The contents checks' one wording: every refusal names the file, the field, its value and why.
class ContentsCheck {
 public:
  explicit ContentsCheck(const std::string& label) : label_(label) {}
  [[noreturn]] void impossible(const std::string& field, double value,
                               const std::string& why) const {
    impossible_text(field, value_text(value), why);
  }
  [[noreturn]] void impossible_text(const std::string& field, const std::string& value,
                                    const std::string& why) const {
    throw DataError(label_ + ": corrupt: impossible contents: " + field + " is " + value + " (" +
                    why + ")");
  }
  // An integer setting, named in full (a width of 2^63 - 1 as 9223372036854775807).
  void in_range(const char* field, int64_t value, int64_t low, int64_t high) const {
    if (value < low || value > high) {
      impossible_text(field, std::to_string(value),
                      "dptrain writes " + std::to_string(low) + " to " + std::to_string(high));
    }
  }
  void finite_at_least_zero(const std::string& field, double value) const {
    if (!std::isfinite(value) || value < 0) impossible(field, value, "a finite number >= 0");
  }
  void loss(const std::string& field, double value) const {
    if (!(std::isnan(value) || value >= 0)) impossible(field, value, "a loss: >= 0, inf or nan");
  }
  void seconds(const std::string& field, double value) const {
    if (value > kMaxSeconds) {
      impossible(field, value, "at most " + value_text(kMaxSeconds) + ", some 31 years");
    }
  }
  // A figure the writer leaves NaN where it has none, else from `low` to `high`.
  void figure(const std::string& field, double value, double low, double high,
              const std::string& why) const {
    if (!std::isnan(value) && !(value >= low && value <= high)) impossible(field, value, why);
  }
  void bytes(const std::string& field, double value) const {
    if (!std::isnan(value) && !(value >= 0 && value <= kMaxBytes && value == std::trunc(value))) {
      impossible(field, value, "nan, or a whole number of bytes from 0 to 2^50");
    }
  }

 private:
  const std::string& label_;
};

// The steps an epoch has, and the sentence that says so, for the position's checks.
struct EpochShape {
  int64_t steps;
  std::string text;
};

EpochShape epoch_shape(const CheckpointConfig& config) {
  const int64_t steps = (config.train_size + config.batch_size - 1) / config.batch_size;
  return {steps, "an epoch of " + std::to_string(config.train_size) + " images in batches of " +
                     std::to_string(config.batch_size) + " has " + std::to_string(steps) +
                     " steps"};
}

// The run's settings, each in the range the flags allow (checked before anything divides by them).
void check_config(const Checkpoint& c, const ContentsCheck& check) {
  const auto& config = c.config;
  check.in_range("width", config.width, 1, kMaxWidth);  // as check_claimed_width
  check.in_range("the class count", config.num_classes, 1, kMaxClassesOrChannels);
  check.in_range("the input channel count", config.in_channels, 1, kMaxClassesOrChannels);
  check.in_range("the batch size", config.batch_size, 1, kMaxCount);
  check.in_range("the training-set size", config.train_size, 1, kMaxCount);
  check.in_range("the world size", config.world_size, 1, kMaxWorldSize);
  if (!std::isfinite(config.lr) || config.lr <= 0) {
    check.impossible("the learning rate", config.lr, "a finite number > 0");
  }
  check.in_range("the epochs done", c.epochs_done, 0, static_cast<int64_t>(kMaxEpochs));
  check.in_range("the schedule's epochs", config.schedule_epochs, 0,
                 static_cast<int64_t>(kMaxEpochs));
  try {
    check_recipe(config.recipe);
  } catch (const UsageError& e) {
    check.impossible_text("the recipe", recipe_flags(config.recipe), e.what());
  }
}

void check_position(const Checkpoint& c, const ContentsCheck& check, const EpochShape& epoch) {
  if (c.step_in_epoch < 0 || c.step_in_epoch >= epoch.steps) {
    check.impossible("the step in the epoch", static_cast<double>(c.step_in_epoch), epoch.text);
  }
  // At most 10^6 x (2^31 - 1) + 2^31: no overflow.
  const int64_t global = c.epochs_done * epoch.steps + c.step_in_epoch;
  if (c.global_step != global) {
    check.impossible("the global step", static_cast<double>(c.global_step),
                     "epoch " + std::to_string(c.epochs_done) + " step " +
                         std::to_string(c.step_in_epoch) + " is global step " +
                         std::to_string(global) + "; " + epoch.text);
  }
}

// The unfinished epoch's sums: those of the steps before its position.
void check_partial_epoch(const Checkpoint& c, const ContentsCheck& check) {
  const auto& sums = c.partial_sums;
  const auto& config = c.config;
  check.loss("the epoch's loss sum", sums.loss_sum);
  check.finite_at_least_zero("the epoch's correct count", sums.correct);
  check.finite_at_least_zero("the epoch's example count", sums.count);
  check.finite_at_least_zero("the epoch's seconds", c.partial_seconds);
  if (sums.count > static_cast<double>(config.train_size) || sums.correct > sums.count) {
    check.impossible("the epoch's correct count", sums.correct,
                     "of " + value_text(sums.count) + " examples, from a training set of " +
                         std::to_string(config.train_size));
  }
  // At most 2^31 x 2^31: exact in a double.
  const double seen = static_cast<double>(c.step_in_epoch) * static_cast<double>(config.batch_size);
  if (sums.count > seen || sums.count != std::trunc(sums.count)) {
    check.impossible("the epoch's example count", sums.count,
                     "a whole number of at most " + value_text(seen) + ": " +
                         std::to_string(c.step_in_epoch) + " steps of batches of " +
                         std::to_string(config.batch_size) + " into the epoch");
  }
  if (sums.correct != std::trunc(sums.correct)) {
    check.impossible("the epoch's correct count", sums.correct, "a whole number");
  }
  if (sums.count == 0 && sums.loss_sum != 0) {
    check.impossible("the epoch's loss sum", sums.loss_sum, "over no examples: 0");
  }
  check.seconds("the epoch's seconds", c.partial_seconds);
}

// A version 2 or 3 file carries its training set's SHA-256: an emptied one would pass for
// version 1, which has none, and skip the comparison.
void check_train_digest(const Checkpoint& c, const std::string& label) {
  if (c.format_version < 2) return;
  const std::string& digest = c.config.train_digest;
  const bool hex = digest.size() == 64 && std::all_of(digest.begin(), digest.end(), [](char ch) {
                     return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
                   });
  if (!hex) {
    throw DataError(label + ": corrupt: impossible contents: the training set's digest is '" +
                    printable(digest.substr(0, 80)) + "' (a file of format version " +
                    std::to_string(c.format_version) +
                    " carries the SHA-256 of its training set, 64 hex digits)");
  }
}

void check_history(const Checkpoint& c, const ContentsCheck& check, const EpochShape& epoch) {
  if (c.history.size() != static_cast<size_t>(c.epochs_done)) {
    check.impossible(
        "the history's length", static_cast<double>(c.history.size()),
        "it holds the finished epochs, and " + std::to_string(c.epochs_done) + " are done");
  }
  for (size_t i = 0; i < c.history.size(); ++i) {
    const auto& s = c.history[i];
    const std::string at = "epoch " + std::to_string(i + 1) + " of the history: ";
    if (s.epoch != static_cast<int64_t>(i) + 1) {
      check.impossible(at + "its number", static_cast<double>(s.epoch),
                       "the epochs are numbered 1, 2, ...");
    }
    if (s.epochs < s.epoch || s.epochs > kMaxEpochs) {
      check.impossible(at + "the run's epochs", static_cast<double>(s.epochs),
                       "from its number, " + std::to_string(s.epoch) + ", to " +
                           value_text(kMaxEpochs));
    }
    check.loss(at + "train loss", s.train_loss);
    check.loss(at + "test loss", s.test_loss);
    // An epoch in which no step trained has no train loss, accuracy or pace: all three NaN
    // (Note [An epoch without a trained step] in rank.cpp); a trained epoch's loss is finite.
    const bool untrained = std::isnan(s.train_loss);
    for (const auto& [field, value] :
         {std::pair<const char*, double>{"seconds", s.seconds},
          {"steps", static_cast<double>(s.steps)}}) {
      check.finite_at_least_zero(at + field, value);
    }
    check.seconds(at + "seconds", s.seconds);
    check.figure(at + "images per second", s.images_per_second, 0, kMaxImagesPerSecond,
                 "nan, or from 0 to " + value_text(kMaxImagesPerSecond));
    if (s.steps > epoch.steps)
      check.impossible(at + "steps", static_cast<double>(s.steps), epoch.text);
    check.figure(at + "train accuracy", s.train_acc, 0, 1, "nan, or an accuracy from 0 to 1");
    if (!untrained) {
      for (const auto& [field, value] :
           {std::pair<const char*, double>{"train accuracy", s.train_acc},
            {"images per second", s.images_per_second}}) {
        if (std::isnan(value)) {
          check.impossible(at + field, value,
                           "a number where the epoch trained (its train loss is " +
                               value_text(s.train_loss) + ")");
        }
      }
    }
    if (!(s.test_acc >= 0 && s.test_acc <= 1)) {
      check.impossible(at + "test accuracy", s.test_acc, "an accuracy from 0 to 1");
    }
    check.figure(at + "GPU milliseconds per step", s.gpu_ms_per_step, 0, kMaxSeconds * 1000,
                 "nan, or from 0 to " + value_text(kMaxSeconds * 1000));
    const double max_tflops = kMaxPeakTflops * static_cast<double>(c.config.world_size);
    check.figure(at + "TFLOP/s", s.tflops, 0, max_tflops,
                 "nan, or from 0 to " + value_text(max_tflops) + ": " +
                     value_text(kMaxPeakTflops) + " a device, in a world of " +
                     std::to_string(c.config.world_size));
    check.figure(at + "MFU", s.mfu, 0, 1, "nan, or a fraction from 0 to 1");
    if (!std::isnan(s.mfu) && std::isnan(s.tflops)) {
      check.impossible(at + "MFU", s.mfu, "of nan TFLOP/s: nan");
    }
    check.bytes(at + "peak host bytes", s.peak_host_bytes);
    check.bytes(at + "peak device bytes", s.peak_device_bytes);
    check.loss(at + "validation loss", s.val_loss);  // NaN without a validation set
    check.figure(at + "validation accuracy", s.val_acc, 0, 1, "nan, or an accuracy from 0 to 1");
    check.figure(at + "evaluation seconds", s.eval_seconds, 0, kMaxSeconds,
                 "nan, or from 0 to " + value_text(kMaxSeconds));
  }
}

}  // namespace

void check_claimed_width(int64_t width, const std::string& label) {
  ContentsCheck(label).in_range("width", width, 1, kMaxWidth);
}

void check_checkpoint_contents(const Checkpoint& c, const std::string& label) {
  const ContentsCheck check(label);
  check_config(c, check);
  const EpochShape epoch = epoch_shape(c.config);
  check_position(c, check, epoch);
  check_partial_epoch(c, check);
  check_train_digest(c, label);
  check_history(c, check, epoch);
}

void check_checkpoint_tensors(const NamedTensors& tensors, const std::string& label) {
  const std::string suffix = "running_var";
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.is_floating_point() || tensor.numel() == 0) continue;
    const std::string shown = "tensor '" + printable(name) + "'";
    if (!torch::isfinite(tensor).all().item<bool>()) {
      throw DataError(label + ": corrupt: impossible contents: " + shown + " holds NaN or an " +
                      "infinity (dptrain never saves the weights of a non-finite step); not used");
    }
    const bool variance = name.size() >= suffix.size() &&
                          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (variance && tensor.min().item<double>() < 0) {
      throw DataError(label + ": corrupt: impossible contents: " + shown + " (a BatchNorm " +
                      "running variance) holds " + value_text(tensor.min().item<double>()) +
                      " (a variance is >= 0); not used");
    }
  }
}

namespace {

// ---- The run state as JSON -----------------------------------------------------------------

// A double as JSON: a number when finite, else the string "nan", "inf" or "-inf" (JSON has none).
Json number(double value) {
  if (std::isfinite(value)) return value;
  return std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
}

Json figure_json(int64_t value) { return value; }
Json figure_json(double value) { return number(value); }

// The rows of epoch_figures.def kept in a checkpoint, under their names (nlohmann's objects sort
// their keys: the table's order is not the file's).
#define DPTRAIN_EPOCH_FIGURE(name, of, type, initial, unit, kept, written) \
  DPTRAIN_RUN_STATE_##kept(name)
#define DPTRAIN_RUN_STATE_since_v1(name) json[#name] = figure_json(s.name);
#define DPTRAIN_RUN_STATE_since_v3(name) json[#name] = figure_json(s.name);
#define DPTRAIN_RUN_STATE_not_kept(name)
Json stats_json(const EpochStats& s) {
  Json json = Json::object();
#include "dptrain/train/epoch_figures.def"
  return json;
}
#undef DPTRAIN_RUN_STATE_not_kept
#undef DPTRAIN_RUN_STATE_since_v3
#undef DPTRAIN_RUN_STATE_since_v1
#undef DPTRAIN_EPOCH_FIGURE

// The recipe, written only where it is not the book's: a book run's files stay as they were.
Json recipe_json(const CheckpointConfig& config) {
  const Recipe& r = config.recipe;
  return {{"momentum", number(r.sgd.momentum)},
          {"nesterov", r.sgd.nesterov},
          {"weight_decay", number(r.sgd.weight_decay)},
          {"weight_decay_skip_norm_bias", r.sgd.weight_decay_skip_vectors},
          {"lr_schedule", lr_shape_name(r.schedule.shape)},
          {"warmup_epochs", number(r.schedule.warmup_epochs)},
          {"lr_step_epochs", r.schedule.step_epochs},
          {"lr_step_gamma", number(r.schedule.step_gamma)},
          {"schedule_epochs", config.schedule_epochs},
          {"label_smoothing", number(r.label_smoothing)},
          {"augment", augment_name(r.augment)},
          {"crop_padding", r.crop_padding},
          {"clip_grad_norm", number(r.clip_grad_norm)},
          {"ema", number(r.ema_decay)}};
}

Json run_state_json(const Checkpoint& c) {
  const auto& config = c.config;
  Json history = Json::array();
  for (const auto& s : c.history) history.push_back(stats_json(s));
  Json state = {{"config",
                 {{"width", config.width},
                  {"num_classes", config.num_classes},
                  {"in_channels", config.in_channels},
                  {"batch_size", config.batch_size},
                  {"lr", number(config.lr)},
                  {"seed", config.seed},
                  {"train_size", config.train_size},
                  {"world_size", config.world_size},
                  {"train_digest", config.train_digest}}},
                {"epochs_done", c.epochs_done},
                {"step_in_epoch", c.step_in_epoch},
                {"global_step", c.global_step},
                {"partial_sums",
                 {{"loss_sum", number(c.partial_sums.loss_sum)},
                  {"correct", number(c.partial_sums.correct)},
                  {"count", number(c.partial_sums.count)}}},
                {"partial_seconds", number(c.partial_seconds)},
                {"history", history}};
  if (!is_book_recipe(config.recipe)) state["config"]["recipe"] = recipe_json(config);
  return state;
}

// Reads the run state's fields by name; a missing field or one of the wrong type is a DataError
// naming it ("run state: history[2].seconds is not a number"). Fields it does not know are left
// alone: a newer dptrain adds them under a new format version only when they matter.
class RunStateReader {
 public:
  explicit RunStateReader(const std::string& label) : label_(label) {}

  const Json& field(const Json& object, const char* key, const std::string& at) const {
    if (!object.is_object()) fail(at.empty() ? "the run state" : at, "is not an object");
    const auto found = object.find(key);
    if (found == object.end()) fail(join(at, key), "is missing");
    return *found;
  }
  const Json& object(const Json& parent, const char* key, const std::string& at) const {
    const Json& value = field(parent, key, at);
    if (!value.is_object()) fail(join(at, key), "is not an object");
    return value;
  }
  int64_t integer(const Json& object, const char* key, const std::string& at) const {
    const Json& value = field(object, key, at);
    if (!value.is_number_integer() ||
        (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t{INT64_MAX})) {
      fail(join(at, key), "is not an integer of 64 bits");
    }
    return value.get<int64_t>();
  }
  uint64_t unsigned_integer(const Json& object, const char* key, const std::string& at) const {
    const Json& value = field(object, key, at);
    if (!value.is_number_unsigned()) fail(join(at, key), "is not an integer from 0 to 2^64 - 1");
    return value.get<uint64_t>();
  }
  double real(const Json& object, const char* key, const std::string& at) const {
    const Json& value = field(object, key, at);
    if (value.is_number()) return value.get<double>();
    if (value == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (value == "inf") return std::numeric_limits<double>::infinity();
    if (value == "-inf") return -std::numeric_limits<double>::infinity();
    fail(join(at, key), "is not a number (nor \"nan\", \"inf\", \"-inf\")");
  }
  // A figure later versions may add: NaN when absent.
  double optional_real(const Json& object, const char* key, const std::string& at) const {
    return object.contains(key) ? real(object, key, at)
                                : std::numeric_limits<double>::quiet_NaN();
  }
  bool boolean(const Json& object, const char* key, const std::string& at) const {
    const Json& value = field(object, key, at);
    if (!value.is_boolean()) fail(join(at, key), "is not true or false");
    return value.get<bool>();
  }
  std::string text(const Json& object, const char* key, const std::string& at) const {
    const Json& value = field(object, key, at);
    if (!value.is_string()) fail(join(at, key), "is not a string");
    return value.get<std::string>();
  }
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw DataError(label_ + ": corrupt: run state: " + field + " " + what);
  }

 private:
  static std::string join(const std::string& at, const char* key) {
    return at.empty() ? std::string(key) : at + "." + key;
  }
  const std::string& label_;
};

// A figure every format version keeps, and one added to version 3: NaN where a file lacks it.
void read_figure(const RunStateReader& r, const Json& s, const char* key, const std::string& at,
                 EpochFigureKept kept, int64_t& value) {
  if (kept == EpochFigureKept::since_v1 || s.contains(key)) value = r.integer(s, key, at);
}
void read_figure(const RunStateReader& r, const Json& s, const char* key, const std::string& at,
                 EpochFigureKept kept, double& value) {
  value = kept == EpochFigureKept::since_v1 ? r.real(s, key, at) : r.optional_real(s, key, at);
}

// The rows of epoch_figures.def kept in a checkpoint, in the table's order: the first fault
// named is the first row's.
#define DPTRAIN_EPOCH_FIGURE(name, of, type, initial, unit, kept, written) \
  DPTRAIN_RUN_STATE_##kept(name)
#define DPTRAIN_RUN_STATE_since_v1(name) \
  read_figure(r, s, #name, at, EpochFigureKept::since_v1, stats.name);
#define DPTRAIN_RUN_STATE_since_v3(name) \
  read_figure(r, s, #name, at, EpochFigureKept::since_v3, stats.name);
#define DPTRAIN_RUN_STATE_not_kept(name)
EpochStats read_stats(const RunStateReader& r, const Json& s, const std::string& at) {
  EpochStats stats;
#include "dptrain/train/epoch_figures.def"
  return stats;
}
#undef DPTRAIN_RUN_STATE_not_kept
#undef DPTRAIN_RUN_STATE_since_v3
#undef DPTRAIN_RUN_STATE_since_v1
#undef DPTRAIN_EPOCH_FIGURE

// A recipe's record (recipe_json); a file without one trained the book's.
void read_recipe(const RunStateReader& r, const Json& j, CheckpointConfig& config) {
  const std::string at = "config.recipe";
  Recipe& recipe = config.recipe;
  recipe.sgd.momentum = r.real(j, "momentum", at);
  recipe.sgd.nesterov = r.boolean(j, "nesterov", at);
  recipe.sgd.weight_decay = r.real(j, "weight_decay", at);
  recipe.sgd.weight_decay_skip_vectors = r.boolean(j, "weight_decay_skip_norm_bias", at);
  const auto shape = lr_shape_from_name(r.text(j, "lr_schedule", at));
  if (!shape) r.fail(at + ".lr_schedule", "is not constant, step, cosine or onecycle");
  recipe.schedule.shape = *shape;
  recipe.schedule.warmup_epochs = r.real(j, "warmup_epochs", at);
  recipe.schedule.step_epochs = r.integer(j, "lr_step_epochs", at);
  recipe.schedule.step_gamma = r.real(j, "lr_step_gamma", at);
  config.schedule_epochs = r.integer(j, "schedule_epochs", at);
  recipe.label_smoothing = r.real(j, "label_smoothing", at);
  const auto augment = augment_from_name(r.text(j, "augment", at));
  if (!augment) r.fail(at + ".augment", "is not none or crop-flip");
  recipe.augment = *augment;
  recipe.crop_padding = r.integer(j, "crop_padding", at);
  recipe.clip_grad_norm = r.real(j, "clip_grad_norm", at);
  recipe.ema_decay = r.real(j, "ema", at);
}

CheckpointConfig read_config(const RunStateReader& r, const Json& state) {
  const Json& c = r.object(state, "config", "");
  CheckpointConfig config;
  config.width = r.integer(c, "width", "config");
  config.num_classes = r.integer(c, "num_classes", "config");
  config.in_channels = r.integer(c, "in_channels", "config");
  config.batch_size = r.integer(c, "batch_size", "config");
  config.lr = r.real(c, "lr", "config");
  config.seed = r.unsigned_integer(c, "seed", "config");
  config.train_size = r.integer(c, "train_size", "config");
  config.world_size = r.integer(c, "world_size", "config");
  config.train_digest = r.text(c, "train_digest", "config");
  if (c.contains("recipe")) read_recipe(r, r.object(c, "recipe", "config"), config);
  return config;
}

Checkpoint read_run_state(const Json& state, const std::string& label) {
  const RunStateReader r(label);
  Checkpoint c;
  c.config = read_config(r, state);
  c.epochs_done = r.integer(state, "epochs_done", "");
  c.step_in_epoch = r.integer(state, "step_in_epoch", "");
  c.global_step = r.integer(state, "global_step", "");
  const Json& sums = r.object(state, "partial_sums", "");
  c.partial_sums.loss_sum = r.real(sums, "loss_sum", "partial_sums");
  c.partial_sums.correct = r.real(sums, "correct", "partial_sums");
  c.partial_sums.count = r.real(sums, "count", "partial_sums");
  c.partial_seconds = r.real(state, "partial_seconds", "");
  const Json& history = r.field(state, "history", "");
  if (!history.is_array()) r.fail("history", "is not an array");
  for (size_t i = 0; i < history.size(); ++i) {
    c.history.push_back(read_stats(r, history[i], "history[" + std::to_string(i) + "]"));
  }
  return c;
}

Json parse_json(const std::string& text, const std::string& label) {
  check_json_text(text.data(), text.size(), label, "the run state");
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    throw DataError(label + ": corrupt: the run state is not valid JSON: " + printable(e.what()));
  }
}

}  // namespace

std::string run_state_text(const Checkpoint& checkpoint) { return run_state_json(checkpoint).dump(); }

Checkpoint parse_run_state(const std::string& text, const std::string& label) {
  return read_run_state(parse_json(text, label), label);
}

int64_t run_state_width(const std::string& text, const std::string& label) {
  const Json state = parse_json(text, label);
  const RunStateReader r(label);
  const int64_t width = r.integer(r.object(state, "config", ""), "width", "config");
  check_claimed_width(width, label);
  return width;
}

std::string figure_text(double value) {
  return std::isfinite(value) ? Json(value).dump() : number(value).get<std::string>();
}

}  // namespace dptrain
