// The dptrain binary run as a child process: help, exit status 2 or 1 with one "error:" line for
// every mistake (never an abort), short training runs, checkpoints, signals, eval, progress, and
// hostile environments. It spans every layer; the parser alone is tests/app/test_cli.cpp.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli.h"
#include "dptrain/core/devices.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_directory.h"
#include "support/cli_support.h"
#include "support/data_support.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using testing::CommandResult;
using testing::read_text;
using testing::TempDir;

// ---- Helpers ------------------------------------------------------------------------------

using testing::contains;
using testing::describe;
using testing::expect_no_crash;
using testing::expect_one_error_line;
using testing::fake_images;
using testing::fake_labels;
using testing::kRunTime;
using testing::kTestImages;
using testing::kTestLabels;
using testing::kTrainImages;
using testing::kTrainLabels;
using testing::kUsage;
using testing::run_dptrain;
using testing::split_lines;
using testing::tiny_data_dir;
using testing::write_fake_data;

const std::regex kFinalLineOneCpu(
    R"(^test acc: [0-9]\.[0-9]{2}, [0-9]+\.[0-9] sec/epoch on \[cpu\]$)");
const std::regex kFinalLineTwoCpus(
    R"(^test acc: [0-9]\.[0-9]{2}, [0-9]+\.[0-9] sec/epoch on \[cpu, cpu\]$)");

// ---- Help --------------------------------------------------------------------------------

TEST(CliHelp, ProgramHelpExitsZero) {
  for (const auto& args : std::vector<std::vector<std::string>>{{}, {"--help"}, {"-h"}}) {
    const auto result = run_dptrain(args);
    expect_no_crash(result);
    EXPECT_EQ(result.exit_code, 0) << describe(result);
    EXPECT_TRUE(contains(result.out, "Usage: dptrain")) << describe(result);
    EXPECT_TRUE(contains(result.out, "train")) << describe(result);
    EXPECT_EQ(result.err, "") << describe(result);
  }
}

TEST(CliHelp, TrainHelpDescribesEveryFlag) {
  const auto result = run_dptrain({"train", "--help"});
  expect_no_crash(result);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_EQ(result.err, "") << describe(result);
  for (const char* flag : {"--data-dir",
                           "--epochs",
                           "--batch-size",
                           "--lr",
                           "--seed",
                           "--width",
                           "--devices",
                           "--gpus",
                           "--train-limit",
                           "--test-limit",
                           "--threads",
                           "--save-model",
                           "--backend",
                           "--sync-bn",
                           "--bucket-mb",
                           "--check-replicas",
                           "--timeout",
                           "--max-steps",
                           "--verbose",
                           "--help",
                           "--memory-format",
                           "--amp",
                           "--cudnn-benchmark",
                           "--cuda-graph",
                           "--peak-tflops",
                           "--on-nonfinite",
                           "--checkpoint-dir",
                           "--checkpoint-every",
                           "--checkpoint-every-steps",
                           "--resume",
                           "--quiet",
                           "--log-every",
                           "--metrics",
                           "--plot",
                           "--tensorboard",
                           "--tensorboard-every"}) {
    EXPECT_TRUE(contains(result.out, std::string(flag) + " ")) << flag << "\n" << result.out;
  }
}

TEST(CliHelp, TrainHelpShowsTheDefaults) {
  const auto result = run_dptrain({"train", "--help"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  // The help wraps its lines: join them, then look at one flag's text up to the next flag.
  const std::string help = std::regex_replace(result.out, std::regex("[ \\n]+"), " ");
  const auto text_of = [&](const std::string& flag) {
    const size_t begin = help.find(" " + flag + " ");
    if (begin == std::string::npos) return std::string();
    const size_t end = help.find(" -", begin + flag.size() + 1);
    return help.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  };
  EXPECT_TRUE(contains(text_of("--epochs"), "(default: 10)")) << help;
  EXPECT_TRUE(contains(text_of("--batch-size"), "(default: 256)")) << help;
  EXPECT_TRUE(contains(text_of("--lr"), "(default: 0.1)")) << help;
  EXPECT_TRUE(contains(text_of("--seed"), "(default: 0)")) << help;
  EXPECT_TRUE(contains(text_of("--width"), "(default: 64)")) << help;
  EXPECT_TRUE(contains(text_of("--bucket-mb"), "(default: 25)")) << help;
  EXPECT_TRUE(contains(text_of("--timeout"), "(default: 300)")) << help;
}

// ---- Usage errors: exit status 2 and one "error:" line -----------------------------------

struct ErrorCase {
  std::string name;
  std::vector<std::string> args;
  int exit_code;
  std::string message;         // a part of the error line
  bool needs_no_cuda = false;  // the mistake is only one on a machine without a GPU
};

void PrintTo(const ErrorCase& c, std::ostream* out) { *out << c.name; }

class CliErrors : public ::testing::TestWithParam<ErrorCase> {};

// Usage errors are run with a small valid --data-dir (unless they name one), so that a mistake
// the parser misses cannot hide behind missing data, and show up as a (short) successful run.
TEST_P(CliErrors, OneErrorLineAndExitStatus) {
  const ErrorCase& c = GetParam();
  if (c.needs_no_cuda && cuda_device_count() > 0) {
    GTEST_SKIP() << "this machine has CUDA, so '" << c.name << "' is not a mistake here";
  }
  std::vector<std::string> args = c.args;
  if (!args.empty() && args[0] == "train") {
    // Flags the case does not name are set to keep a wrongly accepted run short; given first,
    // so that a flag missing its value at the end stays at the end.
    std::vector<std::string> extra;
    const std::vector<std::pair<std::string, std::string>> quick = {{"--data-dir", tiny_data_dir()},
                                                                    {"--epochs", "1"},
                                                                    {"--width", "1"},
                                                                    {"--threads", "1"},
                                                                    {"--max-steps", "1"}};
    for (const auto& flag_value : quick) {
      // Not a structured binding: clang 14 (the sanitizer build) cannot capture one.
      const std::string& flag = flag_value.first;
      const bool named = std::any_of(args.begin(), args.end(), [&](const std::string& arg) {
        return arg.rfind(flag, 0) == 0;
      });
      if (!named) extra.insert(extra.end(), {flag, flag_value.second});
    }
    args.insert(args.begin() + 1, extra.begin(), extra.end());
  }
  expect_one_error_line(run_dptrain(args), c.exit_code, c.message);
}

const std::vector<ErrorCase> kErrorCases = {
    // Commands and flags that do not exist.
    {"unknown_command", {"frobnicate"}, kUsage, "frobnicate"},
    {"flag_without_command", {"--epochs", "3"}, kUsage, "--epochs"},
    {"unknown_flag", {"train", "--frobnicate"}, kUsage, "frobnicate"},
    {"unknown_flag_with_value", {"train", "--frobnicate=3"}, kUsage, "frobnicate"},
    {"unknown_short_flag", {"train", "-q"}, kUsage, "q"},
    {"stray_argument", {"train", "stray"}, kUsage, "stray"},
    // Missing values.
    {"epochs_missing_value", {"train", "--epochs"}, kUsage, "epochs"},
    {"lr_missing_value", {"train", "--lr"}, kUsage, "lr"},
    {"devices_missing_value", {"train", "--devices"}, kUsage, "devices"},
    {"save_model_missing_value", {"train", "--save-model"}, kUsage, "save-model"},
    {"save_model_followed_by_flag", {"train", "--save-model", "--verbose"}, kUsage, "--save-model"},
    {"epochs_empty", {"train", "--epochs="}, kUsage, "--epochs"},
    // Not a number.
    {"epochs_abc", {"train", "--epochs", "abc"}, kUsage, "--epochs: 'abc'"},
    {"lr_x", {"train", "--lr", "x"}, kUsage, "--lr: 'x'"},
    {"batch_size_fraction", {"train", "--batch-size", "1.5"}, kUsage, "--batch-size: '1.5'"},
    {"epochs_exponent", {"train", "--epochs", "1e3"}, kUsage, "--epochs"},
    {"epochs_trailing_garbage", {"train", "--epochs", "3x"}, kUsage, "--epochs"},
    {"seed_overflow", {"train", "--seed", "99999999999999999999"}, kUsage, "--seed"},
    {"threads_abc", {"train", "--threads", "abc"}, kUsage, "--threads"},
    {"gpus_abc", {"train", "--gpus", "abc"}, kUsage, "--gpus"},
    // Out of range.
    {"batch_size_zero", {"train", "--batch-size", "0"}, kUsage, "--batch-size"},
    {"batch_size_negative", {"train", "--batch-size", "-1"}, kUsage, "--batch-size"},
    {"epochs_zero", {"train", "--epochs", "0"}, kUsage, "--epochs"},
    {"epochs_negative", {"train", "--epochs", "-5"}, kUsage, "--epochs"},
    {"width_zero", {"train", "--width", "0"}, kUsage, "--width"},
    {"train_limit_zero", {"train", "--train-limit", "0"}, kUsage, "--train-limit"},
    {"test_limit_zero", {"train", "--test-limit", "0"}, kUsage, "--test-limit"},
    {"test_limit_negative", {"train", "--test-limit", "-3"}, kUsage, "--test-limit"},
    {"val_split_negative", {"train", "--val-split", "-1"}, kUsage, "--val-split"},
    {"lr_zero", {"train", "--lr", "0"}, kUsage, "--lr"},
    {"lr_negative", {"train", "--lr", "-0.1"}, kUsage, "--lr"},
    {"lr_nan", {"train", "--lr", "nan"}, kUsage, "--lr"},
    {"lr_inf", {"train", "--lr", "inf"}, kUsage, "--lr"},
    {"lr_overflow", {"train", "--lr", "1e999"}, kUsage, "--lr"},
    {"lr_overflows_float32", {"train", "--lr", "1e39"}, kUsage, "--lr: '1e39' is outside"},
    {"lr_underflows_float32", {"train", "--lr", "1e-320"}, kUsage, "--lr: '1e-320' is outside"},
    {"threads_more_than_cores", {"train", "--threads", "4096"}, kUsage, "--threads 4096"},
    {"seed_negative", {"train", "--seed", "-1"}, kUsage, "--seed"},
    {"threads_zero", {"train", "--threads", "0"}, kUsage, "--threads"},
    {"bucket_mb_zero", {"train", "--bucket-mb", "0"}, kUsage, "--bucket-mb"},
    {"timeout_zero", {"train", "--timeout", "0"}, kUsage, "--timeout"},
    {"check_replicas_zero", {"train", "--check-replicas", "0"}, kUsage, "--check-replicas"},
    {"max_steps_zero", {"train", "--max-steps", "0"}, kUsage, "--max-steps"},
    {"gpus_zero", {"train", "--gpus", "0"}, kUsage, "--gpus"},
    {"save_model_empty", {"train", "--save-model", ""}, kUsage, "--save-model"},
    {"data_dir_empty", {"train", "--data-dir="}, kUsage, "--data-dir: empty value"},
    {"eval_data_dir_empty", {"eval", "--model", "m.pt", "--data-dir", ""}, kUsage, "--data-dir"},
    {"download_data_dir_empty", {"download", "--data-dir="}, kUsage, "--data-dir"},
    {"download_url_empty", {"download", "--url="}, kUsage, "--url"},
    {"download_max_time_zero", {"download", "--max-time", "0"}, kUsage, "--max-time"},
    {"download_speed_limit_zero", {"download", "--speed-limit=0"}, kUsage, "--speed-limit"},
    // Devices and backends.
    {"gpus_without_cuda", {"train", "--gpus", "1"}, kUsage, "--gpus", true},
    {"devices_cuda0_without_cuda", {"train", "--devices", "cuda:0"}, kUsage, "cuda:0", true},
    {"devices_cuda_without_cuda", {"train", "--devices", "cuda"}, kUsage, "cuda", true},
    {"gpus_more_than_any_machine", {"train", "--gpus", "1024"}, kUsage, "--gpus"},
    {"devices_tpu", {"train", "--devices", "tpu"}, kUsage, "tpu"},
    {"devices_bad_cuda_index", {"train", "--devices", "cuda:x"}, kUsage, "cuda:x"},
    {"devices_empty", {"train", "--devices", ""}, kUsage, "--devices"},
    {"devices_empty_entry", {"train", "--devices", "cpu,,cpu"}, kUsage, "empty entry"},
    {"devices_trailing_comma", {"train", "--devices", "cpu,"}, kUsage, "--devices"},
    {"devices_and_gpus", {"train", "--devices", "cpu", "--gpus", "1"}, kUsage, "--gpus"},
    {"gpus_and_devices", {"train", "--gpus", "1", "--devices", "cpu"}, kUsage, "--devices"},
    {"backend_mpi", {"train", "--backend", "mpi"}, kUsage, "mpi"},
    {"backend_nccl_on_cpu", {"train", "--devices", "cpu", "--backend", "nccl"}, kUsage, "nccl"},
    {"cuda_graph_on_cpu",
     {"train", "--devices", "cpu", "--cuda-graph"},
     kUsage,
     "--cuda-graph needs CUDA devices"},
    {"cuda_graph_on_cpu_replicas_over_gloo",
     {"train", "--devices", "cpu,cpu", "--backend", "gloo", "--cuda-graph", "--batch-size", "2"},
     kUsage,
     "--cuda-graph needs CUDA devices"},
    {"cuda_graph_where_cpu_is_the_default",
     {"train", "--cuda-graph"},
     kUsage,
     "--cuda-graph needs CUDA devices",
     true},
    {"batch_smaller_than_replicas",
     {"train", "--devices", "cpu,cpu", "--batch-size", "1", "--width", "1"},
     kUsage,
     "--batch-size 1"},
    // Output paths, checked before the data are read (not first tried after the training, where
    // a failure loses the weights, and /dev/full would be replaced by a model file).
    // --save-model's name must end in .safetensors, so a device or a directory is refused by
    // its name first; check_output_file's refusal of them is the same for --metrics and --plot.
    {"save_model_is_a_device",
     {"train", "--save-model", "/dev/full", "--data-dir", "/nonexistent"},
     kUsage,
     "--save-model '/dev/full': the file is written as safetensors"},
    {"save_model_is_a_directory", {"train", "--save-model", "/tmp"}, kUsage,
     "--save-model '/tmp': the file is written as safetensors"},
    {"metrics_is_a_device",
     {"train", "--metrics", "/dev/full", "--data-dir", "/nonexistent"},
     kUsage,
     "--metrics /dev/full"},
    {"save_model_directory_missing",
     {"train", "--save-model", "/nonexistent-dptrain-dir/m.safetensors"},
     kUsage,
     "its directory /nonexistent-dptrain-dir cannot be used"},
    {"plot_directory_missing",
     {"train", "--plot", "/nonexistent-dptrain-dir/p.svg", "--data-dir", "/nonexistent"},
     kUsage,
     "--plot /nonexistent-dptrain-dir/p.svg: its directory"},
    {"metrics_directory_missing",
     {"train", "--metrics", "/nonexistent-dptrain-dir/m.csv", "--data-dir", "/nonexistent"},
     kUsage,
     "--metrics /nonexistent-dptrain-dir/m.csv: its directory"},
    {"metrics_in_a_read_only_place",
     {"train", "--metrics", "/proc/m.csv"},
     kUsage,
     "--metrics /proc/m.csv: cannot create a file in /proc"},
    {"fresh_without_checkpoint_dir",
     {"train", "--fresh"},
     kUsage,
     "--fresh needs --checkpoint-dir"},
    {"fresh_and_resume",
     {"train", "--checkpoint-dir", "ck", "--fresh", "--resume"},
     kUsage,
     "--fresh and --resume exclude each other"},
    // A usage mistake is reported before the data are looked at.
    {"usage_before_missing_data",
     {"train", "--data-dir", "/nonexistent", "--epochs", "0"},
     kUsage,
     "--epochs"},
    // Missing data: a run-time failure.
    {"data_dir_nonexistent",
     {"train", "--data-dir", "/nonexistent", "--devices", "cpu"},
     kRunTime,
     "/nonexistent"},
};

INSTANTIATE_TEST_SUITE_P(, CliErrors, ::testing::ValuesIn(kErrorCases),
                         [](const ::testing::TestParamInfo<ErrorCase>& info) {
                           return info.param.name;
                         });

TEST(CliErrorsEnvironment, DptrainDataNonexistentIsARunTimeError) {
  const auto result =
      run_dptrain({"train", "--devices", "cpu"}, {{"DPTRAIN_DATA", "/nonexistent-dptrain-data"}});
  expect_one_error_line(result, kRunTime, "/nonexistent-dptrain-data");
}

// ---- Corrupt data: exit status 1 and one "error:" line naming the file -------------------

struct DataCase {
  std::string name;
  std::string file;                             // which of the four files to replace
  std::function<std::vector<uint8_t>()> bytes;  // its new contents; empty function: remove it
  std::string message;                          // a part of the error line
  bool gzip = false;                            // write it as FILE.gz
};

void PrintTo(const DataCase& c, std::ostream* out) { *out << c.name; }

class CliDataErrors : public ::testing::TestWithParam<DataCase> {};

TEST_P(CliDataErrors, OneErrorLineNamingTheFile) {
  const DataCase& c = GetParam();
  TempDir dir;
  write_fake_data(dir, 16, 8);
  dptrain::testing::remove_path(dir.file(c.file));
  std::string named = dir.path();  // a missing file: the directory is named
  if (c.bytes) {
    named = dir.file(c.file + (c.gzip ? ".gz" : ""));
    testing::write_bytes(named, c.bytes());
  }
  const auto result = run_dptrain({"train", "--data-dir", dir.path(), "--devices", "cpu", "--width",
                                   "1", "--epochs", "1", "--threads", "1"});
  expect_one_error_line(result, kRunTime, named);
  if (!c.message.empty()) {
    EXPECT_TRUE(contains(result.err, c.message)) << describe(result);
  }
}

const std::vector<DataCase> kDataCases = {
    {"missing_file", kTestLabels, nullptr, "does not hold"},
    {"empty_file", kTrainImages, [] { return std::vector<uint8_t>{}; }, "too short"},
    {"bad_magic", kTrainImages, [] { return std::vector<uint8_t>{'G', 'I', 'F', '8', 0, 0}; },
     "bad magic"},
    {"wrong_element_type", kTrainLabels,
     [] { return testing::make_idx(0x0D, {16}, std::vector<uint8_t>(64)); }, "element type"},
    {"truncated_header", kTestImages, [] { return std::vector<uint8_t>{0, 0, 0x08, 3, 0, 0, 0}; },
     "truncated header"},
    {"truncated_data", kTrainImages,
     [] {
       return testing::make_idx(0x08, {16, 28, 28}, std::vector<uint8_t>(100));
     },
     "truncated"},
    {"trailing_bytes", kTestLabels,
     [] { return testing::make_idx(0x08, {8}, std::vector<uint8_t>(9)); }, "trailing"},
    {"absurd_sizes", kTrainImages,
     [] {
       return testing::make_idx(0x08, {0xFFFFFFFFu, 0xFFFFFFFFu, 28}, {});
     },
     "absurd"},
    {"wrong_image_shape", kTrainImages,
     [] {
       return testing::make_idx(0x08, {16, 27, 29}, std::vector<uint8_t>(16 * 27 * 29));
     },
     "(N, 28, 28)"},
    {"label_out_of_range", kTrainLabels,
     [] {
       std::vector<uint8_t> labels(16, 1);
       labels[5] = 42;
       return testing::make_idx(0x08, {16}, labels);
     },
     "42"},
    {"count_mismatch", kTestLabels, [] { return fake_labels(7); }, "7 labels"},
    {"corrupt_gzip", kTrainImages,
     [] {
       auto bytes = testing::gzip_bytes(fake_images(16));
       for (size_t i = 12; i < bytes.size(); i += 3) bytes[i] ^= 0x5A;
       return bytes;
     },
     "", true},
    // 16 images declared, 64 MiB of zeros behind them: unpacking stops past the declared size.
    {"gzip_bomb", kTrainImages,
     [] { return testing::gzip_then_zeros(fake_images(16), size_t{64} << 20); },
     "more data than its header declares", true},
    // 4.7 GB declared: more than any IDX file dptrain reads, refused before reading on.
    {"header_declares_over_4_gib", kTestImages,
     [] {
       return testing::make_idx(0x08, {6000000, 28, 28}, {});
     },
     "absurdly large"},
    {"truncated_gzip", kTrainImages,
     [] {
       auto bytes = testing::gzip_bytes(fake_images(16));
       bytes.resize(bytes.size() / 2);
       return bytes;
     },
     "truncated", true},
};

INSTANTIATE_TEST_SUITE_P(, CliDataErrors, ::testing::ValuesIn(kDataCases),
                         [](const ::testing::TestParamInfo<DataCase>& info) {
                           return info.param.name;
                         });

// ---- Runs that train ---------------------------------------------------------------------

// Checks a successful run: exit 0, one "epoch i/n:" line per epoch, the final line last.
void expect_successful_run(const CommandResult& result, int epochs, const std::regex& final_line) {
  expect_no_crash(result);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_FALSE(contains(result.err, "error:")) << describe(result);
  const auto lines = split_lines(result.out);
  ASSERT_FALSE(lines.empty()) << describe(result);
  std::vector<std::string> epoch_lines;
  for (const auto& line : lines) {
    if (line.rfind("epoch ", 0) == 0) epoch_lines.push_back(line);
  }
  ASSERT_EQ(epoch_lines.size(), static_cast<size_t>(epochs)) << describe(result);
  for (int i = 0; i < epochs; ++i) {
    const std::string prefix =
        "epoch " + std::to_string(i + 1) + "/" + std::to_string(epochs) + ": ";
    EXPECT_EQ(epoch_lines[static_cast<size_t>(i)].rfind(prefix, 0), 0u) << describe(result);
  }
  EXPECT_TRUE(std::regex_match(lines.back(), final_line)) << "last line: '" << lines.back() << "'\n"
                                                          << describe(result);
}

// ---- The memory layout on every x86 CPU (memory_format.h) ----------------------------------

// oneDNN's ISA cap makes any x86 machine run the kernels of a CPU without AVX-512 (an AMD
// EPYC's), where the strided 1x1 convolution's backward corrupted the heap at widths 1 to 7 in
// channels-last (Note [Channels-last on the CPU]); glibc's allocator then aborts the run.
const std::map<std::string, std::string> kAvx2Kernels{{"ONEDNN_MAX_CPU_ISA", "AVX2"},
                                                      {"DNNL_MAX_CPU_ISA", "AVX2"}};

TEST(CliLayout, BothLayoutsTrainEveryNarrowWidthOnAvx2Kernels) {
  const TempDir dir;
  write_fake_data(dir, 256, 16);  // one step of a global batch of 256, as in the upstream repro
  for (const char* layout : {"auto", "channels-last"}) {
    for (const char* devices : {"cpu", "cpu,cpu"}) {
      for (int width = 1; width <= 8; ++width) {
        const auto result = run_dptrain({"train", "--data-dir", dir.path(), "--devices", devices,
                                         "--width", std::to_string(width), "--epochs", "1",
                                         "--threads", "1", "--memory-format", layout, "--quiet"},
                                        kAvx2Kernels, 300);
        expect_no_crash(result);
        EXPECT_EQ(result.exit_code, 0) << layout << " " << devices << " --width " << width << "\n"
                                       << describe(result);
      }
    }
  }
}

// valgrind emulates no AVX-512, so under it oneDNN runs its AVX2 kernels on any x86 CPU, and
// memcheck sees every write past a heap block, also those the allocator lets pass. One
// step at width 4 (the width of the upstream repro) takes a minute or two.
TEST(CliLayout, DefaultLayoutIsCleanUnderValgrind) {
  if (testing::run_command({"valgrind", "--version"}).exit_code != 0) {
    GTEST_SKIP() << "valgrind is not installed (scripts/install-deps.sh installs it)";
  }
  const TempDir dir;
  write_fake_data(dir, 32, 16);
  const auto result = testing::run_command(
      {"valgrind",
       "-q",
       "--error-exitcode=99",
       "--vex-guest-max-insns=100",
       // The binary's malloc is tcmalloc's, linked. Its operator delete[] is an alias of its
       // free(), so memcheck would call every delete[] a mismatched free(); what this test hunts
       // is oneDNN writing out of bounds (an invalid write), which stays on.
       "--soname-synonyms=somalloc=*tcmalloc*",
       "--show-mismatched-frees=no",
       std::string("--suppressions=") + DPTRAIN_TEST_DATA_DIR + "/../sanitizers/valgrind.supp",
       testing::dptrain_binary(),
       "train",
       "--data-dir",
       dir.path(),
       "--devices",
       "cpu",
       "--width",
       "4",
       "--batch-size",
       "32",
       "--epochs",
       "1",
       "--threads",
       "1",
       "--quiet"},
      {}, 1200);
  // Valgrind 3.19 (Debian 12) cannot translate some of PyPI's LibTorch 2.x CPU code: it stops
  // with this, having found nothing. A corrupted heap ends differently (an invalid write, or a
  // failed assertion on valgrind's own heap), and fails below.
  if (contains(result.err, "VEX temporary storage exhausted")) {
    GTEST_SKIP() << "this valgrind cannot run this LibTorch's CPU kernels (VEX storage exhausted)";
  }
  EXPECT_EQ(result.exit_code, 0) << describe(result);
}

TEST(CliLayout, ChannelsLastBelowAvx2KernelsIsRefusedBeforeTheData) {
  const std::map<std::string, std::string> sse41_kernels{{"ONEDNN_MAX_CPU_ISA", "SSE41"},
                                                         {"DNNL_MAX_CPU_ISA", "SSE41"}};
  for (const char* command : {"train", "eval"}) {
    std::vector<std::string> args{command, "--data-dir",      "/nonexistent", "--devices",
                                  "cpu",   "--memory-format", "channels-last"};
    if (std::string(command) == "eval") args.insert(args.end(), {"--checkpoint", "a.dpt"});
    expect_one_error_line(run_dptrain(args, sse41_kernels), kUsage,
                          "the oneDNN ISA cap SSE41 turns AVX2 off, so oneDNN runs kernels that "
                          "no test has shown sound in channels-last");
  }
  // --recipe fast asks for channels-last: the same refusal, naming the way out.
  expect_one_error_line(
      run_dptrain({"train", "--data-dir", "/nonexistent", "--devices", "cpu", "--recipe", "fast"},
                  sse41_kernels),
      kUsage, "use --memory-format contiguous");
}

TEST(CliRun, RealDataOneCpu) {
  const auto data = testing::real_data_dir();
  if (!data) GTEST_SKIP() << "no Fashion-MNIST found (set DPTRAIN_DATA or install it)";
  const auto result =
      run_dptrain({"train", "--devices", "cpu", "--width", "4", "--epochs", "1", "--train-limit",
                   "256", "--test-limit", "128", "--batch-size", "64", "--threads", "1"},
                  {}, 300);
  expect_successful_run(result, 1, kFinalLineOneCpu);
  EXPECT_TRUE(contains(result.out, "256 train / 128 test images")) << describe(result);
}

// The first line names the arithmetic that runs (numerics.h): layout and precision on the CPU.
TEST(CliRun, FirstLineSaysTheLayoutAndPrecision) {
  const auto data = testing::real_data_dir();
  if (!data) GTEST_SKIP() << "no Fashion-MNIST found (set DPTRAIN_DATA or install it)";
  const auto result =
      run_dptrain({"train",      "--devices",     "cpu", "--width",      "2",  "--epochs",
                   "1",          "--train-limit", "64",  "--test-limit", "32", "--batch-size",
                   "32",         "--threads",     "1",   "--max-steps",  "1",  "--memory-format",
                   "contiguous", "--amp",         "bf16",  "--momentum", "0.9", "--ema",
                   "0.99"},
                  {}, 300);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto first_line = result.out.substr(0, result.out.find('\n'));
  EXPECT_TRUE(contains(first_line, "; width 2; rank 0 of 1; cpu: contiguous, bf16 autocast"))
      << first_line;
  // A recipe beyond the book's is named at the end, and so is what --ema evaluates and saves.
  EXPECT_TRUE(contains(first_line, "; recipe: --momentum 0.9 --ema 0.99; evaluated and saved: "
                                   "the weights' moving average"))
      << first_line;
  EXPECT_EQ(first_line.find("recipe"), first_line.rfind("recipe")) << first_line;
}

// --conv-bias-grad fused takes effect only where the fused BatchNorm trains (the CPU in
// channels-last, without --sync-bn), and the first line says so there and nowhere else.
TEST(CliRun, FirstLineSaysConvBiasGradientsFusedOnlyWhereTheyAre) {
  if (!detect_cpu_kernels().runs_avx2()) {
    GTEST_SKIP() << "channels-last is refused on this CPU: "
                 << detect_cpu_kernels().describe_avx2();
  }
  const std::vector<std::string> tiny{
      "train",       "--data-dir", tiny_data_dir(), "--width", "2", "--epochs", "1",
      "--max-steps", "1",          "--threads",     "1"};
  const auto first_line = [&](const std::vector<std::string>& more) {
    std::vector<std::string> args = tiny;
    args.insert(args.end(), more.begin(), more.end());
    const auto result = run_dptrain(args, {}, 300);
    EXPECT_EQ(result.exit_code, 0) << describe(result);
    return result.out.substr(0, result.out.find('\n'));
  };
  const std::string said = ", conv bias gradients fused";
  const std::vector<std::string> fused{"--conv-bias-grad", "fused"};
  const auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), fused.begin(), fused.end());
    return more;
  };
  const auto cl = first_line(with({"--devices", "cpu", "--memory-format", "channels-last"}));
  EXPECT_TRUE(contains(cl, "cpu: channels-last, fp32" + said + "; ")) << cl;
  const auto fast = first_line({"--devices", "cpu", "--recipe", "fast"});
  EXPECT_TRUE(contains(fast, said)) << fast;
  for (const auto& more :
       {with({"--devices", "cpu", "--memory-format", "contiguous"}),
        with({"--devices", "cpu,cpu", "--memory-format", "channels-last", "--sync-bn"}),
        std::vector<std::string>{"--devices", "cpu", "--memory-format", "channels-last"},
        std::vector<std::string>{"--devices", "cpu", "--recipe", "fast", "--conv-bias-grad",
                                 "library"}}) {
    const auto line = first_line(more);
    EXPECT_FALSE(contains(line, "conv bias")) << line;
  }
}

// Where oneDNN has no bf16 units to run on (here: its ISA cap at AVX2, as on an AVX2-only
// EPYC), --amp bf16 still trains, and the first line says it runs without them.
TEST(CliRun, Bf16WithoutBf16UnitsTrainsAndTheFirstLineSaysSo) {
  const auto data = testing::real_data_dir();
  if (!data) GTEST_SKIP() << "no Fashion-MNIST found (set DPTRAIN_DATA or install it)";
  const auto result = run_dptrain(
      {"train", "--devices", "cpu", "--width", "2", "--epochs", "1", "--train-limit", "64",
       "--test-limit", "32", "--batch-size", "32", "--threads", "1", "--amp", "bf16"},
      {{"ONEDNN_MAX_CPU_ISA", "AVX2"}}, 300);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto first_line = result.out.substr(0, result.out.find('\n'));
  EXPECT_TRUE(contains(first_line, "; cpu: contiguous, bf16 autocast without bf16 units ("))
      << first_line;
  EXPECT_FALSE(contains(first_line, "recipe")) << first_line;  // the book's says nothing of it
  EXPECT_TRUE(contains(result.out, "test acc: ")) << describe(result);
}

TEST(CliRun, RealDataTwoCpuReplicas) {
  const auto data = testing::real_data_dir();
  if (!data) GTEST_SKIP() << "no Fashion-MNIST found (set DPTRAIN_DATA or install it)";
  const auto result = run_dptrain(
      {"train", "--devices", "cpu,cpu", "--width", "4", "--epochs", "1", "--train-limit", "256",
       "--test-limit", "128", "--batch-size", "64", "--threads", "1"},
      {}, 300);
  expect_successful_run(result, 1, kFinalLineTwoCpus);
}

TEST(CliRun, TinyDataTwoEpochsSavesTheModel) {
  TempDir out;
  const std::string model = out.file("model.safetensors");
  const auto result =
      run_dptrain({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu", "--width", "1",
                   "--epochs", "2", "--batch-size", "4", "--threads", "1", "--save-model", model});
  expect_successful_run(result, 2, kFinalLineOneCpu);
  EXPECT_TRUE(dptrain::testing::is_regular_file(model)) << describe(result);
  EXPECT_GT(dptrain::testing::file_size(model), 0);
  EXPECT_EQ(dptrain::testing::temporary_files_in(out.path()), std::vector<std::string>{});
}

// The steady pace (median of epochs 2..N) is printed just before the book's final line and
// recorded per epoch in --metrics, missing for the first epoch.
TEST(CliRun, SteadyPaceIsPrintedBeforeTheFinalLineAndRecorded) {
  TempDir out;
  const std::string metrics = out.file("m.csv");
  const auto result =
      run_dptrain({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu", "--width", "1",
                   "--epochs", "3", "--batch-size", "4", "--threads", "1", "--metrics", metrics});
  expect_successful_run(result, 3, kFinalLineOneCpu);
  const auto lines = split_lines(result.out);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_TRUE(std::regex_match(lines[lines.size() - 2],
                               std::regex(R"(^median of epochs 2-3: [0-9.e-]+ sec/epoch )"
                                          R"(\(epoch 1: [0-9.e-]+ s\); the book's line below )"
                                          R"(is the mean of epochs 1-3$)")))
      << describe(result);
  // epoch,...,seconds (6th),images_per_second,lr,steady_seconds (9th),wall_ms_per_step,
  // gpu_ms_per_step,tflops (12th),mfu,peak_host_bytes,peak_device_bytes,gpu_samples_dropped,
  // gpu_spin_ms,devices,val_loss (19th),val_acc,eval_seconds
  const auto rows = split_lines(dptrain::testing::read_text(metrics));
  ASSERT_EQ(rows.size(), 4u) << dptrain::testing::read_text(metrics);
  std::vector<std::vector<std::string>> fields;
  for (size_t i = 1; i < rows.size(); ++i) {
    std::vector<std::string> row;
    std::stringstream stream(rows[i]);
    for (std::string field; std::getline(stream, field, ',');) row.push_back(field);
    ASSERT_EQ(row.size(), 21u) << rows[i];
    fields.push_back(row);
  }
  EXPECT_EQ(fields[0][8], "") << rows[1];
  // The wall pace per step: the epoch's seconds over its steps (the same count every epoch);
  // no GPU time on the CPU.
  for (const auto& row : fields) {
    const double steps = std::stod(row[5]) * 1000 / std::stod(row[9]);
    EXPECT_NEAR(steps, std::round(steps), 1e-6 * steps) << row[9];
    EXPECT_EQ(std::round(steps),
              std::round(std::stod(fields[0][5]) * 1000 / std::stod(fields[0][9])));
    EXPECT_EQ(row[10], "");
    // The achieved TFLOP/s: 3 forward passes of 236,608 FLOPs (width 1 at 28x28, model/flops.h)
    // for every image the epoch trained on; no MFU on a CPU without --peak-tflops, a process
    // peak but no GPU peak.
    EXPECT_NEAR(std::stod(row[11]) * 1e12, 3.0 * 236608 * std::stod(row[6]),
                1e-9 * 3.0 * 236608 * std::stod(row[6]))
        << rows[1];
    EXPECT_EQ(row[12], "");
    EXPECT_GT(std::stod(row[13]), 1e6);
    EXPECT_EQ(row[14], "");
    EXPECT_EQ(row[15], "");  // nothing timed on the CPU: no drops, no spins
    EXPECT_EQ(row[16], "");
    EXPECT_EQ(row[18], "");  // no validation set
    EXPECT_EQ(row[19], "");
    EXPECT_GE(std::stod(row[20]), 0);  // the evaluation's seconds
  }
  EXPECT_EQ(std::stod(fields[1][8]), std::stod(fields[1][5])) << rows[2];
  EXPECT_DOUBLE_EQ(std::stod(fields[2][8]), (std::stod(fields[1][5]) + std::stod(fields[2][5])) / 2)
      << rows[3];
}

// --val-split 4 of the tiny set's 16 training images: the first line counts the three sets, the
// epoch line shows the validation accuracy (a multiple of 1/4) after the test's, and the metrics
// file records it; holding out every image is a usage error, in one line.
TEST(CliRun, ValSplitHoldsOutImagesAndReportsTheirAccuracy) {
  TempDir out;
  const std::string metrics = out.file("m.csv");
  const std::vector<std::string> args{"train",    "--data-dir", tiny_data_dir(), "--devices",
                                      "cpu",      "--width",    "1",             "--epochs",
                                      "1",        "--threads",  "1",             "--batch-size",
                                      "4",        "--metrics",  metrics,         "--val-split"};
  auto with = [&](const std::string& n) {
    auto a = args;
    a.push_back(n);
    return a;
  };
  const auto result = run_dptrain(with("4"));
  expect_successful_run(result, 1, kFinalLineOneCpu);
  EXPECT_TRUE(contains(result.out, "dptrain: 12 train / 4 validation / 8 test images from "))
      << describe(result);
  std::smatch line;
  ASSERT_TRUE(std::regex_search(result.out, line,
                                std::regex(R"(test acc [0-9.]+, val acc ([0-9.]+), [0-9.]+ s, )")))
      << describe(result);
  const auto rows = split_lines(dptrain::testing::read_text(metrics));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_TRUE(contains(rows[0], ",devices,val_loss,val_acc,eval_seconds")) << rows[0];
  std::vector<std::string> row;
  std::stringstream stream(rows[1]);
  for (std::string field; std::getline(stream, field, ',');) row.push_back(field);
  ASSERT_EQ(row.size(), 21u) << rows[1];
  const double val_acc = std::stod(row[19]);
  EXPECT_EQ(val_acc * 4, std::round(val_acc * 4)) << row[19];
  char shown[16];
  std::snprintf(shown, sizeof shown, "%.4f", val_acc);
  EXPECT_EQ(line[1].str(), shown);
  EXPECT_GE(std::stod(row[18]), 0);  // the validation loss
  expect_one_error_line(run_dptrain(with("16")), kUsage,
                        "--val-split 16: must be from 0 to 15, fewer than the 16 training images");
}

TEST(CliRun, MaxStepsStopsEarly) {
  const auto result =
      run_dptrain({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu", "--width", "1",
                   "--epochs", "5", "--batch-size", "4", "--threads", "1", "--max-steps", "1"});
  expect_no_crash(result);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_TRUE(contains(result.out, "epoch 1/5: ")) << describe(result);
  EXPECT_FALSE(contains(result.out, "epoch 2/5: ")) << describe(result);
}

// The path is checked before the first step, not first tried after the training, where the
// weights would be lost: a usage error, and no epoch runs.
TEST(CliRun, UnwritableSaveModelIsAUsageErrorBeforeTraining) {
  const std::string model = "/nonexistent-dptrain-dir/model.safetensors";
  const auto result =
      run_dptrain({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu", "--width", "1",
                   "--epochs", "1", "--batch-size", "4", "--threads", "1", "--save-model", model});
  expect_no_crash(result);
  EXPECT_EQ(result.exit_code, kUsage) << describe(result);
  EXPECT_FALSE(contains(result.out, "epoch 1/1")) << describe(result);
  const auto lines = split_lines(result.err);
  ASSERT_EQ(lines.size(), 1u) << describe(result);
  EXPECT_EQ(lines[0].rfind("error: ", 0), 0u) << describe(result);
  EXPECT_TRUE(contains(lines[0], model)) << describe(result);
}

// A bad --save-model must not leave rank 1 waiting out the whole collective timeout.
TEST(CliRun, UnwritableSaveModelWithTwoReplicasFailsPromptly) {
  const std::string model = "/nonexistent-dptrain-dir/model.safetensors";
  const auto start = std::chrono::steady_clock::now();
  const auto result =
      run_dptrain({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu,cpu", "--width", "1",
                   "--epochs", "1", "--batch-size", "4", "--threads", "1", "--save-model", model},
                  {}, 120);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect_no_crash(result);
  EXPECT_EQ(result.exit_code, kUsage) << describe(result);
  EXPECT_LT(seconds, 60) << describe(result);
  const auto lines = split_lines(result.err);
  ASSERT_EQ(lines.size(), 1u) << describe(result);
  EXPECT_TRUE(contains(lines[0], model)) << describe(result);
}

TEST(CliRun, DivergingTrainingIsARunTimeError) {
  const auto result =
      run_dptrain({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu", "--width", "1",
                   "--epochs", "1", "--batch-size", "2", "--threads", "1", "--lr", "1e30"});
  expect_no_crash(result);
  EXPECT_EQ(result.exit_code, kRunTime) << describe(result);
  const auto lines = split_lines(result.err);
  ASSERT_EQ(lines.size(), 1u) << describe(result);
  EXPECT_TRUE(contains(lines[0], "not finite")) << describe(result);
}

// ---- Checkpoints, stop signals, eval and progress output --------------------------------------

std::vector<std::string> checkpoints_in(const std::string& directory) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(directory.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("checkpoint-", 0) == 0) names.push_back(name);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Fake data big enough for a run that is still training when a signal comes: 64 steps an epoch.
const std::string& signal_data_dir() {
  static const TempDir dir;
  static const bool written = (write_fake_data(dir, 1024, 16), true);
  (void)written;
  return dir.path();
}

std::vector<std::string> long_run_args(const std::string& checkpoint_dir) {
  return {testing::dptrain_binary(),
          "train",
          "--data-dir",
          signal_data_dir(),
          "--devices",
          "cpu",
          "--width",
          "4",
          "--batch-size",
          "16",
          "--threads",
          "1",
          "--epochs",
          "1000",
          "--log-every",
          "1",
          "--checkpoint-dir",
          checkpoint_dir};
}

// Starts a long run, waits for its first progress line, sends `signal_number`, and checks that
// it finishes the step, writes a checkpoint and exits with 128 + the signal.
void expect_stop_by_signal(int signal_number) {
  TempDir dir;
  const std::string checkpoints = dir.file("checkpoints");
  const auto child = testing::spawn_command(long_run_args(checkpoints), {}, dir.file("run"));
  bool training = false;
  for (int i = 0; i < 1200 && !training; ++i) {  // up to 60 s for the first step
    training = contains(read_text(child.err_path), " step ");
    if (!training) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(kill(child.pid, signal_number), 0);
  const auto result = testing::wait_command(child, 60);
  ASSERT_TRUE(training) << describe(result);
  EXPECT_FALSE(result.timed_out) << describe(result);
  EXPECT_EQ(result.exit_code, 128 + signal_number) << describe(result);
  // Ended by main's return, not killed by the signal: it says so, and names the checkpoint.
  const auto names = checkpoints_in(checkpoints);
  ASSERT_EQ(names.size(), 1u) << describe(result);
  const std::string path = checkpoints + "/" + names[0];
  EXPECT_TRUE(contains(result.err, "stopping after this step")) << describe(result);
  EXPECT_TRUE(contains(result.err, "dptrain: stopped by signal " + std::to_string(signal_number) +
                                       "; resume from " + path))
      << describe(result);
  EXPECT_TRUE(contains(result.out, "checkpoint: " + path)) << describe(result);
  EXPECT_FALSE(contains(result.err, "error:")) << describe(result);
  for (const char* marker : {"terminate called", "Exception raised from", "Segmentation"}) {
    EXPECT_FALSE(contains(result.err, marker)) << describe(result);
  }
  const auto checkpoint = read_checkpoint(path);
  EXPECT_EQ(checkpoint.config.width, 4);
  EXPECT_GT(checkpoint.global_step, 0);
  EXPECT_EQ(names[0], checkpoint_file_name(checkpoint.epochs_done, checkpoint.step_in_epoch));

  // The run resumes from it and finishes (one epoch in all).
  auto resume = long_run_args(checkpoints);
  const auto epochs = std::find(resume.begin(), resume.end(), "--epochs");
  ASSERT_NE(epochs, resume.end());
  *(epochs + 1) = "1";
  resume.push_back("--resume");
  const auto resumed = testing::run_command(resume, {}, 120);
  expect_no_crash(resumed);
  EXPECT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_TRUE(contains(resumed.out, "resuming from " + path)) << describe(resumed);
  EXPECT_TRUE(std::regex_search(resumed.out, std::regex("\ntest acc: [0-9]\\.[0-9]{2}, ")))
      << describe(resumed);
}

TEST(CliSignals, SigintFinishesTheStepWritesACheckpointAndExits130) {
  expect_stop_by_signal(SIGINT);
}

TEST(CliSignals, SigtermFinishesTheStepWritesACheckpointAndExits143) {
  expect_stop_by_signal(SIGTERM);
}

TEST(CliCheckpoints, ResumeWithoutCheckpointDirIsAUsageError) {
  expect_one_error_line(run_dptrain({"train", "--data-dir", tiny_data_dir(), "--resume"}), kUsage,
                        "--resume needs --checkpoint-dir");
}

// The "test acc X" of an epoch line, as printed.
std::vector<std::string> epoch_test_accuracies(const std::string& out) {
  std::vector<std::string> found;
  const std::regex pattern("^epoch [0-9]+/[0-9]+: .*, test acc ([0-9]\\.[0-9]{4}), ");
  for (const auto& line : split_lines(out)) {
    std::smatch match;
    if (std::regex_search(line, match, pattern)) found.push_back(match[1]);
  }
  return found;
}

TEST(CliEval, CheckpointGivesTheTrainingsTestAccuracy) {
  const auto data = testing::real_data_dir();
  if (!data) GTEST_SKIP() << "no Fashion-MNIST found (set DPTRAIN_DATA or install it)";
  TempDir dir;
  const std::vector<std::string> common{"--data-dir",   *data, "--devices",    "cpu",
                                        "--threads",    "1",   "--test-limit", "200",
                                        "--batch-size", "32"};
  std::vector<std::string> train_args{"train",   "--width",       "4",   "--epochs",
                                      "2",       "--train-limit", "320", "--checkpoint-dir",
                                      dir.path()};
  train_args.insert(train_args.end(), common.begin(), common.end());
  const auto trained = run_dptrain(train_args, {}, 300);
  expect_no_crash(trained);
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  const auto accuracies = epoch_test_accuracies(trained.out);
  ASSERT_EQ(accuracies.size(), 2u) << describe(trained);
  for (int epoch = 1; epoch <= 2; ++epoch) {
    SCOPED_TRACE("epoch " + std::to_string(epoch));
    std::vector<std::string> eval_args{"eval", "--checkpoint",
                                       dir.file(checkpoint_file_name(epoch, 0))};
    eval_args.insert(eval_args.end(), common.begin(), common.end());
    const auto eval = run_dptrain(eval_args, {}, 120);
    expect_no_crash(eval);
    ASSERT_EQ(eval.exit_code, 0) << describe(eval);
    const auto lines = split_lines(eval.out);
    ASSERT_EQ(lines.size(), 1u) << describe(eval);
    EXPECT_EQ(lines[0].rfind(
                  "test acc: " + accuracies[static_cast<size_t>(epoch - 1)] + ", test loss ", 0),
              0u)
        << "training printed test acc " << accuracies[static_cast<size_t>(epoch - 1)] << "\n"
        << describe(eval);
    EXPECT_TRUE(contains(lines[0], "(200 images) on [cpu]")) << describe(eval);
  }
}

TEST(CliEval, NeedsExactlyOneOfCheckpointAndModel) {
  expect_one_error_line(run_dptrain({"eval", "--data-dir", tiny_data_dir()}), kUsage,
                        "exactly one of --checkpoint FILE and --model FILE");
  expect_one_error_line(run_dptrain({"eval", "--data-dir", tiny_data_dir(), "--checkpoint", "a.dpt",
                                     "--model", "b.pt"}),
                        kUsage, "exactly one of --checkpoint FILE and --model FILE");
  expect_one_error_line(
      run_dptrain({"eval", "--data-dir", tiny_data_dir(), "--checkpoint", "a.dpt", "--width", "8"}),
      kUsage, "--width");
}

TEST(CliEval, CorruptOrForeignCheckpointIsOneErrorLineNamingTheFile) {
  TempDir dir;
  const std::string garbage = dir.file("garbage.dpt");
  testing::write_bytes(garbage, {'n', 'o', 't', ' ', 'o', 'u', 'r', 's'});
  expect_one_error_line(run_dptrain({"eval", "--data-dir", tiny_data_dir(), "--devices", "cpu",
                                     "--checkpoint", garbage}),
                        kRunTime, garbage + ": not a dptrain checkpoint");

  // A real checkpoint with one byte changed.
  const auto trained = run_dptrain({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu",
                                    "--width", "1", "--epochs", "1", "--batch-size", "4",
                                    "--threads", "1", "--quiet", "--checkpoint-dir", dir.path()});
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  const std::string path = dir.file(checkpoint_file_name(1, 0));
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() / 2] ^= 0x04;
  testing::write_bytes(path, bytes);
  expect_one_error_line(run_dptrain({"eval", "--data-dir", tiny_data_dir(), "--devices", "cpu",
                                     "--checkpoint", path}),
                        kRunTime, path + ": corrupt");
  expect_one_error_line(run_dptrain({"eval", "--data-dir", tiny_data_dir(), "--devices", "cpu",
                                     "--checkpoint", dir.file("absent.dpt")}),
                        kRunTime, dir.file("absent.dpt"));
}

// The steps at which `text` has a plain progress line, as "epoch/step".
std::vector<std::string> progress_steps(const std::string& text) {
  std::vector<std::string> steps;
  const std::regex pattern(
      "^epoch ([0-9]+)/[0-9]+ step ([0-9]+)/[0-9]+: loss [0-9.]+, acc [0-9.]+, [0-9]+ img/s, "
      "[0-9]+ s left$");
  for (const auto& line : split_lines(text)) {
    if (line.rfind("epoch ", 0) != 0) continue;  // a library's warning, say
    std::smatch match;
    if (std::regex_match(line, match, pattern)) {
      steps.push_back(match[1].str() + "/" + match[2].str());
    } else {
      ADD_FAILURE() << "not a whole progress line: '" << line << "'";
    }
  }
  return steps;
}

TEST(CliProgress, PipedStderrGetsPlainLinesEveryLogEverySteps) {
  // 16 examples in batches of 4: four steps an epoch, a line every 2 steps.
  const auto result =
      run_dptrain({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu", "--width", "1",
                   "--epochs", "2", "--batch-size", "4", "--threads", "1", "--log-every", "2"});
  expect_successful_run(result, 2, kFinalLineOneCpu);
  for (const std::string* text : {&result.out, &result.err}) {
    EXPECT_FALSE(contains(*text, "\r")) << describe(result);
    EXPECT_FALSE(contains(*text, "\033")) << describe(result);
  }
  EXPECT_EQ(progress_steps(result.err), (std::vector<std::string>{"1/2", "1/4", "2/2", "2/4"}))
      << describe(result);

  const auto every_step =
      run_dptrain({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu", "--width", "1",
                   "--epochs", "1", "--batch-size", "4", "--threads", "1", "--log-every", "1"});
  ASSERT_EQ(every_step.exit_code, 0) << describe(every_step);
  EXPECT_EQ(progress_steps(every_step.err), (std::vector<std::string>{"1/1", "1/2", "1/3", "1/4"}))
      << describe(every_step);
}

TEST(CliProgress, QuietPrintsOnlyTheFinalLine) {
  TempDir dir;
  const auto result =
      run_dptrain({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu", "--width", "1",
                   "--epochs", "2", "--batch-size", "4", "--threads", "1", "--log-every", "1",
                   "--quiet", "--checkpoint-dir", dir.path()});
  expect_no_crash(result);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto lines = split_lines(result.out);
  ASSERT_EQ(lines.size(), 1u) << describe(result);
  EXPECT_TRUE(std::regex_match(lines[0], kFinalLineOneCpu)) << describe(result);
  EXPECT_EQ(result.err, "") << describe(result);
  // Quiet is about output only: the checkpoints are still written.
  EXPECT_EQ(checkpoints_in(dir.path()),
            (std::vector<std::string>{checkpoint_file_name(1, 0), checkpoint_file_name(2, 0)}));
}

// ---- Hostile environments: small stacks, users without permission, launchers, outputs ------

// Under `ulimit -s 1024` a 4,000-character "--data-dir=..." would overflow the stack in cxxopts'
// regex (SIGSEGV, exit 139). Parsing does not recurse per character: with a 1 MiB stack the
// longest arguments the system passes are ordinary mistakes.
TEST(CliStack, LongArgumentsUnderAOneMebibyteStackAreOrdinaryErrors) {
  testing::ChildSetup small_stack;
  small_stack.stack_limit_bytes = 1 << 20;
  const auto run = [&](const std::vector<std::string>& args) {
    std::vector<std::string> command{testing::dptrain_binary()};
    command.insert(command.end(), args.begin(), args.end());
    return testing::run_command(command, {}, 120, small_stack);
  };
  const std::string path(4000, 'd');
  // A 4000-character name: the system's limit is 255 per component.
  expect_one_error_line(run({"train", "--data-dir=" + path}), kRunTime, "File name too long");
  const std::string nested = "/nonexistent" + std::string(2000, '/') + "x";
  expect_one_error_line(run({"train", "--data-dir=" + nested}), kRunTime, "does not hold");
  const std::string huge(120000, 'a');
  expect_one_error_line(run({"train", "--data-dir=" + huge}), kUsage, "longer than the system");
  expect_one_error_line(run({"train", "--" + huge}), kUsage, "unknown flag");
  expect_one_error_line(run({"train", "--devices=" + huge}), kUsage, "--devices");
  expect_one_error_line(run({"download", "--url=" + huge}), kUsage, "is not supported");
}

// A data directory the user may not enter was reported as missing files, with advice to install
// a package. Run as an unprivileged user (nobody, when the tests run as root as in CI, where
// permissions do not bite), it names the directory and the cause. Nobody runs a copy of the
// binary that it may reach: the build tree may lie in a folder only root may enter (/root, a
// `mktemp -d` folder), and where the clone lies is no reason to skip.
TEST(CliDataPermissions, DirectoryTheUserCannotEnterIsNamed) {
  TempDir data;  // made with mode 0700: as root's, nobody may not enter it
  write_fake_data(data, 16, 8);
  testing::ChildSetup setup;
  std::string binary = testing::dptrain_binary();
  std::map<std::string, std::string> environment;
  std::unique_ptr<testing::ProgramCopyForAnyUser> copy;
  if (::geteuid() == 0) {
    setup.run_as_uid = 65534;
    setup.run_as_gid = 65534;
    copy = std::make_unique<testing::ProgramCopyForAnyUser>(binary);
    binary = copy->path();
    environment = copy->sanitizer_environment();  // under scripts/sanitize.sh
  } else {
    ASSERT_EQ(::chmod(data.path().c_str(), 0), 0);
  }
  const auto result = testing::run_command({binary, "train", "--data-dir", data.path(), "--devices",
                                            "cpu", "--width", "1", "--epochs", "1", "--threads", "1"},
                                           environment, 120, setup);
  ::chmod(data.path().c_str(), 0700);
  // Only root's switch to another user can fail here (a user namespace without uid 65534), and
  // that skip is not expected anywhere: tests/check_skips.py then fails the run naming it.
  if (result.exit_code == testing::kChildSetupFailed) {
    GTEST_SKIP() << "cannot run dptrain as an unprivileged user here: " << result.err;
  }
  expect_one_error_line(result, kRunTime,
                        "--data-dir " + data.path() + ": cannot enter directory " + data.path() +
                            ": Permission denied");
  EXPECT_FALSE(contains(result.err, "install")) << describe(result);
}

// The copy nobody runs above is reachable wherever the clone lies: a directory every user may
// enter, outside a folder that only its owner may enter, and removed afterwards.
TEST(CliDataPermissions, TheProgramCopyForAnotherUserIsReachableFromAPrivateFolder) {
  TempDir private_folder;  // mode 0700, as mkdtemp makes it
  ASSERT_EQ(::chmod(private_folder.path().c_str(), 0700), 0);
  const std::string inner = private_folder.file("build");
  testing::make_directories(inner);
  const std::string program = inner + "/program";
  testing::write_bytes(program, {'#', '!', '/', 'b', 'i', 'n', '/', 's', 'h', '\n'});
  ASSERT_FALSE(testing::searchable_by_others(inner));
  std::string copied_directory;
  {
    testing::ProgramCopyForAnyUser copy(program);
    copied_directory = copy.directory();
    EXPECT_TRUE(testing::searchable_by_others(copy.directory())) << copy.directory();
    EXPECT_EQ(copy.path(), copy.directory() + "/program");
    EXPECT_EQ(testing::read_text(copy.path()), "#!/bin/sh\n");
    struct stat info {};
    ASSERT_EQ(::stat(copy.path().c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 07777, 0755u);
    // A suppressions file inside the private folder is given to the other user as a copy.
    const std::string suppressions = private_folder.file("lsan.supp");
    testing::write_bytes(suppressions, {'#', '\n'});
    const char* before = std::getenv("LSAN_OPTIONS");
    const std::string saved = before ? before : "";
    ::setenv("LSAN_OPTIONS", ("suppressions=" + suppressions + ":print_suppressions=0").c_str(), 1);
    const auto environment = copy.sanitizer_environment();
    if (before != nullptr) {
      ::setenv("LSAN_OPTIONS", saved.c_str(), 1);
    } else {
      ::unsetenv("LSAN_OPTIONS");
    }
    ASSERT_EQ(environment.count("LSAN_OPTIONS"), 1u);
    EXPECT_EQ(environment.at("LSAN_OPTIONS"),
              "suppressions=" + copy.directory() + "/LSAN_OPTIONS.supp:print_suppressions=0");
    EXPECT_EQ(testing::read_text(copy.directory() + "/LSAN_OPTIONS.supp"), "#\n");
  }
  EXPECT_FALSE(testing::path_exists(copied_directory));
}

// An unresolvable MASTER_ADDR waited out the whole --timeout (300 s) behind LibTorch's log
// lines and then blamed a timeout. It fails at once, naming the variable and the host; a port
// out of range is a usage error.
TEST(CliErrorsEnvironment, UnresolvableMasterAddrFailsAtOnceNamingIt) {
  const auto start = std::chrono::steady_clock::now();
  const auto result = run_dptrain({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu",
                                   "--width", "1", "--epochs", "1", "--threads", "1"},
                                  {{"RANK", "1"},
                                   {"WORLD_SIZE", "2"},
                                   {"MASTER_ADDR", "no-such-host.invalid"},
                                   {"MASTER_PORT", std::to_string(testing::free_port())}},
                                  120);
  expect_one_error_line(result, kRunTime,
                        "rank 1: MASTER_ADDR=no-such-host.invalid does not resolve");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  for (const char* port : {"0", "65536", "-1", "http"}) {
    expect_one_error_line(
        run_dptrain({"train", "--data-dir", tiny_data_dir()}, {{"RANK", "0"},
                                                               {"WORLD_SIZE", "2"},
                                                               {"MASTER_ADDR", "127.0.0.1"},
                                                               {"MASTER_PORT", port}}),
        kUsage, std::string("MASTER_PORT=") + port);
  }
}

// A 0-image test set must not report "test acc: 0.00" and exit 0, nor a 0-image training set
// fail with "BatchAssembler needs a positive batch size". Each is a data error naming the file
// and the count, for train and for eval.
TEST(CliEmptyData, ZeroImagesIsADataErrorNamingTheFile) {
  TempDir out;
  const std::string model = out.file("model.safetensors");
  ASSERT_EQ(run_dptrain({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu", "--width", "1",
                         "--epochs", "1", "--threads", "1", "--save-model", model})
                .exit_code,
            0);
  for (const char* empty : {kTrainImages, kTestImages}) {
    SCOPED_TRACE(empty);
    TempDir dir;
    write_fake_data(dir, 16, 8);
    const bool train_set = std::string(empty) == kTrainImages;
    testing::write_bytes(dir.file(empty), fake_images(0));
    testing::write_bytes(dir.file(train_set ? kTrainLabels : kTestLabels), fake_labels(0));
    const std::string message = dir.file(empty) + ": holds 0 images";
    expect_one_error_line(run_dptrain({"train", "--data-dir", dir.path(), "--devices", "cpu",
                                       "--width", "1", "--epochs", "1", "--threads", "1"}),
                          kRunTime, message);
    expect_one_error_line(run_dptrain({"eval", "--model", model, "--width", "1", "--data-dir",
                                       dir.path(), "--devices", "cpu", "--threads", "1"}),
                          kRunTime, message);
  }
}

// `dptrain ... | head -1` must not kill training by SIGPIPE (141) before it writes a checkpoint.
// SIGPIPE is ignored: the failed write asks for a stop like SIGTERM, the checkpoint is written,
// and the exit status is still 141, with one line saying why.
TEST(CliOutput, ClosedStdoutPipeStopsTheTrainingWithACheckpoint) {
  TempDir dir;
  const std::string checkpoints = dir.file("checkpoints");
  auto args = long_run_args(checkpoints);
  *(std::find(args.begin(), args.end(), "--log-every") + 1) = "100000";  // stderr stays quiet
  std::vector<std::string> command{"bash", "-c", R"("$0" "$@" | head -n 1; exit ${PIPESTATUS[0]})"};
  command.insert(command.end(), args.begin(), args.end());
  const auto result = testing::run_command(command, {}, 300);
  EXPECT_FALSE(result.timed_out) << describe(result);
  EXPECT_FALSE(contains(result.err, "terminate called")) << describe(result);
  EXPECT_EQ(result.exit_code, 128 + SIGPIPE) << describe(result);
  EXPECT_EQ(split_lines(result.out).size(), 1u) << describe(result);  // what head printed
  const auto names = checkpoints_in(checkpoints);
  ASSERT_FALSE(names.empty()) << describe(result);
  const std::string newest = checkpoints + "/" + names.back();
  EXPECT_TRUE(contains(result.err,
                       "dptrain: standard output is a closed pipe; stopped early; "
                       "resume from " +
                           newest))
      << describe(result);
  EXPECT_FALSE(contains(result.err, "error:")) << describe(result);
  EXPECT_GT(read_checkpoint(newest).global_step, 0);
}

// With stdout on /dev/full the result line is lost, so the run must not exit 0. A failed write
// to stdout is one line on stderr and exit status 1, for every command that prints.
TEST(CliOutput, FullStdoutIsARunTimeError) {
  testing::ChildSetup full;
  full.stdout_path = "/dev/full";
  const auto run = [&](const std::vector<std::string>& args) {
    std::vector<std::string> command{testing::dptrain_binary()};
    command.insert(command.end(), args.begin(), args.end());
    return testing::run_command(command, {}, 120, full);
  };
  const std::string message = "cannot write to standard output: No space left on device";
  expect_one_error_line(run({"--help"}), kRunTime, message);
  expect_one_error_line(run({"train", "--help"}), kRunTime, message);
  const auto quiet = run({"train", "--data-dir", tiny_data_dir(), "--devices", "cpu", "--width",
                          "1", "--epochs", "1", "--threads", "1", "--quiet"});
  expect_one_error_line(quiet, kRunTime, message + "; the result line is lost");
  // Not quiet: the first line fails, the training stops after a step and keeps its checkpoint.
  TempDir dir;
  const auto loud = run({"train", "--data-dir", signal_data_dir(), "--devices", "cpu", "--width",
                         "1", "--epochs", "5", "--batch-size", "16", "--threads", "1",
                         "--log-every", "100000", "--checkpoint-dir", dir.path()});
  expect_one_error_line(loud, kRunTime, message + "; stopped early; resume from " + dir.path());
  EXPECT_EQ(checkpoints_in(dir.path()).size(), 1u) << describe(loud);
}

// ---- Lost work ------------------------------------------------------------------------------

// A resumed run prints the epochs it runs, then the final line.
void expect_resumed_run(const CommandResult& result) {
  expect_no_crash(result);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_TRUE(contains(result.out, "resuming from ")) << describe(result);
  const auto lines = split_lines(result.out);
  ASSERT_FALSE(lines.empty()) << describe(result);
  EXPECT_TRUE(std::regex_match(lines.back(), kFinalLineOneCpu)) << describe(result);
}

std::vector<std::string> tiny_run(const std::vector<std::string>& more) {
  std::vector<std::string> args{testing::dptrain_binary(),
                                "train",
                                "--data-dir",
                                tiny_data_dir(),
                                "--devices",
                                "cpu",
                                "--width",
                                "1",
                                "--epochs",
                                "1",
                                "--batch-size",
                                "4",
                                "--threads",
                                "1"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Under `ulimit -f` a model or checkpoint write died by SIGXFSZ (exit 153) with no error line and
// a temporary file left. Now: one error line naming the file and the cause, exit 1, nothing left.
TEST(CliLostWork, WritesPastTheFileSizeLimitAreOneErrorLineAndLeaveNothing) {
  testing::ChildSetup small_files;
  small_files.file_size_limit_bytes = 16 * 1024;  // below a width-1 model or checkpoint
  TempDir dir;
  // The training runs (its epoch line is printed); the write after it fails.
  const auto expect_failed_write = [](const CommandResult& result, const std::string& message) {
    expect_no_crash(result);
    EXPECT_EQ(result.exit_code, kRunTime) << describe(result);
    const auto lines = split_lines(result.err);
    ASSERT_EQ(lines.size(), 1u) << describe(result);
    EXPECT_EQ(lines[0].rfind("error: ", 0), 0u) << describe(result);
    EXPECT_TRUE(contains(lines[0], message)) << describe(result);
    EXPECT_TRUE(contains(lines[0], std::strerror(EFBIG))) << describe(result);
  };
  const std::string model = dir.file("m.safetensors");
  expect_failed_write(testing::run_command(tiny_run({"--save-model", model}), {}, 120, small_files),
                      "--save-model " + model + ": cannot write");
  const std::string checkpoints = dir.file("ck");
  expect_failed_write(
      testing::run_command(tiny_run({"--checkpoint-dir", checkpoints}), {}, 120, small_files),
      "checkpoint " + checkpoints + "/" + checkpoint_file_name(1, 0) + ": cannot write");
  EXPECT_FALSE(testing::path_exists(model));
  EXPECT_EQ(testing::temporary_files_in(dir.path()), std::vector<std::string>{});
  EXPECT_EQ(testing::temporary_files_in(checkpoints), std::vector<std::string>{});
  EXPECT_EQ(checkpoints_in(checkpoints), std::vector<std::string>{});
}

// A FIFO given as a file to read would hang a blocking open for ever (SIGTERM would not end it),
// as --metrics too. Each is refused at once, naming the FIFO.
TEST(CliLostWork, FifosAreRefusedAtOnce) {
  TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  const auto start = std::chrono::steady_clock::now();
  expect_one_error_line(run_dptrain({"eval", "--checkpoint", fifo, "--data-dir", tiny_data_dir()}),
                        kRunTime, "checkpoint " + fifo + ": not a regular file (a FIFO)");
  expect_one_error_line(
      run_dptrain({"eval", "--model", fifo, "--width", "1", "--data-dir", tiny_data_dir()}),
      kRunTime, "--model " + fifo + ": not a regular file (a FIFO)");
  const std::string fifo_csv = dir.file("m.csv");
  ASSERT_EQ(::mkfifo(fifo_csv.c_str(), 0644), 0) << std::strerror(errno);
  expect_one_error_line(testing::run_command(tiny_run({"--metrics", fifo_csv}), {}, 60), kUsage,
                        "--metrics " + fifo_csv + ": is a FIFO");
  // Named like a checkpoint in --checkpoint-dir: --resume reads it as unreadable, without hanging.
  const std::string checkpoints = dir.file("ck");
  testing::make_directories(checkpoints);
  ASSERT_EQ(::mkfifo((checkpoints + "/" + checkpoint_file_name(1, 0)).c_str(), 0644), 0);
  expect_one_error_line(
      testing::run_command(tiny_run({"--checkpoint-dir", checkpoints, "--resume"}), {}, 60), kUsage,
      "no checkpoint in " + checkpoints + " can be read");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(50));
}

// A second run in a checkpoint directory that a run is using would overwrite its checkpoints:
// refused, naming the holder.
TEST(CliLostWork, SecondRunInTheSameCheckpointDirectoryIsRefusedNamingTheHolder) {
  TempDir dir;
  const std::string checkpoints = dir.file("ck");
  // No end-of-epoch checkpoint: a fast CPU finishes the first 1,024-image epoch while the second
  // run starts and is refused, and the one checkpoint counted below is the stop's.
  auto first_args = long_run_args(checkpoints);
  first_args.insert(first_args.end(), {"--checkpoint-every", "1000"});
  const auto first = testing::spawn_command(first_args, {}, dir.file("first"));
  bool training = false;
  for (int i = 0; i < 1200 && !training; ++i) {  // up to 60 s for the first step
    training = contains(read_text(first.err_path), " step ");
    if (!training) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto second_args = long_run_args(checkpoints);
  second_args.push_back("--resume");
  const auto second = testing::run_command(second_args, {}, 60);
  ASSERT_EQ(kill(first.pid, SIGTERM), 0);
  const auto first_result = testing::wait_command(first, 60);
  ASSERT_TRUE(training) << describe(first_result);
  expect_one_error_line(second, kUsage,
                        "--checkpoint-dir " + checkpoints +
                            " is in use by another dptrain run (pid " + std::to_string(first.pid) +
                            " on ");
  // The first run was not disturbed: it stops on SIGTERM with its checkpoint.
  EXPECT_EQ(first_result.exit_code, 128 + SIGTERM) << describe(first_result);
  EXPECT_EQ(checkpoints_in(checkpoints).size(), 1u) << describe(first_result);
}

// --resume with only unreadable checkpoints must not start from scratch and overwrite them: it
// refuses, naming the file and why; --fresh starts over and says what it removed. A
// directory holding checkpoints needs one of --resume and --fresh.
TEST(CliLostWork, UnreadableCheckpointsAreNeverOverwrittenSilently) {
  TempDir dir;
  const std::string checkpoints = dir.file("ck");
  testing::make_directories(checkpoints);
  const std::string junk = checkpoints + "/" + checkpoint_file_name(1, 0);
  // A checkpoint cut short after its magic: dptrain's own, unreadable. (--fresh leaves a file
  // without the magic alone: HostileFresh.)
  const std::string junk_text = "DPTRNCKPcut";
  const std::vector<uint8_t> junk_bytes(junk_text.begin(), junk_text.end());
  testing::write_bytes(junk, junk_bytes);
  expect_one_error_line(
      testing::run_command(tiny_run({"--checkpoint-dir", checkpoints, "--resume"}), {}, 60), kUsage,
      "--resume: no checkpoint in " + checkpoints + " can be read (checkpoint " + junk +
          ": truncated");
  expect_one_error_line(testing::run_command(tiny_run({"--checkpoint-dir", checkpoints}), {}, 60),
                        kUsage,
                        "--checkpoint-dir " + checkpoints + " already holds 1 checkpoint(s)");
  EXPECT_EQ(read_text(junk), junk_text);

  const auto fresh =
      testing::run_command(tiny_run({"--checkpoint-dir", checkpoints, "--fresh"}), {}, 120);
  expect_successful_run(fresh, 1, kFinalLineOneCpu);
  EXPECT_TRUE(contains(fresh.err, "dptrain: --fresh: removed " + junk)) << describe(fresh);
  const auto names = checkpoints_in(checkpoints);
  ASSERT_EQ(names, std::vector<std::string>{checkpoint_file_name(1, 0)}) << describe(fresh);
  EXPECT_EQ(read_checkpoint(junk).epochs_done, 1);

  // A readable epoch 1 and an unreadable epoch 2 that a resumed run would later save over.
  const std::string later = checkpoints + "/" + checkpoint_file_name(2, 0);
  testing::write_bytes(later, junk_bytes);
  expect_one_error_line(
      testing::run_command(tiny_run({"--checkpoint-dir", checkpoints, "--resume", "--epochs", "3"}),
                           {}, 60),
      kUsage, "--resume: checkpoint " + later + ": truncated");
  EXPECT_EQ(read_text(later), junk_text);
  // An unreadable file older than the start is skipped, and said so.
  ::unlink(later.c_str());
  const std::string older = checkpoints + "/" + checkpoint_file_name(0, 3);
  testing::write_bytes(older, junk_bytes);
  const auto resumed = testing::run_command(
      tiny_run({"--checkpoint-dir", checkpoints, "--resume", "--epochs", "2"}), {}, 120);
  expect_resumed_run(resumed);
  EXPECT_TRUE(contains(
      resumed.err, "dptrain: --resume: skipped checkpoint " + older + ": truncated"))
      << describe(resumed);
  EXPECT_EQ(read_text(older), junk_text);
}

// The size of the training set is not enough: another set of the same size would continue the
// run. The checkpoint holds the set's SHA-256.
TEST(CliLostWork, ResumeOnAnotherTrainingSetOfTheSameSizeIsRefused) {
  TempDir data, other, dir;
  write_fake_data(data, 16, 8);
  write_fake_data(other, 16, 8);
  std::vector<uint8_t> labels(16);
  for (uint32_t i = 0; i < 16; ++i) labels[i] = static_cast<uint8_t>((i + 3) % 10);
  testing::write_bytes(other.file(kTrainLabels), testing::make_idx(0x08, {16}, labels));
  const std::string checkpoints = dir.file("ck");
  const auto with = [&](const std::string& data_dir, const std::vector<std::string>& more) {
    auto args = tiny_run(more);
    *(std::find(args.begin(), args.end(), "--data-dir") + 1) = data_dir;
    return testing::run_command(args, {}, 120);
  };
  expect_successful_run(with(data.path(), {"--checkpoint-dir", checkpoints}), 1, kFinalLineOneCpu);
  expect_one_error_line(
      with(other.path(), {"--checkpoint-dir", checkpoints, "--resume", "--epochs", "2"}), kUsage,
      "was written with the training set of SHA-256 ");
  expect_resumed_run(
      with(data.path(), {"--checkpoint-dir", checkpoints, "--resume", "--epochs", "2"}));
}

}  // namespace
}  // namespace dptrain
