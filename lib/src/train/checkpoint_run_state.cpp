// A checkpoint's run state (everything but its tensors) as the JSON that a version 3 file keeps
// in "dptrain.run_state", and the checks of its contents that every format version shares. See
// checkpoint_run_state.h; the file around it is checkpoint.cpp's.
#include "checkpoint_run_state.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"

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
void check_checkpoint_contents(const Checkpoint& c, const std::string& label) {
  const auto impossible = [&](const std::string& field, double value, const std::string& why) {
    throw DataError(label + ": corrupt: impossible contents: " + field + " is " + value_text(value) +
                    " (" + why + ")");
  };
  const auto in_range = [&](const char* field, int64_t value, int64_t low, int64_t high) {
    if (value < low || value > high) {
      impossible(field, static_cast<double>(value),
                 "dptrain writes " + std::to_string(low) + " to " + std::to_string(high));
    }
  };
  const auto finite_at_least_zero = [&](const std::string& field, double value) {
    if (!std::isfinite(value) || value < 0) impossible(field, value, "a finite number >= 0");
  };
  const auto loss = [&](const std::string& field, double value) {
    if (!(std::isnan(value) || value >= 0)) impossible(field, value, "a loss: >= 0, inf or nan");
  };
  const auto& config = c.config;
  in_range("width", config.width, 1, kMaxWidth);
  in_range("the class count", config.num_classes, 1, kMaxClassesOrChannels);
  in_range("the input channel count", config.in_channels, 1, kMaxClassesOrChannels);
  in_range("the batch size", config.batch_size, 1, kMaxCount);
  in_range("the training-set size", config.train_size, 1, kMaxCount);
  in_range("the world size", config.world_size, 1, kMaxWorldSize);
  if (!std::isfinite(config.lr) || config.lr <= 0) {
    impossible("the learning rate", config.lr, "a finite number > 0");
  }
  in_range("the epochs done", c.epochs_done, 0, static_cast<int64_t>(kMaxEpochs));
  const int64_t steps_per_epoch = (config.train_size + config.batch_size - 1) / config.batch_size;
  const std::string epoch_shape = "an epoch of " + std::to_string(config.train_size) +
                                  " images in batches of " + std::to_string(config.batch_size) +
                                  " has " + std::to_string(steps_per_epoch) + " steps";
  if (c.step_in_epoch < 0 || c.step_in_epoch >= steps_per_epoch) {
    impossible("the step in the epoch", static_cast<double>(c.step_in_epoch), epoch_shape);
  }
  // At most 10^6 x (2^31 - 1) + 2^31: no overflow.
  const int64_t global = c.epochs_done * steps_per_epoch + c.step_in_epoch;
  if (c.global_step != global) {
    impossible("the global step", static_cast<double>(c.global_step),
               "epoch " + std::to_string(c.epochs_done) + " step " +
                   std::to_string(c.step_in_epoch) + " is global step " + std::to_string(global) +
                   "; " + epoch_shape);
  }
  loss("the epoch's loss sum", c.partial_sums.loss_sum);
  finite_at_least_zero("the epoch's correct count", c.partial_sums.correct);
  finite_at_least_zero("the epoch's example count", c.partial_sums.count);
  finite_at_least_zero("the epoch's seconds", c.partial_seconds);
  if (c.partial_sums.count > static_cast<double>(config.train_size) ||
      c.partial_sums.correct > c.partial_sums.count) {
    impossible("the epoch's correct count", c.partial_sums.correct,
               "of " + value_text(c.partial_sums.count) + " examples, from a training set of " +
                   std::to_string(config.train_size));
  }
  // At most 2^31 x 2^31: exact in a double.
  const double seen = static_cast<double>(c.step_in_epoch) * static_cast<double>(config.batch_size);
  if (c.partial_sums.count > seen || c.partial_sums.count != std::trunc(c.partial_sums.count)) {
    impossible("the epoch's example count", c.partial_sums.count,
               "a whole number of at most " + value_text(seen) + ": " +
                   std::to_string(c.step_in_epoch) + " steps of batches of " +
                   std::to_string(config.batch_size) + " into the epoch");
  }
  if (c.partial_sums.correct != std::trunc(c.partial_sums.correct)) {
    impossible("the epoch's correct count", c.partial_sums.correct, "a whole number");
  }
  if (c.partial_sums.count == 0 && c.partial_sums.loss_sum != 0) {
    impossible("the epoch's loss sum", c.partial_sums.loss_sum, "over no examples: 0");
  }
  if (c.partial_seconds > kMaxSeconds) {
    impossible("the epoch's seconds", c.partial_seconds,
               "at most " + value_text(kMaxSeconds) + ", some 31 years");
  }
  if (c.format_version >= 2) {
    const std::string& digest = config.train_digest;
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
  if (c.history.size() != static_cast<size_t>(c.epochs_done)) {
    impossible("the history's length", static_cast<double>(c.history.size()),
               "it holds the finished epochs, and " + std::to_string(c.epochs_done) +
                   " are done");
  }
  for (size_t i = 0; i < c.history.size(); ++i) {
    const auto& s = c.history[i];
    const std::string at = "epoch " + std::to_string(i + 1) + " of the history: ";
    if (s.epoch != static_cast<int64_t>(i) + 1) {
      impossible(at + "its number", static_cast<double>(s.epoch), "the epochs are numbered 1, 2, ...");
    }
    loss(at + "train loss", s.train_loss);
    loss(at + "test loss", s.test_loss);
    for (const auto& [field, value] :
         {std::pair<const char*, double>{"seconds", s.seconds},
          {"images per second", s.images_per_second}, {"steps", static_cast<double>(s.steps)}}) {
      finite_at_least_zero(at + field, value);
    }
    if (s.seconds > kMaxSeconds) {
      impossible(at + "seconds", s.seconds,
                 "at most " + value_text(kMaxSeconds) + ", some 31 years");
    }
    if (s.images_per_second > kMaxImagesPerSecond) {
      impossible(at + "images per second", s.images_per_second,
                 "at most " + value_text(kMaxImagesPerSecond));
    }
    if (s.steps > steps_per_epoch) {
      impossible(at + "steps", static_cast<double>(s.steps), epoch_shape);
    }
    for (const auto& [field, value] :
         {std::pair<const char*, double>{"train accuracy", s.train_acc}, {"test accuracy", s.test_acc}}) {
      if (!(value >= 0 && value <= 1)) impossible(at + field, value, "an accuracy from 0 to 1");
    }
  }
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

Json stats_json(const EpochStats& s) {
  return {{"epoch", s.epoch},
          {"epochs", s.epochs},
          {"train_loss", number(s.train_loss)},
          {"train_acc", number(s.train_acc)},
          {"test_loss", number(s.test_loss)},
          {"test_acc", number(s.test_acc)},
          {"seconds", number(s.seconds)},
          {"images_per_second", number(s.images_per_second)},
          {"steps", s.steps},
          {"gpu_ms_per_step", number(s.gpu_ms_per_step)},
          {"tflops", number(s.tflops)},
          {"mfu", number(s.mfu)},
          {"peak_host_bytes", number(s.peak_host_bytes)},
          {"peak_device_bytes", number(s.peak_device_bytes)}};
}

Json run_state_json(const Checkpoint& c) {
  const auto& config = c.config;
  Json history = Json::array();
  for (const auto& s : c.history) history.push_back(stats_json(s));
  return {{"config",
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

EpochStats read_stats(const RunStateReader& r, const Json& s, const std::string& at) {
  EpochStats stats;
  stats.epoch = r.integer(s, "epoch", at);
  stats.epochs = r.integer(s, "epochs", at);
  stats.train_loss = r.real(s, "train_loss", at);
  stats.train_acc = r.real(s, "train_acc", at);
  stats.test_loss = r.real(s, "test_loss", at);
  stats.test_acc = r.real(s, "test_acc", at);
  stats.seconds = r.real(s, "seconds", at);
  stats.images_per_second = r.real(s, "images_per_second", at);
  stats.steps = r.integer(s, "steps", at);
  stats.gpu_ms_per_step = r.optional_real(s, "gpu_ms_per_step", at);
  stats.tflops = r.optional_real(s, "tflops", at);
  stats.mfu = r.optional_real(s, "mfu", at);
  stats.peak_host_bytes = r.optional_real(s, "peak_host_bytes", at);
  stats.peak_device_bytes = r.optional_real(s, "peak_device_bytes", at);
  return stats;
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
  return r.integer(r.object(state, "config", ""), "width", "config");
}

std::string figure_text(double value) {
  return std::isfinite(value) ? Json(value).dump() : number(value).get<std::string>();
}

}  // namespace dptrain
