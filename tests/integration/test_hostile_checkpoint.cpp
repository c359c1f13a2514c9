// Hostile use of the checkpoint and data readers, through the dptrain binary: a file whose
// header claims a model the run does not build
// or a width no run has, weights and figures no run can have, a peak no device has, memory that
// runs out while data is read, and names found in a checkpoint directory that hold escape
// sequences. Not here: the readers' unit tests (test_checkpoint.cpp).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_directory.h"
#include "support/cli_support.h"
#include "support/test_support.h"
#include "support/train_support.h"

namespace dptrain {
namespace {

using testing::contains;
using testing::describe;
using testing::expect_one_error_line;
using testing::kRunTime;
using testing::kUsage;
using testing::run_dptrain;
using testing::TempDir;
using testing::tiny_data_dir;

// A run of a width-1 model on the tiny data set for `epochs` epochs, plus `more`.
std::vector<std::string> tiny_train_for_epochs(const std::string& epochs,
                                               const std::vector<std::string>& more) {
  std::vector<std::string> args{"train",   "--data-dir", tiny_data_dir(), "--devices", "cpu",
                                "--width", "1",          "--epochs",      epochs,      "--threads",
                                "1",       "--batch-size", "8"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The one checkpoint a one-epoch run leaves in `directory`.
std::string trained_checkpoint(const std::string& directory) {
  const auto result = run_dptrain(tiny_train_for_epochs("1", {"--checkpoint-dir", directory}));
  EXPECT_EQ(result.exit_code, 0) << describe(result);
  const auto names = checkpoint_file_names(directory);
  EXPECT_EQ(names.size(), 1u);
  return names.empty() ? "" : directory + "/" + names.front();
}

// A sparse file whose header claims width 4096 (4.4 GB long, a few KB on disk) must not be read
// whole by a --width 1 resume, by eval, and again at every resume. The run's own width bounds
// it, before its data is read; eval refuses the width the memory cannot hold.
TEST(HostileCheckpoint, AClaimedWidthTheRunCannotUseIsRefusedUnread) {
  TempDir dir;
  const std::string checkpoints = dir.file("ck");
  Checkpoint wide = read_checkpoint(trained_checkpoint(checkpoints));
  wide.config.width = 4096;
  const std::string huge = checkpoints + "/" + checkpoint_file_name(99, 0);
  const uint64_t data = uint64_t{4400} << 20;
  const auto header = testing::header_claiming(wide, data);
  testing::write_bytes(huge, header);
  ASSERT_EQ(::truncate(huge.c_str(), static_cast<off_t>(header.size() + data)), 0);

  const auto resumed =
      run_dptrain(tiny_train_for_epochs("2", {"--checkpoint-dir", checkpoints, "--resume"}));
  expect_one_error_line(resumed, kUsage,
                        "checkpoint " + huge + " was written for another model: --width 4096 " +
                            "(this run: 1); not read");
  const auto evaluated = run_dptrain({"eval", "--checkpoint", huge, "--data-dir", tiny_data_dir()});
  expect_one_error_line(evaluated, kUsage,
                        "checkpoint " + huge + ": this machine cannot hold a width-4096 model");
  const auto flagged = run_dptrain(
      {"eval", "--model", huge, "--width", "1", "--data-dir", tiny_data_dir()});
  expect_one_error_line(flagged, kUsage,
                        "--width 1: --model " + huge + " holds a model of width 4096");
  // Each run refuses before the data: what it read (the binary's libraries' headers, the tiny
  // data set, the checkpoint's header) is far below one read of 4.4 GB, however fast a sparse
  // file reads on this machine.
  for (const auto* run : {&resumed, &evaluated, &flagged}) {
    EXPECT_GE(run->bytes_read, 0) << "no /proc/PID/io to count the bytes read";
    EXPECT_LT(run->bytes_read, int64_t{64} << 20) << describe(*run);
  }
}

// Non-finite weights and a negative running variance, resumed, would fail the run with advice
// about --lr; the file is refused, naming the tensor and the file.
TEST(HostileCheckpoint, WeightsNoRunCanHaveAreRefusedNamingTheTensorAndTheFile) {
  TempDir dir;
  const std::string checkpoints = dir.file("ck");
  const std::string path = trained_checkpoint(checkpoints);
  const Checkpoint good = read_checkpoint(path);
  const auto copy_of_good = [&] {  // tensors of its own: a Checkpoint's copy shares them
    Checkpoint c = good;
    for (auto& [key, value] : c.tensors) value = value.clone();
    return c;
  };
  const auto tensor = [&](const Checkpoint& c, const std::string& name) {
    for (const auto& [key, value] : c.tensors) {
      if (key == name) return value;
    }
    ADD_FAILURE() << "no tensor " << name;
    return torch::Tensor();
  };
  Checkpoint nan = copy_of_good();
  tensor(nan, "0.weight").view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  write_checkpoint_atomically(nan, path);
  const auto resumed =
      run_dptrain(tiny_train_for_epochs("2", {"--checkpoint-dir", checkpoints, "--resume"}));
  expect_one_error_line(resumed, kUsage,
                        "checkpoint " + path + ": corrupt: impossible contents: tensor '0.weight' " +
                            "holds NaN or an infinity");
  EXPECT_FALSE(contains(resumed.err, "--lr")) << describe(resumed);

  Checkpoint negative = copy_of_good();
  tensor(negative, "1.running_var").view(-1)[0] = -1.0f;
  write_checkpoint_atomically(negative, path);
  const auto evaluated = run_dptrain({"eval", "--checkpoint", path, "--data-dir", tiny_data_dir()});
  expect_one_error_line(evaluated, kRunTime,
                        "checkpoint " + path + ": corrupt: impossible contents: tensor " +
                            "'1.running_var' (a BatchNorm running variance) holds -1");
}

// Under `ulimit -v` a data file too large for the memory must not end in a bare "error:
// std::bad_alloc" naming no phase and no file. A sparse IDX file of 5,000,000 images (3.9 GB)
// under a 3 GiB limit gives one line naming the file, the phase and what to do.
TEST(HostileCheckpoint, OutOfMemoryWhileLoadingDataNamesTheFile) {
  TempDir dir;
  testing::write_fake_data(dir, 16, 8);
  const std::string images = dir.file(testing::kTrainImages);
  const uint32_t n = 5000000;
  const auto be = [](uint32_t v) {
    return std::vector<uint8_t>{static_cast<uint8_t>(v >> 24), static_cast<uint8_t>(v >> 16),
                                static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)};
  };
  std::vector<uint8_t> header = be(0x803);
  for (const uint32_t v : {n, 28u, 28u}) {
    const auto bytes = be(v);
    header.insert(header.end(), bytes.begin(), bytes.end());
  }
  testing::write_bytes(images, header);
  ASSERT_EQ(::truncate(images.c_str(), static_cast<off_t>(16 + uint64_t{n} * 784)), 0);
  testing::ChildSetup limited;
  limited.address_space_limit_bytes = int64_t{3} << 30;
  std::vector<std::string> command{testing::dptrain_binary()};
  for (const auto& arg : tiny_train_for_epochs("1", {})) command.push_back(arg);
  command[3] = dir.path();  // --data-dir
  const auto result = testing::run_command(command, {}, 60, limited);
  expect_one_error_line(result, kRunTime,
                        images + ": out of memory while loading the data set from it");
  EXPECT_TRUE(contains(result.err, "ulimit -v")) << describe(result);
}

// A name found in the checkpoint directory must not reach the terminal raw, where an escape
// sequence in it would drive the terminal. Every message shows it escaped.
TEST(HostileCheckpoint, NamesFoundInTheCheckpointDirectoryAreEscaped) {
  TempDir dir;
  const std::string checkpoints = dir.file("ck");
  ASSERT_EQ(::mkdir(checkpoints.c_str(), 0755), 0);
  testing::write_bytes(checkpoints + "/checkpoint-\x1b]0;owned\x07\x1b[2J.safetensors", {'x'});
  for (const bool resume : {false, true}) {
    SCOPED_TRACE(resume ? "--resume" : "no --resume");
    std::vector<std::string> more{"--checkpoint-dir", checkpoints};
    if (resume) more.push_back("--resume");
    const auto result = run_dptrain(tiny_train_for_epochs("1", more));
    expect_one_error_line(result, kUsage, "checkpoint-\\x1b]0;owned\\x07\\x1b[2J.safetensors");
    EXPECT_FALSE(contains(result.err, "\x1b")) << describe(result);
  }
}

// A history claiming -5 TFLOP/s, an MFU of 1e300 or a peak of -1 bytes must not be resumed and
// its figures republished in the new run's --metrics. The file is refused, naming the field.
TEST(HostileCheckpoint, FiguresNoRunProducesAreRefusedNotRepublished) {
  TempDir dir;
  const std::string checkpoints = dir.file("ck");
  const std::string path = trained_checkpoint(checkpoints);
  const Checkpoint good = read_checkpoint(path);
  struct Case {
    const char* what;
    std::function<void(EpochStats&)> edit;
    const char* phrase;
  };
  const Case cases[] = {
      {"-5 TFLOP/s", [](EpochStats& s) { s.tflops = -5; }, "TFLOP/s is -5"},
      {"an MFU of 1e300", [](EpochStats& s) { s.mfu = 1e300; }, "MFU is 1e+300"},
      {"a peak of -1 bytes", [](EpochStats& s) { s.peak_host_bytes = -1; },
       "peak host bytes is -1"},
      {"a peak of 1e300 bytes", [](EpochStats& s) { s.peak_host_bytes = 1e300; },
       "peak host bytes is 1e+300"},
  };
  const std::string metrics = dir.file("metrics.csv");
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    Checkpoint bad = good;
    c.edit(bad.history[0]);
    write_checkpoint_atomically(bad, path);
    const auto resumed = run_dptrain(tiny_train_for_epochs(
        "2", {"--checkpoint-dir", checkpoints, "--resume", "--metrics", metrics}));
    expect_one_error_line(resumed, kUsage,
                          "checkpoint " + path + ": corrupt: impossible contents: epoch 1 of " +
                              "the history: " + c.phrase);
    EXPECT_FALSE(testing::path_exists(metrics)) << describe(resumed);
    const auto evaluated =
        run_dptrain({"eval", "--checkpoint", path, "--data-dir", tiny_data_dir()});
    expect_one_error_line(evaluated, kRunTime,
                          "checkpoint " + path + ": corrupt: impossible contents: epoch 1 of " +
                              "the history: " + c.phrase);
  }
}

// Width -4 is not "ResNet options must be positive", naming no file, nor 2^63 - 1 a machine that
// "cannot hold a width-9223372036854775807 model ... about 350.05 GiB". Either is a corrupt
// file, named with the field, whatever reads it.
TEST(HostileCheckpoint, AWidthNoRunHasIsACorruptFileNamedWithTheField) {
  TempDir dir;
  const std::string checkpoints = dir.file("ck");
  const std::string path = trained_checkpoint(checkpoints);
  const Checkpoint good = read_checkpoint(path);
  for (const int64_t width : {int64_t{-4}, std::numeric_limits<int64_t>::max()}) {
    SCOPED_TRACE(width);
    Checkpoint bad = good;
    bad.config.width = width;
    write_checkpoint_atomically(bad, path);
    const std::string corrupt = path + ": corrupt: impossible contents: width is " +
                                std::to_string(width) + " (dptrain writes 1 to 4096)";
    const auto evaluated =
        run_dptrain({"eval", "--checkpoint", path, "--data-dir", tiny_data_dir()});
    expect_one_error_line(evaluated, kRunTime, "checkpoint " + corrupt);
    EXPECT_FALSE(contains(evaluated.err, "ResNet options")) << describe(evaluated);
    EXPECT_FALSE(contains(evaluated.err, "this machine")) << describe(evaluated);
    const auto model = run_dptrain({"eval", "--model", path, "--data-dir", tiny_data_dir()});
    expect_one_error_line(model, kRunTime, "--model " + corrupt);
    const auto resumed =
        run_dptrain(tiny_train_for_epochs("2", {"--checkpoint-dir", checkpoints, "--resume"}));
    expect_one_error_line(resumed, kUsage, "checkpoint " + corrupt);
  }
}

// --peak-tflops 1e-308 would give an MFU of 3e306. A peak is a device's (1e-6 to 1e5
// TFLOP/s), and a run that outpaces the peak it was given gets no MFU rather than one above 1.
TEST(HostileCheckpoint, APeakNoDeviceHasIsRefusedAndNoMfuExceedsOne) {
  TempDir dir;
  for (const char* peak : {"1e-308", "1e-7", "100001", "1e300"}) {
    SCOPED_TRACE(peak);
    const auto result = run_dptrain(tiny_train_for_epochs("1", {"--peak-tflops", peak}));
    expect_one_error_line(result, kUsage,
                          std::string("--peak-tflops: '") + peak + "' is no device's peak");
  }
  // The floor, 1 MFLOP/s, is far below what even this width-1 run does on one thread.
  const std::string metrics = dir.file("metrics.csv");
  const auto slow =
      run_dptrain(tiny_train_for_epochs("1", {"--peak-tflops", "1e-6", "--metrics", metrics}));
  ASSERT_EQ(slow.exit_code, 0) << describe(slow);
  EXPECT_FALSE(contains(slow.out, "MFU")) << describe(slow);
  const auto rows = testing::split_lines(testing::read_text(metrics));
  ASSERT_EQ(rows.size(), 2u);
  const auto fields = [](const std::string& line) {
    std::vector<std::string> out;
    std::stringstream stream(line);
    for (std::string field; std::getline(stream, field, ',');) out.push_back(field);
    return out;
  };
  const auto header = fields(rows[0]);
  const auto row = fields(rows[1]);
  ASSERT_EQ(header.size(), row.size());
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] == "mfu") {
      EXPECT_EQ(row[i], "") << rows[1];
    } else if (header[i] == "tflops") {
      EXPECT_GT(std::stod(row[i]), 1e-6) << rows[1];
    }
  }
  // A peak the run stays below gives its fraction.
  const auto fast = run_dptrain(tiny_train_for_epochs("1", {"--peak-tflops", "100000"}));
  ASSERT_EQ(fast.exit_code, 0) << describe(fast);
  EXPECT_TRUE(contains(fast.out, "(MFU ")) << describe(fast);
}

}  // namespace
}  // namespace dptrain
