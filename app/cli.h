// The dptrain command line: subcommands, flags, their checks and their help text. Parsing only:
// no device is touched and nothing runs, so every usage mistake is found before any work.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/core/cpu_allocator.h"
#include "dptrain/train/options.h"

namespace cxxopts {
class ParseResult;
}  // namespace cxxopts

namespace dptrain {

// What the user asked for on the command line, checked for range but not against the machine.
struct TrainCommand {
  TrainOptions options;
  std::optional<std::string> data_dir;
  std::optional<std::string> devices;  // --devices as given
  std::optional<int> gpus;             // --gpus N
  std::optional<std::string> backend;  // --backend as given; default depends on the devices
  // Installed by main() before anything runs (cpu_allocator.h).
  CpuAllocatorKind cpu_allocator = CpuAllocatorKind::kSystem;
  int64_t train_limit = 0;  // 0 = all
  // Training images (of those --train-limit leaves) held out as the validation set; 0 = none.
  int64_t val_split = 0;
  int64_t test_limit = 0;
  bool verbose = false;
  // Output (progress.h, and the metrics and plot files).
  bool quiet = false;      // only the final line
  int64_t log_every = 50;  // steps between plain progress lines when stderr is no terminal
  std::optional<std::string> metrics;  // .csv or .jsonl
  std::optional<std::string> plot;     // .svg
  // TensorBoard event files (report/tensorboard.h); their running loss every
  // options.loss_every steps (--tensorboard-every), which is 0 without them.
  std::optional<std::string> tensorboard;
};

// `dptrain eval`: the test accuracy and loss of saved weights. Shares the data, device and
// speed flags of train (in `train`); the weights come from exactly one of the two files.
struct EvalCommand {
  TrainCommand common;
  std::optional<std::string> checkpoint;  // a dptrain checkpoint (its width is in the file)
  std::optional<std::string> model;       // a --save-model file (also records its width)
  bool width_given = false;               // --width on the command line: checked against --model
  std::optional<std::string> logits;      // where to write the test images' logits (safetensors)
};

// `dptrain download`: the four Fashion-MNIST files into a directory.
struct DownloadCommand {
  std::string directory;
  std::optional<std::string> url;  // base URL; default the official mirror
  bool force = false;
  int64_t speed_limit = 10240;  // bytes/s: slower than this for speed_time seconds fails
  int64_t speed_time = 30;      // seconds
  int64_t max_time = 1800;      // seconds for the whole download
};

struct ParsedCommandLine {
  enum class Action { kTrain, kEval, kDownload, kHelp };
  Action action = Action::kHelp;
  std::string help;  // the text to print for kHelp
  TrainCommand train;
  EvalCommand eval;
  DownloadCommand download;
};

// Throws UsageError with a one-line message naming the flag and what is wrong.
ParsedCommandLine parse_command_line(int argc, const char* const argv[]);

// An argument as error messages show it: in quotes, and cut short when it is long.
std::string quote_argument(const std::string& text);
// The value of a flag as text: a UsageError for an empty one, or for the next flag taken as the
// value ("--momentum --nesterov": a missing value).
std::string flag_text(const cxxopts::ParseResult& result, const char* flag);

// Strict number parsing for flag values: the whole text must be a number in range.
int64_t parse_integer_flag(const std::string& flag, const std::string& text, int64_t min_value,
                           int64_t max_value);
// A positive number that float32 holds as a normal number (learning rates scale float32 weights:
// 1e39 would overflow, 1e-320 become 0).
double parse_positive_float_flag(const std::string& flag, const std::string& text);
// The text must be one of `choices`; returns it.
std::string parse_choice_flag(const std::string& flag, const std::string& text,
                              const std::vector<std::string>& choices);

}  // namespace dptrain
