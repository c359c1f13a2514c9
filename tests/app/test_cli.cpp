// The dptrain command line, in process: parse_command_line and the strict number parsers (exact
// values, defaults, edge cases, every mistake a UsageError naming the flag). The binary's own runs
// are tests/integration/test_binary_runs.cpp.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli.h"
#include "support/cli_support.h"
#include "dptrain/core/errors.h"
#include "support/test_support.h"

namespace dptrain {
namespace {


// ---- Helpers ------------------------------------------------------------------------------

// parse_command_line on {"dptrain", args...}.
ParsedCommandLine parse(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"dptrain"};
  for (const auto& arg : args) argv.push_back(arg.c_str());
  argv.push_back(nullptr);
  return parse_command_line(static_cast<int>(argv.size()) - 1, argv.data());
}

// Runs `body`, expecting a UsageError whose message is one line holding `substring`.
void expect_usage_error(const std::function<void()>& body, const std::string& substring) {
  const std::string message = testing::expect_throws<UsageError>(body, {substring});
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
}

void expect_parse_error(const std::vector<std::string>& args, const std::string& substring) {
  expect_usage_error([&] { parse(args); }, substring);
}

using testing::contains;

// ---- parse_command_line --------------------------------------------------------------------

TEST(CliParse, NoArgumentsAndHelpGiveTheProgramHelp) {
  for (const auto& args : std::vector<std::vector<std::string>>{{}, {"--help"}, {"-h"}, {"help"}}) {
    const auto parsed = parse(args);
    EXPECT_EQ(parsed.action, ParsedCommandLine::Action::kHelp);
    EXPECT_TRUE(contains(parsed.help, "train")) << parsed.help;
  }
}

TEST(CliParse, TrainHelpGivesTheTrainHelp) {
  for (const char* flag : {"--help", "-h"}) {
    const auto parsed = parse({"train", flag});
    EXPECT_EQ(parsed.action, ParsedCommandLine::Action::kHelp);
    EXPECT_TRUE(contains(parsed.help, "--batch-size")) << parsed.help;
  }
}

TEST(CliParse, DefaultsAreTheBooks) {
  const auto parsed = parse({"train"});
  ASSERT_EQ(parsed.action, ParsedCommandLine::Action::kTrain);
  const TrainCommand& train = parsed.train;
  const TrainOptions& o = train.options;
  EXPECT_EQ(o.epochs, 10);
  EXPECT_EQ(o.batch_size, 256);
  EXPECT_EQ(o.lr, 0.1);
  EXPECT_EQ(o.seed, 0u);
  EXPECT_EQ(o.width, 64);
  EXPECT_EQ(o.threads, 0);
  EXPECT_FALSE(o.sync_bn);
  EXPECT_EQ(o.bucket_bytes, 25 * 1024 * 1024);
  EXPECT_EQ(o.check_replicas_every, 0);
  EXPECT_EQ(o.timeout, std::chrono::seconds(300));
  EXPECT_EQ(o.max_steps, 0);
  EXPECT_FALSE(o.save_model.has_value());
  EXPECT_FALSE(train.data_dir.has_value());
  EXPECT_FALSE(train.devices.has_value());
  EXPECT_FALSE(train.gpus.has_value());
  EXPECT_FALSE(train.backend.has_value());
  EXPECT_EQ(train.train_limit, 0);
  EXPECT_EQ(train.test_limit, 0);
  EXPECT_EQ(train.val_split, 0);
  EXPECT_FALSE(train.verbose);
}

TEST(CliParse, GivenValuesAreExact) {
  const auto parsed = parse({"train", "--epochs", "3", "--batch-size", "512", "--lr", "0.2",
                             "--seed", "7", "--width", "8", "--devices", "cpu,cpu", "--train-limit",
                             "100", "--sync-bn", "--bucket-mb", "2", "--val-split", "10"});
  ASSERT_EQ(parsed.action, ParsedCommandLine::Action::kTrain);
  const TrainCommand& train = parsed.train;
  const TrainOptions& o = train.options;
  EXPECT_EQ(o.epochs, 3);
  EXPECT_EQ(o.batch_size, 512);
  EXPECT_EQ(o.lr, 0.2);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.width, 8);
  EXPECT_EQ(train.devices, std::optional<std::string>("cpu,cpu"));
  EXPECT_EQ(train.train_limit, 100);
  EXPECT_EQ(train.val_split, 10);
  EXPECT_EQ(train.test_limit, 0);
  EXPECT_TRUE(o.sync_bn);
  EXPECT_EQ(o.bucket_bytes, int64_t{2} * 1024 * 1024);
  // Untouched flags keep their defaults.
  EXPECT_EQ(o.threads, 0);
  EXPECT_EQ(o.timeout, std::chrono::seconds(300));
  EXPECT_FALSE(train.gpus.has_value());
  EXPECT_FALSE(train.verbose);
}

TEST(CliParse, EveryOtherFlag) {
  // Devices are only named here, not checked against the machine.
  const auto parsed =
      parse({"train", "--data-dir",       "/some/dir", "--devices",    "cuda:1",   "--test-limit",
             "50",    "--threads",        "3",         "--save-model", "model.safetensors", "--backend",
             "gloo",  "--check-replicas", "5",         "--timeout",    "60",       "--max-steps",
             "7",     "--verbose"});
  ASSERT_EQ(parsed.action, ParsedCommandLine::Action::kTrain);
  const TrainCommand& train = parsed.train;
  const TrainOptions& o = train.options;
  EXPECT_EQ(train.data_dir, std::optional<std::string>("/some/dir"));
  EXPECT_EQ(train.devices, std::optional<std::string>("cuda:1"));
  EXPECT_EQ(train.test_limit, 50);
  EXPECT_EQ(o.threads, 3);
  EXPECT_EQ(o.save_model, std::optional<std::string>("model.safetensors"));
  EXPECT_EQ(train.backend, std::optional<std::string>("gloo"));
  EXPECT_EQ(o.check_replicas_every, 5);
  EXPECT_EQ(o.timeout, std::chrono::seconds(60));
  EXPECT_EQ(o.max_steps, 7);
  EXPECT_TRUE(train.verbose);
}

TEST(CliParse, GpusAndBackendNccl) {
  const auto parsed = parse({"train", "--gpus", "2", "--backend", "nccl"});
  EXPECT_EQ(parsed.train.gpus, std::optional<int>(2));
  EXPECT_FALSE(parsed.train.devices.has_value());
  EXPECT_EQ(parsed.train.backend, std::optional<std::string>("nccl"));
}

TEST(CliParse, EqualsSignForm) {
  const auto parsed = parse({"train", "--epochs=4", "--lr=0.05", "--devices=cpu"});
  EXPECT_EQ(parsed.train.options.epochs, 4);
  EXPECT_EQ(parsed.train.options.lr, 0.05);
  EXPECT_EQ(parsed.train.devices, std::optional<std::string>("cpu"));
}

TEST(CliParse, LargestValuesInRange) {
  const auto parsed = parse({"train", "--epochs", "1000000", "--width", "4096", "--seed",
                             "9223372036854775807", "--bucket-mb", "65536", "--gpus", "1024"});
  EXPECT_EQ(parsed.train.options.epochs, 1000000);
  EXPECT_EQ(parsed.train.options.width, 4096);
  EXPECT_EQ(parsed.train.options.seed, 9223372036854775807u);
  EXPECT_EQ(parsed.train.options.bucket_bytes, int64_t{65536} * 1024 * 1024);
  EXPECT_EQ(parsed.train.gpus, std::optional<int>(1024));
}

TEST(CliParse, FastPathAndRecoveryFlags) {
  const auto defaults = parse({"train"}).train;
  EXPECT_EQ(defaults.options.memory_format, MemoryFormat::kAuto);
  EXPECT_EQ(defaults.options.amp, Amp::kOff);
  EXPECT_TRUE(defaults.options.cudnn_benchmark);
  EXPECT_EQ(defaults.options.on_nonfinite, NonFinite::kStop);
  EXPECT_EQ(defaults.options.checkpoint_every, 1);
  EXPECT_FALSE(defaults.options.resume);
  EXPECT_EQ(defaults.log_every, 50);
  const auto given = parse({"train", "--memory-format",   "contiguous", "--amp",
                            "bf16",  "--cudnn-benchmark", "off",        "--on-nonfinite",
                            "skip",  "--checkpoint-dir",  "ck",         "--checkpoint-every",
                            "3",     "--resume",          "--quiet",    "--log-every",
                            "7",     "--metrics",         "m.csv",      "--plot",
                            "p.svg"})
                         .train;
  EXPECT_EQ(given.options.memory_format, MemoryFormat::kContiguous);
  EXPECT_EQ(parse({"train", "--memory-format", "channels-last"}).train.options.memory_format,
            MemoryFormat::kChannelsLast);
  EXPECT_EQ(parse({"train", "--memory-format", "auto"}).train.options.memory_format,
            MemoryFormat::kAuto);
  EXPECT_EQ(given.options.amp, Amp::kBFloat16);
  EXPECT_FALSE(given.options.cudnn_benchmark);
  EXPECT_EQ(given.options.on_nonfinite, NonFinite::kSkip);
  EXPECT_EQ(given.options.checkpoint_dir, std::optional<std::string>("ck"));
  EXPECT_EQ(given.options.checkpoint_every, 3);
  EXPECT_TRUE(given.options.resume);
  EXPECT_TRUE(given.quiet);
  EXPECT_EQ(given.log_every, 7);
  EXPECT_EQ(given.metrics, std::optional<std::string>("m.csv"));
  EXPECT_EQ(given.plot, std::optional<std::string>("p.svg"));
  expect_parse_error({"train", "--memory-format", "nhwc"}, "--memory-format: 'nhwc'");
  EXPECT_EQ(parse({"train"}).train.cpu_allocator, CpuAllocatorKind::kSystem);
  EXPECT_EQ(parse({"train", "--cpu-allocator", "system"}).train.cpu_allocator,
            CpuAllocatorKind::kSystem);
  EXPECT_EQ(
      parse({"eval", "--model", "m.pt", "--cpu-allocator", "guarded"}).eval.common.cpu_allocator,
      CpuAllocatorKind::kGuarded);
  expect_parse_error({"train", "--cpu-allocator", "tcmalloc"},
                     "--cpu-allocator: 'tcmalloc' is not an allocator");
  expect_parse_error({"train", "--amp", "fp16"}, "--amp: 'fp16' is not one of off or bf16");
  EXPECT_FALSE(defaults.options.fused_conv_bias_grad);
  EXPECT_TRUE(parse({"train", "--conv-bias-grad", "fused"}).train.options.fused_conv_bias_grad);
  EXPECT_FALSE(parse({"train", "--conv-bias-grad", "library"}).train.options.fused_conv_bias_grad);
  expect_parse_error({"train", "--conv-bias-grad", "fuse"},
                     "--conv-bias-grad: 'fuse' is not one of library or fused");
  expect_parse_error({"train", "--on-nonfinite", "ignore"}, "--on-nonfinite");
  expect_parse_error({"train", "--log-every", "0"}, "--log-every");
  EXPECT_EQ(defaults.options.checkpoint_every_steps, 0);
  EXPECT_EQ(parse({"train", "--checkpoint-dir", "ck", "--checkpoint-every-steps", "50"})
                .train.options.checkpoint_every_steps,
            50);
  expect_parse_error({"train", "--checkpoint-dir", "ck", "--checkpoint-every-steps", "0"},
                     "--checkpoint-every-steps");
  expect_parse_error({"train", "--checkpoint-dir", "ck", "--checkpoint-every-steps", "2x"},
                     "--checkpoint-every-steps");
}

// --tensorboard DIR turns the running loss on, every 25 steps unless --tensorboard-every says;
// that flag alone, or out of range, is a usage error. Whether the build can is main()'s check.
TEST(CliParse, TensorBoardAndItsEvery) {
  const auto none = parse({"train"}).train;
  EXPECT_FALSE(none.tensorboard.has_value());
  EXPECT_EQ(none.options.loss_every, 0);  // no step ever waits for the running loss
  const auto given = parse({"train", "--tensorboard", "runs/a"}).train;
  EXPECT_EQ(given.tensorboard, std::optional<std::string>("runs/a"));
  EXPECT_EQ(given.options.loss_every, 25);
  EXPECT_EQ(parse({"train", "--tensorboard-every=7", "--tensorboard", "tb"})
                .train.options.loss_every,
            7);
  expect_parse_error({"train", "--tensorboard-every", "5"},
                     "--tensorboard-every: only with --tensorboard DIR");
  expect_parse_error({"train", "--tensorboard", "tb", "--tensorboard-every", "0"},
                     "--tensorboard-every: '0' is out of range");
  expect_parse_error({"train", "--tensorboard", "tb", "--tensorboard-every", "x"},
                     "--tensorboard-every: 'x' is not an integer");
  expect_parse_error({"eval", "--model", "m.pt", "--tensorboard", "tb"},
                     "unknown flag '--tensorboard'");
}

// --cuda-graph is a train switch, off by default; where it cannot run is check_world's to say
// (test_cuda_graph.cpp), and the binary's line is a CliErrors case.
TEST(CliParse, CudaGraphSwitch) {
  EXPECT_FALSE(parse({"train"}).train.options.cuda_graph);
  EXPECT_TRUE(parse({"train", "--cuda-graph"}).train.options.cuda_graph);
  EXPECT_TRUE(parse({"train", "--cuda-graph=true"}).train.options.cuda_graph);
  EXPECT_FALSE(parse({"train", "--cuda-graph=false"}).train.options.cuda_graph);
  expect_parse_error({"train", "--cuda-graph=yes"}, "--cuda-graph: 'yes' is not true or false");
  expect_parse_error({"eval", "--model", "m.pt", "--cuda-graph"}, "unknown flag '--cuda-graph'");
}

TEST(CliParse, PeakTflopsIsAPositiveFiniteNumber) {
  EXPECT_FALSE(parse({"train"}).train.options.peak_tflops.has_value());
  EXPECT_EQ(parse({"train", "--peak-tflops", "989.5"}).train.options.peak_tflops,
            std::optional<double>(989.5));
  EXPECT_EQ(parse({"train", "--peak-tflops=2e-3"}).train.options.peak_tflops,
            std::optional<double>(2e-3));
  for (const char* bad : {"0", "-1", "inf", "nan", "1e999", "1.5x", " 3", "fast"}) {
    SCOPED_TRACE(bad);
    expect_parse_error({"train", "--peak-tflops", bad},
                       "--peak-tflops: '" + std::string(bad) + "' is not a finite number above 0");
  }
  expect_parse_error({"eval", "--model", "m.pt", "--peak-tflops", "1"}, "peak-tflops");
  // 1e-308 would give an MFU of 3e306. A peak is some device's (Note [A plausible device's
  // peak]): 1e-6 (1 MFLOP/s) to 1e5 (100 PFLOP/s) TFLOP/s, both edges included.
  EXPECT_EQ(parse({"train", "--peak-tflops", "1e-6"}).train.options.peak_tflops,
            std::optional<double>(1e-6));
  EXPECT_EQ(parse({"train", "--peak-tflops", "100000"}).train.options.peak_tflops,
            std::optional<double>(1e5));
  for (const char* bad : {"1e-308", "4.9e-324", "9.9e-7", "100000.01", "1e300"}) {
    SCOPED_TRACE(bad);
    expect_parse_error({"train", "--peak-tflops", bad},
                       "--peak-tflops: '" + std::string(bad) + "' is no device's peak; expected "
                       "1e-06 (1 MFLOP/s, below any CPU core) to 100000 (100 PFLOP/s, far above "
                       "any GPU today) TFLOP/s");
  }
}

TEST(CliParse, EvalAndDownloadCommands) {
  const auto eval = parse({"eval", "--checkpoint", "c.dpt", "--devices", "cpu,cpu"});
  EXPECT_EQ(eval.action, ParsedCommandLine::Action::kEval);
  EXPECT_EQ(eval.eval.checkpoint, std::optional<std::string>("c.dpt"));
  EXPECT_EQ(eval.eval.common.devices, std::optional<std::string>("cpu,cpu"));
  const auto model = parse({"eval", "--model", "m.pt", "--width", "8"});
  EXPECT_EQ(model.eval.model, std::optional<std::string>("m.pt"));
  EXPECT_EQ(model.eval.common.options.width, 8);
  expect_parse_error({"eval"}, "exactly one of --checkpoint FILE and --model FILE");
  expect_parse_error({"eval", "--checkpoint", "a", "--model", "b"}, "exactly one of");
  expect_parse_error({"eval", "--checkpoint", "a", "--width", "8"}, "--width");
  expect_parse_error({"eval", "--model", "m.pt", "--epochs", "3"}, "epochs");
  const auto logits = parse({"eval", "--model", "m.pt", "--logits", "out/l.safetensors"});
  EXPECT_EQ(logits.eval.logits, std::optional<std::string>("out/l.safetensors"));
  const auto download = parse({"download", "--data-dir", "d", "--url", "file:///x/", "--force"});
  EXPECT_EQ(download.action, ParsedCommandLine::Action::kDownload);
  EXPECT_EQ(download.download.directory, "d");
  EXPECT_EQ(download.download.url, std::optional<std::string>("file:///x/"));
  EXPECT_TRUE(download.download.force);
}

TEST(CliParse, MistakesThrowUsageErrorNamingTheFlag) {
  expect_parse_error({"frobnicate"}, "frobnicate");
  expect_parse_error({"train", "--frobnicate"}, "frobnicate");
  expect_parse_error({"train", "stray"}, "stray");
  expect_parse_error({"train", "--epochs"}, "epochs");
  expect_parse_error({"train", "--epochs", "abc"}, "--epochs");
  expect_parse_error({"train", "--batch-size", "1.5"}, "--batch-size");
  expect_parse_error({"train", "--lr", "nan"}, "--lr");
  expect_parse_error({"train", "--width", "0"}, "--width");
  expect_parse_error({"train", "--seed", "-1"}, "--seed");
  expect_parse_error({"train", "--devices", "cpu", "--gpus", "1"}, "--gpus");
  expect_parse_error({"train", "--backend", "mpi"}, "mpi");
  expect_parse_error({"train", "--save-model", ""}, "--save-model");
}

// A boolean flag given "=false" must not switch the feature on. It is taken, not refused: a
// switch reads true or false (SwitchValueIsTrueOrFalse), and "=false" is how a script turns off
// what it would otherwise pass.
TEST(CliParse, BooleanFlagWithFalseIsNotTrue) {
  for (const char* flag : {"--sync-bn=false", "--verbose=false"}) {
    SCOPED_TRACE(flag);
    try {
      const auto parsed = parse({"train", flag});
      EXPECT_EQ(parsed.action, ParsedCommandLine::Action::kTrain);
      EXPECT_FALSE(parsed.train.options.sync_bn);
      EXPECT_FALSE(parsed.train.verbose);
    } catch (const UsageError& e) {
      ADD_FAILURE() << "refused: " << e.what();
    }
  }
}

// A flag followed by another flag is missing its value; the next flag is not a file name.
TEST(CliParse, FlagIsNotTakenAsTheValueOfAnother) {
  expect_parse_error({"train", "--save-model", "--verbose"}, "--save-model");
  expect_parse_error({"train", "--data-dir", "--sync-bn"}, "--data-dir");
}

// cxxopts matches each argument it takes for a flag with a std::regex whose matcher recurses
// once per character: a "--flag=value" of 50000 characters would crash dptrain with a stack
// overflow (4000 under `ulimit -s 1024`, see CliStack). Arguments reach the regex only as
// our own short flag names, so any length parses, in linear time; a path longer than the system
// takes is refused by name, and an unknown flag of any length is named, cut short.
TEST(CliParse, LongArgumentsParseWithoutRecursion) {
  const std::string dir(4095, 'd');
  EXPECT_EQ(parse({"train", "--data-dir=" + dir}).train.data_dir, dir);
  EXPECT_EQ(parse({"train", "--data-dir", dir}).train.data_dir, dir);
  const std::string devices = "cpu" + std::string(131000, ' ');
  EXPECT_EQ(parse({"train", "--devices=" + devices}).train.devices, devices);
  const std::string huge(131000, 'a');
  expect_parse_error(
      {"train", "--data-dir=" + huge},
      "--data-dir: 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...' (131000 characters) "
      "is longer than the system allows for a path (4095 characters)");
  expect_parse_error({"train", "--" + huge}, "unknown flag '--aaaaaa");
  expect_parse_error({"train", "--" + huge + "=1"}, "(131002 characters)");
  expect_parse_error({"train", "-" + huge}, "unknown flag '-aaaaa");
  expect_parse_error({"train", huge}, "unexpected argument 'aaaa");
  expect_parse_error({"train", "--epochs=" + std::string(131000, '1')}, "--epochs: '1111");
  expect_parse_error({"train", "--sync-bn=" + huge}, "--sync-bn: 'aaaa");
}

// Every flag that takes a value, of every command, given an empty one: a usage error naming it
// (--data-dir= is not the current directory's sibling "", which would fail only at run time).
// The flags are read from the help, so that a flag added later is covered too.
TEST(CliParse, EveryFlagGivenAnEmptyValueIsAUsageErrorNamingIt) {
  const std::regex flag_with_value(R"(--([a-z][a-z-]+) [A-Z|]+)");
  int checked = 0;
  for (const std::string command : {"train", "eval", "download"}) {
    const std::string help = parse({command, "--help"}).help;
    for (std::sregex_iterator it(help.begin(), help.end(), flag_with_value), end; it != end; ++it) {
      const std::string flag = "--" + (*it)[1].str();
      SCOPED_TRACE(command + " " + flag);
      expect_parse_error({command, flag + "="}, flag + ": empty value");
      expect_parse_error({command, flag, ""}, flag + ": empty value");
      ++checked;
    }
  }
  EXPECT_GE(checked, 40);  // 26 of train, 14 of eval, 5 of download
}

// What dptrain writes as safetensors must be named so: a "model.pt" sent users to torch.load.
TEST(CliParse, SafetensorsOutputsMustBeNamedSo) {
  for (const std::string name : {"model.pt", "model.dpt", ".safetensors", "dir/.safetensors",
                                 "model.safetensors/", "model.SAFETENSORS"}) {
    SCOPED_TRACE(name);
    expect_parse_error({"train", "--save-model", name},
                       "--save-model '" + name + "': the file is written as safetensors, so its "
                       "name must end in .safetensors");
    expect_parse_error({"eval", "--model", "m.safetensors", "--logits", name},
                       "--logits '" + name + "': the file is written as safetensors");
  }
  EXPECT_EQ(parse({"train", "--save-model", "a/b.safetensors"}).train.options.save_model,
            std::optional<std::string>("a/b.safetensors"));
}

// A switch given a value takes only what reads as true or false.
TEST(CliParse, SwitchValueIsTrueOrFalse) {
  EXPECT_TRUE(parse({"train", "--sync-bn=true"}).train.options.sync_bn);
  EXPECT_FALSE(parse({"train", "--sync-bn=0"}).train.options.sync_bn);
  expect_parse_error({"train", "--sync-bn=yes"}, "--sync-bn: 'yes' is not true or false");
  expect_parse_error({"train", "--sync-bn="}, "--sync-bn: '' is not true or false");
}

// ---- parse_integer_flag / parse_positive_number_flag --------------------------------------

TEST(CliParse, IntegerFlagAcceptsWholeNumbersInRange) {
  EXPECT_EQ(parse_integer_flag("n", "42", 1, 100), 42);
  EXPECT_EQ(parse_integer_flag("n", "1", 1, 100), 1);
  EXPECT_EQ(parse_integer_flag("n", "100", 1, 100), 100);
  EXPECT_EQ(parse_integer_flag("n", "0", 0, 100), 0);
  EXPECT_EQ(parse_integer_flag("n", "-5", -10, 10), -5);
  EXPECT_EQ(parse_integer_flag("n", "9223372036854775807", 0, INT64_MAX), INT64_MAX);
}

TEST(CliParse, IntegerFlagRejectsAnythingElse) {
  const auto bad = [](const std::string& text, const std::string& substring) {
    SCOPED_TRACE("'" + text + "'");
    expect_usage_error([&] { parse_integer_flag("epochs", text, 1, 1000); }, substring);
    expect_usage_error([&] { parse_integer_flag("epochs", text, 1, 1000); }, "--epochs");
  };
  bad("", "not an integer");
  bad("abc", "not an integer");
  bad("1e3", "not an integer");
  bad("1.5", "not an integer");
  bad("3x", "not an integer");
  bad("x3", "not an integer");
  bad("0x10", "not an integer");
  bad("5 ", "not an integer");
  bad(" 5", "not an integer");  // the whole text must be the number
  bad("99999999999999999999", "99999999999999999999");
  bad("-99999999999999999999", "99999999999999999999");
  bad("-5", "out of range");
  bad("0", "out of range");
  bad("1001", "out of range");
}

TEST(CliParse, PositiveFloatFlagAcceptsNormalFloat32Numbers) {
  EXPECT_EQ(parse_positive_float_flag("lr", "0.1"), 0.1);
  EXPECT_EQ(parse_positive_float_flag("lr", "2"), 2.0);
  EXPECT_EQ(parse_positive_float_flag("lr", "1e-3"), 1e-3);
  EXPECT_EQ(parse_positive_float_flag("lr", ".5"), 0.5);
  EXPECT_EQ(parse_positive_float_flag("lr", "5."), 5.0);
  EXPECT_EQ(parse_positive_float_flag("lr", "3.4e38"), 3.4e38);
  EXPECT_EQ(parse_positive_float_flag("lr", "1.2e-38"), 1.2e-38);
}

TEST(CliParse, PositiveFloatFlagRejectsAnythingElse) {
  const auto bad = [](const std::string& text, const std::string& substring) {
    SCOPED_TRACE("'" + text + "'");
    expect_usage_error([&] { parse_positive_float_flag("lr", text); }, "--lr: '" + text + "'");
    expect_usage_error([&] { parse_positive_float_flag("lr", text); }, substring);
  };
  for (const char* text : {"", "abc", "0.1x", "x0.1", "0.1 ", " 0.1"}) bad(text, "not a number");
  for (const char* text : {"0", "-0", "0.0", "-0.1", "nan", "NaN", "-nan", "inf", "-inf",
                           "infinity", "1e999", "1e-400"}) {
    bad(text, "finite number above 0");
  }
  // Finite doubles that float32 weights cannot take: LibTorch's overflow error, or silently 0.
  for (const char* text : {"1e39", "3.5e38", "1e300", "1e-39", "1e-320", "4.9e-324"}) {
    bad(text, "outside what a float32 holds");
  }
}

}  // namespace
}  // namespace dptrain
