// The dptrain command line, on cxxopts. See cli.h.
#include "cli.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cxxopts.hpp>
#include <limits>

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
    "  train    train the model and report test accuracy after every epoch\n"
    "\n"
    "Run 'dptrain train --help' for the flags of train.\n";

cxxopts::Options train_options() {
  cxxopts::Options options("dptrain train",
                           "Train the book's ResNet-18 on Fashion-MNIST, data-parallel over the "
                           "given devices.\nEach global batch is split evenly over one replica "
                           "per device; our own reducer all-reduces the gradients.\nUnder "
                           "torchrun or srun, each process is one rank on device LOCAL_RANK.\n");
  // Every value is taken as text and checked by us, for one-line errors that name the flag.
  // One flag per entry reads better than what the formatter would make of the chain.
  // clang-format off
  options.add_options("Experiment")
      ("data-dir", "directory of the four Fashion-MNIST IDX files (default: $DPTRAIN_DATA, else "
                   "/usr/share/datasets/fashion-mnist, else ./data/fashion-mnist)",
       cxxopts::value<std::string>(), "DIR")
      ("epochs", "training epochs", cxxopts::value<std::string>()->default_value("10"), "N")
      ("batch-size", "global batch size, split over all replicas",
       cxxopts::value<std::string>()->default_value("256"), "N")
      ("lr", "SGD learning rate", cxxopts::value<std::string>()->default_value("0.1"), "LR")
      ("seed", "seed of the initial weights and the data order",
       cxxopts::value<std::string>()->default_value("0"), "N")
      ("width", "channels of the first ResNet stage (64 is the book's; 8 is a narrow CPU model)",
       cxxopts::value<std::string>()->default_value("64"), "N")
      ("train-limit", "use only the first N training examples", cxxopts::value<std::string>(), "N")
      ("test-limit", "use only the first N test examples", cxxopts::value<std::string>(), "N")
      ("max-steps", "stop after N steps in all (a short run for checks and benchmarks)",
       cxxopts::value<std::string>(), "N")
      ("save-model", "write the final weights to FILE (torch::save)",
       cxxopts::value<std::string>(), "FILE");
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
      ("sync-bn", "all-reduce BatchNorm batch statistics over the replicas",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
      ("bucket-mb", "gradient bucket size in MiB",
       cxxopts::value<std::string>()->default_value("25"), "MIB")
      ("check-replicas", "verify every N steps that all replicas hold the same weights",
       cxxopts::value<std::string>(), "N")
      ("timeout", "seconds that the rendezvous and each collective may take",
       cxxopts::value<std::string>()->default_value("300"), "SECONDS");
  options.add_options("Output")
      ("verbose", "with several processes, every rank prints (default: rank 0 only)",
       cxxopts::value<bool>()->default_value("false")->implicit_value("true"))
      ("h,help", "print this help");
  // clang-format on
  return options;
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
  if (command != "train") {
    throw UsageError("unknown command '" + command + "'; run 'dptrain --help'");
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

  auto options = train_options();
  cxxopts::ParseResult result;
  try {
    // cxxopts wants argv[0] first; it sees "train" as the program name.
    result = options.parse(argc - 1, argv + 1);
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(std::string(e.what()) + "; run 'dptrain train --help'");
  }
  if (!result.unmatched().empty()) {
    throw UsageError("unexpected argument '" + result.unmatched().front() +
                     "'; run 'dptrain train --help'");
  }
  if (result.count("help")) {
    parsed.help = options.help({"Experiment", "Devices", "Data parallelism", "Output"});
    return parsed;
  }

  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  const auto text = [&](const char* flag) {
    auto value = result[flag].as<std::string>();
    // cxxopts takes whatever follows a flag as its value, even the next flag.
    if (!value.empty() && value[0] == '-' && value.size() > 1 && value[1] == '-') {
      throw UsageError(std::string("--") + flag + ": missing value (got '" + value + "')");
    }
    return value;
  };
  TrainCommand& train = parsed.train;
  TrainOptions& o = train.options;
  o.epochs = parse_integer_flag("epochs", text("epochs"), 1, 1000000);
  o.batch_size = parse_integer_flag("batch-size", text("batch-size"), 1, kMax);
  o.lr = parse_positive_number_flag("lr", text("lr"));
  o.seed = static_cast<uint64_t>(
      parse_integer_flag("seed", text("seed"), 0, std::numeric_limits<int64_t>::max()));
  o.width = parse_integer_flag("width", text("width"), 1, 4096);
  o.bucket_bytes = parse_integer_flag("bucket-mb", text("bucket-mb"), 1, 65536) * 1024 * 1024;
  o.timeout = std::chrono::seconds(parse_integer_flag("timeout", text("timeout"), 1, 86400 * 7));
  o.sync_bn = result["sync-bn"].as<bool>();
  if (result.count("threads")) o.threads = parse_integer_flag("threads", text("threads"), 1, 4096);
  if (result.count("check-replicas")) {
    o.check_replicas_every = parse_integer_flag("check-replicas", text("check-replicas"), 1, kMax);
  }
  if (result.count("max-steps"))
    o.max_steps = parse_integer_flag("max-steps", text("max-steps"), 1, kMax);
  if (result.count("save-model")) {
    o.save_model = text("save-model");
    if (o.save_model->empty()) throw UsageError("--save-model: empty file name");
  }
  if (result.count("train-limit")) {
    train.train_limit = parse_integer_flag("train-limit", text("train-limit"), 1, kMax);
  }
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
    train.backend = text("backend");
    if (*train.backend != "nccl" && *train.backend != "gloo") {
      throw UsageError("--backend: '" + *train.backend +
                       "' is not a backend; expected nccl or gloo");
    }
  }
  train.verbose = result["verbose"].as<bool>();
  parsed.action = ParsedCommandLine::Action::kTrain;
  return parsed;
}

}  // namespace dptrain
