// The dptrain command line, on cxxopts. See cli.h.
#include "cli.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cxxopts.hpp>
#include <limits>
#include <optional>

#include "dptrain/errors.h"

namespace dptrain {
namespace {

constexpr const char* kProgramHelp =
    "dptrain: data-parallel training of the book's ResNet-18 on Fashion-MNIST\n"
    "(Dive into Deep Learning, \"Training on Multiple GPUs\", concise version), on LibTorch.\n"
    "\n"
    "Usage: dptrain <command> [flags]\n"
    "\n"
    "Commands:\n"
    "  train     train the model and report test accuracy after every epoch\n"
    "  eval      report the test accuracy and loss of a checkpoint or saved model\n"
    "  download  fetch the four Fashion-MNIST files into a directory\n"
    "\n"
    "Run 'dptrain <command> --help' for the flags of a command.\n";

// Every value is taken as text and checked by us, for one-line errors that name the flag.
// One flag per entry reads better than what the formatter would make of the chains.
// clang-format off
void add_data_flags(cxxopts::Options& options) {
  options.add_options("Experiment")
      ("data-dir", "directory of the four Fashion-MNIST IDX files (default: $DPTRAIN_DATA, else "
                   "/usr/share/datasets/fashion-mnist, else ./data/fashion-mnist)",
       cxxopts::value<std::string>(), "DIR")
      ("batch-size", "global batch size, split over all replicas",
       cxxopts::value<std::string>()->default_value("256"), "N")
      ("width", "channels of the first ResNet stage (64 is the book's; 8 is a narrow CPU model)",
       cxxopts::value<std::string>()->default_value("64"), "N")
      ("test-limit", "use only the first N test examples", cxxopts::value<std::string>(), "N");
}

void add_training_flags(cxxopts::Options& options) {
  options.add_options("Experiment")
      ("epochs", "training epochs", cxxopts::value<std::string>()->default_value("10"), "N")
      ("lr", "SGD learning rate", cxxopts::value<std::string>()->default_value("0.1"), "LR")
      ("seed", "seed of the initial weights and the data order",
       cxxopts::value<std::string>()->default_value("0"), "N")
      ("train-limit", "use only the first N training examples", cxxopts::value<std::string>(), "N")
      ("max-steps", "stop after N steps in all (a short run for checks and benchmarks)",
       cxxopts::value<std::string>(), "N")
      ("on-nonfinite", "a step whose gradient is NaN or infinite: stop (with an error) or skip",
       cxxopts::value<std::string>()->default_value("stop"), "WHAT")
      ("save-model", "write the final weights to FILE (torch::save)",
       cxxopts::value<std::string>(), "FILE");
  options.add_options("Checkpoints")
      ("checkpoint-dir", "write a checkpoint into DIR after every --checkpoint-every epochs, "
                         "after the last, and on SIGINT or SIGTERM",
       cxxopts::value<std::string>(), "DIR")
      ("checkpoint-every", "epochs between checkpoints",
       cxxopts::value<std::string>()->default_value("1"), "N")
      ("resume", "continue from the newest valid checkpoint in --checkpoint-dir",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"));
}

void add_device_flags(cxxopts::Options& options) {
  options.add_options("Devices")
      ("devices", "comma list of devices, one replica each: cpu, cuda:0, ... (default: the "
                  "first GPU, else cpu)",
       cxxopts::value<std::string>(), "LIST")
      ("gpus", "shorthand for --devices cuda:0,...,cuda:N-1", cxxopts::value<std::string>(), "N")
      ("threads", "intra-op CPU threads for the process, shared by its replicas (default: all "
                  "cores)",
       cxxopts::value<std::string>(), "N");
  options.add_options("Data parallelism")
      ("backend", "collective backend: nccl or gloo (default: nccl on CUDA, gloo on cpu)",
       cxxopts::value<std::string>(), "NAME")
      ("timeout", "seconds that the rendezvous and each collective may take",
       cxxopts::value<std::string>()->default_value("300"), "SECONDS");
  options.add_options("Speed")
      ("memory-format", "layout of weights and activations: auto (channels-last on CUDA, "
                        "contiguous on the CPU), channels-last or contiguous",
       cxxopts::value<std::string>()->default_value("auto"), "NAME")
      ("amp", "autocast the forward pass: off or bf16",
       cxxopts::value<std::string>()->default_value("off"), "MODE")
      ("cudnn-benchmark", "let cuDNN pick the fastest algorithm per shape: on or off",
       cxxopts::value<std::string>()->default_value("on"), "ON|OFF");
}

void add_parallel_training_flags(cxxopts::Options& options) {
  options.add_options("Data parallelism")
      ("sync-bn", "all-reduce BatchNorm batch statistics over the replicas",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
      ("bucket-mb", "gradient bucket size in MiB",
       cxxopts::value<std::string>()->default_value("25"), "MIB")
      ("check-replicas", "verify every N steps that all replicas hold the same weights",
       cxxopts::value<std::string>(), "N");
}

void add_output_flags(cxxopts::Options& options, bool training) {
  if (training) {
    options.add_options("Output")
        ("quiet", "print only the final line",
         cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
        ("log-every", "steps between progress lines when stderr is not a terminal (on a "
                      "terminal a live bar is drawn)",
         cxxopts::value<std::string>()->default_value("50"), "N")
        ("metrics", "write one record per epoch to FILE: .csv or .jsonl",
         cxxopts::value<std::string>(), "FILE")
        ("plot", "draw test accuracy, train loss and train accuracy per epoch into FILE.svg",
         cxxopts::value<std::string>(), "FILE");
  }
  options.add_options("Output")
      ("verbose", "with several processes, every rank prints (default: rank 0 only)",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
      ("h,help", "print this help");
}

cxxopts::Options train_options() {
  cxxopts::Options options("dptrain train",
                           "Train the book's ResNet-18 on Fashion-MNIST, data-parallel over the "
                           "given devices.\nEach global batch is split evenly over one replica "
                           "per device; our own reducer all-reduces the gradients.\nUnder "
                           "torchrun or srun, each process is one rank on device LOCAL_RANK.\n");
  add_data_flags(options);
  add_training_flags(options);
  add_device_flags(options);
  add_parallel_training_flags(options);
  add_output_flags(options, /*training=*/true);
  return options;
}

cxxopts::Options eval_options() {
  cxxopts::Options options("dptrain eval",
                           "Report the test accuracy and loss of saved weights, on the same "
                           "devices and replicas as train.\n");
  options.add_options("Weights")
      ("checkpoint", "a checkpoint written by train --checkpoint-dir (its width is in the file)",
       cxxopts::value<std::string>(), "FILE")
      ("model", "a file written by train --save-model (give its --width)",
       cxxopts::value<std::string>(), "FILE");
  add_data_flags(options);
  add_device_flags(options);
  add_output_flags(options, /*training=*/false);
  return options;
}

cxxopts::Options download_options() {
  cxxopts::Options options("dptrain download",
                           "Fetch the four Fashion-MNIST files, check their SHA-256 and put them "
                           "into a directory.\nNot needed where Debian's dataset-fashion-mnist is "
                           "installed.\n");
  options.add_options("Download")
      ("data-dir", "where to put the files (default: $DPTRAIN_DATA, else data/fashion-mnist)",
       cxxopts::value<std::string>(), "DIR")
      ("url", "base URL of the files (http, https or file)", cxxopts::value<std::string>(),
       "URL")
      ("force", "fetch again even files that are present and correct",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
      ("h,help", "print this help");
  return options;
}
// clang-format on

const std::vector<std::string> kTrainGroups{"Experiment",       "Checkpoints", "Devices",
                                            "Data parallelism", "Speed",       "Output"};
const std::vector<std::string> kEvalGroups{"Weights",          "Experiment", "Devices",
                                           "Data parallelism", "Speed",      "Output"};

// Parses argv[1:] ("<command> flags...") with `options`; nullopt means help was asked for.
std::optional<cxxopts::ParseResult> parse_flags(cxxopts::Options& options, int argc,
                                                const char* const argv[],
                                                const std::string& command) {
  cxxopts::ParseResult result;
  try {
    // cxxopts wants argv[0] first; it sees the command as the program name.
    result = options.parse(argc - 1, argv + 1);
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(std::string(e.what()) + "; run 'dptrain " + command + " --help'");
  }
  if (!result.unmatched().empty()) {
    throw UsageError("unexpected argument '" + result.unmatched().front() + "'; run 'dptrain " +
                     command + " --help'");
  }
  if (result.count("help")) return std::nullopt;
  return result;
}

// The value of a flag as text; cxxopts takes whatever follows a flag as its value, even the
// next flag.
std::string flag_text(const cxxopts::ParseResult& result, const char* flag) {
  auto value = result[flag].as<std::string>();
  if (!value.empty() && value[0] == '-' && value.size() > 1 && value[1] == '-') {
    throw UsageError(std::string("--") + flag + ": missing value (got '" + value + "')");
  }
  return value;
}

constexpr int64_t kMax = std::numeric_limits<int32_t>::max();

// The flags train and eval share: data, devices, collectives and speed.
void read_common_flags(const cxxopts::ParseResult& result, TrainCommand& train) {
  const auto text = [&](const char* flag) { return flag_text(result, flag); };
  TrainOptions& o = train.options;
  o.batch_size = parse_integer_flag("batch-size", text("batch-size"), 1, kMax);
  o.width = parse_integer_flag("width", text("width"), 1, 4096);
  o.timeout = std::chrono::seconds(parse_integer_flag("timeout", text("timeout"), 1, 86400 * 7));
  if (result.count("threads")) o.threads = parse_integer_flag("threads", text("threads"), 1, 4096);
  const auto layout = parse_choice_flag("memory-format", text("memory-format"),
                                        {"auto", "channels-last", "contiguous"});
  o.memory_format = layout == "channels-last" ? MemoryFormat::kChannelsLast
                    : layout == "contiguous"  ? MemoryFormat::kContiguous
                                              : MemoryFormat::kAuto;
  o.amp =
      parse_choice_flag("amp", text("amp"), {"off", "bf16"}) == "bf16" ? Amp::kBFloat16 : Amp::kOff;
  o.cudnn_benchmark =
      parse_choice_flag("cudnn-benchmark", text("cudnn-benchmark"), {"on", "off"}) == "on";
  if (result.count("test-limit")) {
    train.test_limit = parse_integer_flag("test-limit", text("test-limit"), 1, kMax);
  }
  if (result.count("data-dir")) train.data_dir = text("data-dir");
  if (result.count("devices") && result.count("gpus")) {
    throw UsageError("--devices and --gpus both name the devices; give one of them");
  }
  if (result.count("devices")) train.devices = text("devices");
  if (result.count("gpus"))
    train.gpus = static_cast<int>(parse_integer_flag("gpus", text("gpus"), 1, 1024));
  if (result.count("backend")) {
    train.backend = parse_choice_flag("backend", text("backend"), {"nccl", "gloo"});
  }
  train.verbose = result["verbose"].as<bool>();
}

std::string non_empty_path(const cxxopts::ParseResult& result, const char* flag) {
  auto path = flag_text(result, flag);
  if (path.empty()) throw UsageError(std::string("--") + flag + ": empty file name");
  return path;
}

}  // namespace

int64_t parse_integer_flag(const std::string& flag, const std::string& text, int64_t min_value,
                           int64_t max_value) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  // strtoll skips leading blanks; the whole text must be the number.
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ||
      end != text.c_str() + text.size() || errno == ERANGE) {
    throw UsageError("--" + flag + ": '" + text + "' is not an integer");
  }
  if (value < min_value || value > max_value) {
    throw UsageError("--" + flag + ": " + text + " is out of range; expected " +
                     std::to_string(min_value) + " to " + std::to_string(max_value));
  }
  return value;
}

double parse_positive_number_flag(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ||
      end != text.c_str() + text.size()) {
    throw UsageError("--" + flag + ": '" + text + "' is not a number");
  }
  if (!std::isfinite(value) || value <= 0) {
    throw UsageError("--" + flag + ": " + text + " must be a finite number above 0");
  }
  return value;
}

std::string parse_choice_flag(const std::string& flag, const std::string& text,
                              const std::vector<std::string>& choices) {
  for (const auto& choice : choices) {
    if (text == choice) return text;
  }
  std::string expected;
  for (size_t i = 0; i < choices.size(); ++i) {
    expected += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  }
  throw UsageError("--" + flag + ": '" + text + "' is not one of " + expected);
}

ParsedCommandLine parse_command_line(int argc, const char* const argv[]) {
  ParsedCommandLine parsed;
  if (argc < 2) {
    parsed.help = kProgramHelp;
    return parsed;
  }
  const std::string command = argv[1];
  if (command == "-h" || command == "--help" || command == "help") {
    parsed.help = kProgramHelp;
    return parsed;
  }

  // cxxopts matches every argument against a std::regex, and libstdc++'s matcher recurses once
  // per character: an argument of some 50000 characters overflowed the stack. No path or device
  // list needs anywhere near this.
  constexpr size_t kMaxArgumentLength = 8192;
  for (int i = 2; i < argc; ++i) {
    const size_t length = std::strlen(argv[i]);
    if (length > kMaxArgumentLength) {
      throw UsageError("argument " + std::to_string(i) + " ('" + std::string(argv[i], 24) +
                       "...') is " + std::to_string(length) + " characters long; at most " +
                       std::to_string(kMaxArgumentLength) + " are accepted");
    }
  }

  if (command == "train") {
    auto options = train_options();
    const auto result = parse_flags(options, argc, argv, command);
    if (!result) {
      parsed.help = options.help(kTrainGroups);
      return parsed;
    }
    const auto text = [&](const char* flag) { return flag_text(*result, flag); };
    TrainCommand& train = parsed.train;
    read_common_flags(*result, train);
    TrainOptions& o = train.options;
    o.epochs = parse_integer_flag("epochs", text("epochs"), 1, 1000000);
    o.lr = parse_positive_number_flag("lr", text("lr"));
    o.seed = static_cast<uint64_t>(
        parse_integer_flag("seed", text("seed"), 0, std::numeric_limits<int64_t>::max()));
    o.bucket_bytes = parse_integer_flag("bucket-mb", text("bucket-mb"), 1, 65536) * 1024 * 1024;
    o.sync_bn = (*result)["sync-bn"].as<bool>();
    o.on_nonfinite =
        parse_choice_flag("on-nonfinite", text("on-nonfinite"), {"stop", "skip"}) == "skip"
            ? NonFinite::kSkip
            : NonFinite::kStop;
    if (result->count("check-replicas")) {
      o.check_replicas_every =
          parse_integer_flag("check-replicas", text("check-replicas"), 1, kMax);
    }
    if (result->count("max-steps"))
      o.max_steps = parse_integer_flag("max-steps", text("max-steps"), 1, kMax);
    if (result->count("save-model")) o.save_model = non_empty_path(*result, "save-model");
    if (result->count("train-limit")) {
      train.train_limit = parse_integer_flag("train-limit", text("train-limit"), 1, kMax);
    }
    if (result->count("checkpoint-dir"))
      o.checkpoint_dir = non_empty_path(*result, "checkpoint-dir");
    o.checkpoint_every = parse_integer_flag("checkpoint-every", text("checkpoint-every"), 1, kMax);
    o.resume = (*result)["resume"].as<bool>();
    if (o.resume && !o.checkpoint_dir) {
      throw UsageError("--resume needs --checkpoint-dir, where the checkpoints are");
    }
    train.quiet = (*result)["quiet"].as<bool>();
    train.log_every = parse_integer_flag("log-every", text("log-every"), 1, kMax);
    if (result->count("metrics")) train.metrics = non_empty_path(*result, "metrics");
    if (result->count("plot")) train.plot = non_empty_path(*result, "plot");
    parsed.action = ParsedCommandLine::Action::kTrain;
    return parsed;
  }

  if (command == "eval") {
    auto options = eval_options();
    const auto result = parse_flags(options, argc, argv, command);
    if (!result) {
      parsed.help = options.help(kEvalGroups);
      return parsed;
    }
    EvalCommand& eval = parsed.eval;
    read_common_flags(*result, eval.common);
    if (result->count("checkpoint")) eval.checkpoint = non_empty_path(*result, "checkpoint");
    if (result->count("model")) eval.model = non_empty_path(*result, "model");
    if (eval.checkpoint.has_value() == eval.model.has_value()) {
      throw UsageError("eval needs exactly one of --checkpoint FILE and --model FILE");
    }
    if (eval.checkpoint && result->count("width")) {
      throw UsageError("--width: a checkpoint records its width; give --width only with --model");
    }
    parsed.action = ParsedCommandLine::Action::kEval;
    return parsed;
  }

  if (command == "download") {
    auto options = download_options();
    const auto result = parse_flags(options, argc, argv, command);
    if (!result) {
      parsed.help = options.help({"Download"});
      return parsed;
    }
    DownloadCommand& download = parsed.download;
    if (result->count("data-dir")) {
      download.directory = non_empty_path(*result, "data-dir");
    } else {
      const char* from_environment = std::getenv("DPTRAIN_DATA");
      download.directory =
          from_environment && *from_environment ? from_environment : "data/fashion-mnist";
    }
    if (result->count("url")) download.url = non_empty_path(*result, "url");
    download.force = (*result)["force"].as<bool>();
    parsed.action = ParsedCommandLine::Action::kDownload;
    return parsed;
  }

  throw UsageError("unknown command '" + command + "'; run 'dptrain --help'");
}

}  // namespace dptrain
