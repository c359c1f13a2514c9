// The dptrain command line, on cxxopts. See cli.h.
#include "cli.h"

#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cxxopts.hpp>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/core/cpu_allocator.h"
#include "dptrain/core/errors.h"
#include "dptrain/core/peak_tflops.h"
#include "dptrain/model/autocast.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/train/options.h"
#include "recipe_flags.h"

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
      ("val-split", "hold N training images out as a validation set (the same N for every seed "
                    "and world size), evaluated after every epoch like the test set",
       cxxopts::value<std::string>()->default_value("0"), "N")
      ("max-steps", "stop after N steps in all (a short run for checks and benchmarks)",
       cxxopts::value<std::string>(), "N")
      ("on-nonfinite", "a step whose gradient is NaN or infinite: stop (with an error) or skip",
       cxxopts::value<std::string>()->default_value("stop"), "WHAT")
      ("save-model", "write the final weights to FILE.safetensors (PyTorch loads it with "
                     "safetensors.torch.load_file; the run's facts are in its metadata)",
       cxxopts::value<std::string>(), "FILE");
  options.add_options("Checkpoints")
      ("checkpoint-dir", "write a checkpoint into DIR after every --checkpoint-every epochs, "
                         "after the last, and on SIGINT or SIGTERM",
       cxxopts::value<std::string>(), "DIR")
      ("checkpoint-every", "epochs between checkpoints",
       cxxopts::value<std::string>()->default_value("1"), "N")
      ("checkpoint-every-steps", "also write a checkpoint inside an epoch after every N steps "
                                 "(counted over the whole run)",
       cxxopts::value<std::string>(), "N")
      ("resume", "continue from the checkpoint in --checkpoint-dir at the latest position "
                 "(an empty directory starts from the beginning)",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
      ("fresh", "start from the beginning in a --checkpoint-dir that holds checkpoints, "
                "removing them first",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"));
}

void add_device_flags(cxxopts::Options& options) {
  options.add_options("Devices")
      ("devices", "comma list of devices, one replica each: cpu, cuda:0, ... (default: the "
                  "first GPU, else cpu)",
       cxxopts::value<std::string>(), "LIST")
      ("gpus", "shorthand for --devices cuda:0,...,cuda:N-1", cxxopts::value<std::string>(), "N")
      ("threads", "intra-op CPU threads for the process, shared by its replicas; at most the "
                  "CPU cores it may use (default: $OMP_NUM_THREADS, else one per physical core "
                  "within the CPU quota, divided among the ranks on this host; the first line "
                  "says)",
       cxxopts::value<std::string>(), "N");
  options.add_options("Data parallelism")
      ("backend", "collective backend: nccl or gloo (default: nccl on CUDA, gloo on cpu)",
       cxxopts::value<std::string>(), "NAME")
      ("timeout", "seconds that the rendezvous and each collective may take",
       cxxopts::value<std::string>()->default_value("300"), "SECONDS");
  options.add_options("Speed")
      ("memory-format", "layout of weights and activations: auto (channels-last on CUDA and "
                        "on CPUs with AVX-512, else contiguous), channels-last or contiguous",
       cxxopts::value<std::string>()->default_value("auto"), "NAME")
      ("amp", "autocast the forward pass: off or bf16",
       cxxopts::value<std::string>()->default_value("off"), "MODE")
      ("conv-bias-grad", "the gradient of a convolution's bias that feeds a BatchNorm: library "
                         "(oneDNN's or cuDNN's, as PyTorch's) or fused (summed in the fused "
                         "BatchNorm's backward, where it runs: training on the CPU, "
                         "channels-last, without --sync-bn)",
       cxxopts::value<std::string>()->default_value("library"), "NAME")
      ("cudnn-benchmark", "let cuDNN pick the fastest algorithm per shape: on or off",
       cxxopts::value<std::string>()->default_value("on"), "ON|OFF")
      ("cpu-allocator", "CPU tensor memory: system (LibTorch's, over the tcmalloc linked into "
                        "dptrain) or guarded (stops at out-of-bounds writes; slow)",
       cxxopts::value<std::string>()->default_value("system"), "NAME");
}

void add_parallel_training_flags(cxxopts::Options& options) {
  options.add_options("Data parallelism")
      ("sync-bn", "all-reduce BatchNorm batch statistics over the replicas",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
      ("bucket-mb", "gradient bucket size in MiB",
       cxxopts::value<std::string>()->default_value("25"), "MIB")
      ("check-replicas", "verify every N steps that all replicas hold the same weights",
       cxxopts::value<std::string>(), "N");
  options.add_options("Speed")
      ("cuda-graph", "capture each full batch's whole step in a CUDA graph after a few eager "
                     "steps, then replay it (CUDA only, one GPU per process, not with gloo)",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
      ("peak-tflops", "one device's dense peak TFLOP/s at the run's precision, for the MFU of "
                      "each epoch (default: NVIDIA's figure for known data-centre GPUs; none "
                      "on CPUs)",
       cxxopts::value<std::string>(), "X");
}

void add_output_flags(cxxopts::Options& options, bool training) {
  if (training) {
    options.add_options("Output")
        ("quiet", "print only the final line",
         cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
        ("log-every", "steps between progress lines when stderr is not a terminal (on a "
                      "terminal a live bar is drawn)",
         cxxopts::value<std::string>()->default_value("50"), "N")
        ("metrics", "write one record per epoch to FILE: .csv or .jsonl (should a write "
                    "fail, one error line, and the run goes on without it, keeping its "
                    "checkpoints and --save-model, and exits 1)",
         cxxopts::value<std::string>(), "FILE")
        ("plot", "draw test accuracy, train loss and train accuracy per epoch into FILE.svg "
                 "(a failed write: as for --metrics)",
         cxxopts::value<std::string>(), "FILE")
        ("tensorboard", "write TensorBoard event files into a folder per run in DIR, "
                        "DIR/run-N (DIR made if missing; a resume continues its run's folder; "
                        "view with tensorboard --logdir=DIR): each epoch's figures, the running "
                        "training loss, the settings",
         cxxopts::value<std::string>(), "DIR")
        ("tensorboard-every", "steps between the points of the running training loss in "
                              "--tensorboard (default 25, as often as a GPU run's host checks)",
         cxxopts::value<std::string>(), "N");
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
  add_recipe_flags(options);
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
      ("model", "a file written by train --save-model, or any safetensors file of the model's "
                "tensors under their PyTorch names (its width is read from the file; a --width "
                "given must match it)",
       cxxopts::value<std::string>(), "FILE")
      ("logits", "also write the test images' logits and labels, in order, to "
                 "FILE.safetensors (tensors \"logits\" (N, 10) and \"labels\" (N))",
       cxxopts::value<std::string>(), "FILE");
  add_data_flags(options);
  add_device_flags(options);
  add_output_flags(options, /*training=*/false);
  return options;
}

cxxopts::Options download_options() {
  cxxopts::Options options("dptrain download",
                           "Fetch the four Fashion-MNIST files, check their SHA-256 and put them "
                           "into a directory, one download per directory at a time.\nNot needed "
                           "where Debian's dataset-fashion-mnist is installed.\n");
  options.add_options("Download")
      ("data-dir", "where to put the files (default: $DPTRAIN_DATA, else data/fashion-mnist)",
       cxxopts::value<std::string>(), "DIR")
      ("url", "base URL of the files (http, https or file)", cxxopts::value<std::string>(),
       "URL")
      ("force", "fetch again even files that are present and correct",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
      ("speed-limit", "abandon an attempt that receives fewer than this many bytes per second "
                      "over --speed-time",
       cxxopts::value<std::string>()->default_value("10240"), "BYTES")
      ("speed-time", "seconds over which --speed-limit is measured",
       cxxopts::value<std::string>()->default_value("30"), "SECONDS")
      ("max-time", "seconds the whole download (every file, retry and local read) may take",
       cxxopts::value<std::string>()->default_value("1800"), "SECONDS")
      ("h,help", "print this help");
  return options;
}
// clang-format on

const std::vector<std::string> kTrainGroups{"Experiment",       "Recipe", "Checkpoints", "Devices",
                                            "Data parallelism", "Speed",  "Output"};
const std::vector<std::string> kEvalGroups{"Weights",          "Experiment", "Devices",
                                           "Data parallelism", "Speed",      "Output"};

// Note [No argument reaches cxxopts' regex]
// cxxopts matches every argument it looks at as a flag against a std::regex, and libstdc++'s
// matcher recurses once per character: 4,000 characters of "--data-dir=..." overflowed a 1 MiB
// stack, 50,000 an 8 MiB one. So we read the arguments ourselves first, in a plain loop: every
// flag name must be one of the command's (checked here, so an unknown one of any length is
// refused without a regex), and a value, whether given as "--flag=value" or as the next
// argument, is handed to cxxopts as a separate argument after "--flag", which cxxopts takes as
// the value without matching it. What cxxopts then matches are only our own short flag names
// and the short values of switches ("--sync-bn=false"), checked here too.

// Every flag of `options`, by name without dashes ("data-dir", "h"): whether it needs a value
// (a switch has an implicit one).
std::map<std::string, bool> flags_of(const cxxopts::Options& options) {
  std::map<std::string, bool> flags;
  for (const auto& group : options.groups()) {
    for (const auto& option : options.group_help(group).options) {
      for (const auto& name : option.l) flags[name] = !option.has_implicit;
      if (!option.s.empty()) flags[option.s] = !option.has_implicit;
    }
  }
  return flags;
}

// The spellings of a switch's value that cxxopts reads as true or false.
bool is_switch_value(const std::string& value) {
  for (const char* text : {"true", "True", "t", "T", "1", "false", "False", "f", "F", "0"}) {
    if (value == text) return true;
  }
  return false;
}

// argv[2:] rewritten as Note [No argument reaches cxxopts' regex] says, after the command name
// (cxxopts takes its first argument for the program's name).
std::vector<std::string> checked_arguments(const cxxopts::Options& options, int argc,
                                           const char* const argv[], const std::string& command) {
  const auto flags = flags_of(options);
  const std::string see_help = "; run 'dptrain " + command + " --help'";
  std::vector<std::string> out{command};
  for (int i = 2; i < argc; ++i) {
    const std::string argument = argv[i];
    const bool is_long = argument.rfind("--", 0) == 0 && argument.size() > 2;
    const bool is_short = !is_long && argument.size() > 1 && argument[0] == '-';
    if (!is_long && !is_short) {
      throw UsageError("unexpected argument " + quote_argument(argument) + see_help);
    }
    const size_t equals = is_long ? argument.find('=') : std::string::npos;
    const std::string name = argument.substr(
        is_long ? 2 : 1, equals == std::string::npos ? std::string::npos : equals - 2);
    const auto flag = flags.find(name);
    if (flag == flags.end() || (is_long && name.size() < 2) || (is_short && name.size() != 1)) {
      throw UsageError(
          "unknown flag " +
          quote_argument(equals == std::string::npos ? argument : argument.substr(0, equals)) +
          see_help);
    }
    const std::string spelled = (is_long ? "--" : "-") + name;
    const bool needs_value = flag->second;
    if (equals == std::string::npos && spelled == "--recipe" && i + 1 < argc) {
      for (auto& preset_argument : recipe_preset_arguments(argv[++i])) {
        out.push_back(preset_argument);
      }
      continue;
    }
    if (equals == std::string::npos) {
      out.push_back(spelled);
      // The next argument is the value, whatever it looks like (flag_text refuses "--x").
      if (needs_value && i + 1 < argc) out.emplace_back(argv[++i]);
      continue;
    }
    const std::string value = argument.substr(equals + 1);
    if (spelled == "--recipe") {  // Note [A preset is the flags it stands for]
      for (auto& preset_argument : recipe_preset_arguments(value)) out.push_back(preset_argument);
      continue;
    }
    if (needs_value) {
      out.push_back(spelled);
      out.push_back(value);
    } else if (is_switch_value(value)) {
      out.push_back(spelled + "=" + value);
    } else {
      throw UsageError(spelled + ": " + quote_argument(value) + " is not true or false");
    }
  }
  return out;
}

// Parses argv[2:] with `options`; nullopt means help was asked for.
std::optional<cxxopts::ParseResult> parse_flags(cxxopts::Options& options, int argc,
                                                const char* const argv[],
                                                const std::string& command) {
  const auto arguments = checked_arguments(options, argc, argv, command);
  std::vector<const char*> pointers;
  for (const auto& argument : arguments) pointers.push_back(argument.c_str());
  cxxopts::ParseResult result;
  try {
    result = options.parse(static_cast<int>(pointers.size()), pointers.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(std::string(e.what()) + "; run 'dptrain " + command + " --help'");
  }
  if (!result.unmatched().empty()) {  // checked_arguments lets none through; kept as a guard
    throw UsageError("unexpected argument " + quote_argument(result.unmatched().front()) +
                     "; run 'dptrain " + command + " --help'");
  }
  if (result.count("help")) return std::nullopt;
  return result;
}

// A path: the system refuses longer ones (ENAMETOOLONG) anyway, with a less clear message.
std::string path_text(const cxxopts::ParseResult& result, const char* flag) {
  auto path = flag_text(result, flag);
  if (path.size() >= PATH_MAX) {
    throw UsageError(std::string("--") + flag + ": " + quote_argument(path) +
                     " is longer than the system allows for a path (" +
                     std::to_string(PATH_MAX - 1) + " characters)");
  }
  return path;
}

// A file written as safetensors must be named so: "model.pt" would send users to torch.load,
// which cannot read it.
void check_safetensors_name(const std::string& path, const char* flag) {
  const std::string suffix = ".safetensors";
  const size_t slash = path.rfind('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.size() <= suffix.size() ||
      base.compare(base.size() - suffix.size(), suffix.size(), suffix) != 0) {
    throw UsageError(std::string(flag) + " " + quote_argument(path) +
                     ": the file is written as safetensors, so its name must end in "
                     ".safetensors (PyTorch reads it with safetensors.torch.load_file, not "
                     "torch.load)");
  }
}

constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
// --tensorboard-every's default: a GPU run reads the device on the host every 25 steps anyway
// (RankTraining::end_step), so the running loss's read adds no wait there; on the CPU, which
// reads every step, it costs nothing either way. 25 also draws some 9 points per epoch of the
// default 235 steps.
constexpr int64_t kDefaultTensorBoardEvery = 25;

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
  o.fused_conv_bias_grad =
      parse_choice_flag("conv-bias-grad", text("conv-bias-grad"), {"library", "fused"}) == "fused";
  o.cudnn_benchmark =
      parse_choice_flag("cudnn-benchmark", text("cudnn-benchmark"), {"on", "off"}) == "on";
  train.cpu_allocator = parse_cpu_allocator(text("cpu-allocator"));
  if (result.count("test-limit")) {
    train.test_limit = parse_integer_flag("test-limit", text("test-limit"), 1, kMax);
  }
  if (result.count("data-dir")) train.data_dir = path_text(result, "data-dir");
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

}  // namespace

// An argument as error messages show it: in quotes, and cut short when it is long (a value may
// be as long as the system allows, some 128 KiB).
std::string quote_argument(const std::string& text) {
  constexpr size_t kShown = 40;
  if (text.size() <= kShown + 20) return "'" + text + "'";
  return "'" + text.substr(0, kShown) + "...' (" + std::to_string(text.size()) + " characters)";
}

// The value of a flag as text. cxxopts takes whatever follows a flag as its value, even the
// next flag; and no flag of ours has a meaning for the empty text.
std::string flag_text(const cxxopts::ParseResult& result, const char* flag) {
  auto value = result[flag].as<std::string>();
  if (value.rfind("--", 0) == 0 && value.size() > 2) {
    throw UsageError(std::string("--") + flag + ": missing value (got " + quote_argument(value) +
                     ")");
  }
  if (value.empty()) throw UsageError(std::string("--") + flag + ": empty value");
  return value;
}

int64_t parse_integer_flag(const std::string& flag, const std::string& text, int64_t min_value,
                           int64_t max_value) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  // strtoll skips leading blanks; the whole text must be the number.
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ||
      end != text.c_str() + text.size() || errno == ERANGE) {
    throw UsageError("--" + flag + ": " + quote_argument(text) + " is not an integer");
  }
  if (value < min_value || value > max_value) {
    throw UsageError("--" + flag + ": " + quote_argument(text) + " is out of range; expected " +
                     std::to_string(min_value) + " to " + std::to_string(max_value));
  }
  return value;
}

double parse_positive_float_flag(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ||
      end != text.c_str() + text.size()) {
    throw UsageError("--" + flag + ": " + quote_argument(text) + " is not a number");
  }
  // strtod's ERANGE is not consulted: the range below is narrower than a double's.
  if (!std::isfinite(value) || value <= 0) {
    throw UsageError("--" + flag + ": " + quote_argument(text) +
                     " must be a finite number above 0");
  }
  constexpr double kSmallest = std::numeric_limits<float>::min();  // 1.17549e-38
  constexpr double kLargest = std::numeric_limits<float>::max();   // 3.40282e+38
  if (value < kSmallest || value > kLargest) {
    throw UsageError("--" + flag + ": " + quote_argument(text) +
                     " is outside what a float32 holds (normal numbers from 1.2e-38 to 3.4e+38); "
                     "the value is applied to float32 weights");
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
  throw UsageError("--" + flag + ": " + quote_argument(text) + " is not one of " + expected);
}

namespace {

// --peak-tflops: a positive, finite number of TFLOP/s that some device can have (Note [A
// plausible device's peak] in core/peak_tflops.h).
double parse_peak_tflops(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ||
      end != text.c_str() + text.size() || !std::isfinite(value) || value <= 0) {
    throw UsageError("--peak-tflops: " + quote_argument(text) +
                     " is not a finite number above 0 (one device's peak in TFLOP/s)");
  }
  if (value < kMinPeakTflops || value > kMaxPeakTflops) {
    throw UsageError("--peak-tflops: " + quote_argument(text) +
                     " is no device's peak; expected 1e-06 (1 MFLOP/s, below any CPU core) to "
                     "100000 (100 PFLOP/s, far above any GPU today) TFLOP/s");
  }
  return value;
}

// The train command's own flags, after the common ones.
void read_train_flags(const cxxopts::ParseResult& result, TrainCommand& train) {
  const auto text = [&](const char* flag) { return flag_text(result, flag); };
  read_common_flags(result, train);
  TrainOptions& o = train.options;
  o.epochs = parse_integer_flag("epochs", text("epochs"), 1, 1000000);
  o.lr = parse_positive_float_flag("lr", text("lr"));
  o.seed = static_cast<uint64_t>(
      parse_integer_flag("seed", text("seed"), 0, std::numeric_limits<int64_t>::max()));
  o.bucket_bytes = parse_integer_flag("bucket-mb", text("bucket-mb"), 1, 65536) * 1024 * 1024;
  o.sync_bn = result["sync-bn"].as<bool>();
  o.cuda_graph = result["cuda-graph"].as<bool>();
  if (result.count("peak-tflops")) o.peak_tflops = parse_peak_tflops(text("peak-tflops"));
  o.recipe = read_recipe_flags(result);
  o.on_nonfinite =
      parse_choice_flag("on-nonfinite", text("on-nonfinite"), {"stop", "skip"}) == "skip"
          ? NonFinite::kSkip
          : NonFinite::kStop;
  if (result.count("check-replicas")) {
    o.check_replicas_every = parse_integer_flag("check-replicas", text("check-replicas"), 1, kMax);
  }
  if (result.count("max-steps")) {
    o.max_steps = parse_integer_flag("max-steps", text("max-steps"), 1, kMax);
  }
  if (result.count("save-model")) {
    o.save_model = path_text(result, "save-model");
    check_safetensors_name(*o.save_model, "--save-model");
  }
  if (result.count("train-limit")) {
    train.train_limit = parse_integer_flag("train-limit", text("train-limit"), 1, kMax);
  }
  train.val_split = parse_integer_flag("val-split", text("val-split"), 0, kMax);
  if (result.count("checkpoint-dir")) o.checkpoint_dir = path_text(result, "checkpoint-dir");
  o.checkpoint_every = parse_integer_flag("checkpoint-every", text("checkpoint-every"), 1, kMax);
  if (result.count("checkpoint-every-steps")) {
    o.checkpoint_every_steps =
        parse_integer_flag("checkpoint-every-steps", text("checkpoint-every-steps"), 1, kMax);
  }
  o.resume = result["resume"].as<bool>();
  o.fresh = result["fresh"].as<bool>();
  train.quiet = result["quiet"].as<bool>();
  train.log_every = parse_integer_flag("log-every", text("log-every"), 1, kMax);
  if (result.count("metrics")) train.metrics = path_text(result, "metrics");
  if (result.count("plot")) train.plot = path_text(result, "plot");
  if (result.count("tensorboard")) {
    train.tensorboard = path_text(result, "tensorboard");
    o.loss_every = kDefaultTensorBoardEvery;
  }
  if (result.count("tensorboard-every")) {
    const int64_t every =
        parse_integer_flag("tensorboard-every", text("tensorboard-every"), 1, kMax);
    if (!train.tensorboard) {
      throw UsageError("--tensorboard-every: only with --tensorboard DIR, whose running loss it "
                       "spaces");
    }
    o.loss_every = every;
  }
}

void read_eval_flags(const cxxopts::ParseResult& result, EvalCommand& eval) {
  read_common_flags(result, eval.common);
  if (result.count("checkpoint")) eval.checkpoint = path_text(result, "checkpoint");
  if (result.count("model")) eval.model = path_text(result, "model");
  if (result.count("logits")) {
    eval.logits = path_text(result, "logits");
    check_safetensors_name(*eval.logits, "--logits");
  }
  if (eval.checkpoint.has_value() == eval.model.has_value()) {
    throw UsageError("eval needs exactly one of --checkpoint FILE and --model FILE");
  }
  if (eval.checkpoint && result.count("width")) {
    throw UsageError("--width: a checkpoint records its width; give --width only with --model");
  }
  eval.width_given = result.count("width") > 0;
}

void read_download_flags(const cxxopts::ParseResult& result, DownloadCommand& download) {
  if (result.count("data-dir")) {
    download.directory = path_text(result, "data-dir");
  } else {
    const char* from_environment = std::getenv("DPTRAIN_DATA");
    download.directory =
        from_environment && *from_environment ? from_environment : "data/fashion-mnist";
  }
  if (result.count("url")) download.url = flag_text(result, "url");
  download.force = result["force"].as<bool>();
  const auto text = [&](const char* flag) { return flag_text(result, flag); };
  download.speed_limit = parse_integer_flag("speed-limit", text("speed-limit"), 1, kMax);
  download.speed_time = parse_integer_flag("speed-time", text("speed-time"), 1, 86400);
  download.max_time = parse_integer_flag("max-time", text("max-time"), 1, 86400 * 7);
}

}  // namespace

ParsedCommandLine parse_command_line(int argc, const char* const argv[]) {
  ParsedCommandLine parsed;
  const std::string command = argc < 2 ? "help" : argv[1];
  if (command == "-h" || command == "--help" || command == "help") {
    parsed.help = kProgramHelp;
    return parsed;
  }
  // Each command: its flags (the help when asked for), then what they say.
  if (command == "train") {
    auto options = train_options();
    const auto result = parse_flags(options, argc, argv, command);
    if (!result) {
      parsed.help = options.help(kTrainGroups);
      return parsed;
    }
    read_train_flags(*result, parsed.train);
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
    read_eval_flags(*result, parsed.eval);
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
    read_download_flags(*result, parsed.download);
    parsed.action = ParsedCommandLine::Action::kDownload;
    return parsed;
  }
  throw UsageError("unknown command '" + command + "'; run 'dptrain --help'");
}

}  // namespace dptrain
