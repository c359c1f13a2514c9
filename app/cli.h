// The dptrain command line: subcommands, flags, their checks and their help text. Parsing only:
// no device is touched and nothing runs, so every usage mistake is found before any work.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dptrain/train.h"

namespace dptrain {

// What the user asked for on the command line, checked for range but not against the machine.
struct TrainCommand {
  TrainOptions options;
  std::optional<std::string> data_dir;
  std::optional<std::string> devices;  // --devices as given
  std::optional<int> gpus;             // --gpus N
  std::optional<std::string> backend;  // --backend as given; default depends on the devices
  int64_t train_limit = 0;             // 0 = all
  int64_t test_limit = 0;
  bool verbose = false;
};

struct ParsedCommandLine {
  enum class Action { kTrain, kHelp };
  Action action = Action::kHelp;
  std::string help;  // the text to print for kHelp
  TrainCommand train;
};

// Throws UsageError with a one-line message naming the flag and what is wrong.
ParsedCommandLine parse_command_line(int argc, const char* const argv[]);

// Strict number parsing for flag values: the whole text must be a number in range.
int64_t parse_integer_flag(const std::string& flag, const std::string& text, int64_t min_value,
                           int64_t max_value);
double parse_positive_number_flag(const std::string& flag, const std::string& text);

}  // namespace dptrain
