// Hostile use of the outputs: an output that is another output, an input or a checkpoint
// directory's own file, two writers of one output, and a checkpoint directory that would fail
// only at its first save, against the dptrain binary. Each is refused in one line before the
// data is read.
// Not here: the checks' own unit tests (core/test_files.cpp, train/test_checkpoint_directory.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "dptrain/core/files.h"
#include "support/cli_support.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using testing::CommandResult;
using testing::contains;
using testing::describe;
using testing::expect_one_error_line;
using testing::kUsage;
using testing::path_exists;
using testing::read_text;
using testing::run_dptrain;
using testing::TempDir;

// A one-epoch run of a width-1 model on `data`, plus `more`.
std::vector<std::string> tiny_train_on(const std::string& data,
                                       const std::vector<std::string>& more) {
  std::vector<std::string> args{"train",   "--data-dir", data,      "--devices",    "cpu",
                                "--width", "1",          "--epochs", "1",           "--threads",
                                "1",       "--batch-size", "8"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The run read nothing: no line about the data it would have loaded.
void expect_nothing_read(const CommandResult& result) {
  EXPECT_FALSE(contains(result.out, "images from")) << describe(result);
}

// A data file that is a link to the --save-model path must not be replaced by the model (the
// next run: "bad magic number").
TEST(HostileOutputs, SaveModelOntoALinkedDataFileIsRefusedBeforeTheData) {
  TempDir dir;
  testing::make_directories(dir.file("data"));
  TempDir data_files;
  testing::write_fake_data(data_files, 16, 8);
  for (const char* name : {testing::kTrainImages, testing::kTestImages, testing::kTestLabels}) {
    const std::string bytes = read_text(data_files.file(name));
    testing::write_bytes(dir.file(std::string("data/") + name),
                         std::vector<uint8_t>(bytes.begin(), bytes.end()));
  }
  const std::string labels = read_text(data_files.file(testing::kTrainLabels));
  testing::write_bytes(dir.file("labels.safetensors"),
                       std::vector<uint8_t>(labels.begin(), labels.end()));
  // Built by append: GCC 12 at -O2 takes `std::string("data/") + name` here for an overflow
  // (-Warray-bounds, a known false positive) when LibTorch 2.15's headers are in the unit.
  std::string link = dir.path();
  link.append("/data/").append(testing::kTrainLabels);
  ASSERT_EQ(::symlink("../labels.safetensors", link.c_str()), 0);
  const auto result = run_dptrain(
      tiny_train_on(dir.file("data"), {"--save-model", dir.file("labels.safetensors")}));
  expect_one_error_line(result, kUsage,
                        "--save-model and the data file train-labels-idx1-ubyte name one file, " +
                            dir.file("labels.safetensors"));
  expect_nothing_read(result);
  EXPECT_EQ(read_text(dir.file("labels.safetensors")), labels);
}

// --save-model under a name the run gives its checkpoints would replace one of them.
TEST(HostileOutputs, SaveModelOntoACheckpointNameIsRefusedBeforeTheData) {
  TempDir dir;
  const auto result = run_dptrain(tiny_train_on(
      testing::tiny_data_dir(), {"--checkpoint-dir", dir.file("ck"), "--save-model",
                                 dir.file("ck/checkpoint-e0001-s000000.safetensors")}));
  expect_one_error_line(result, kUsage, "--save-model and --checkpoint-dir's checkpoints name one file");
  expect_nothing_read(result);
  EXPECT_EQ(testing::list_directory(dir.file("ck")), std::vector<std::string>{});
}

// `eval --logits` onto its own --model would replace the weights it has just evaluated.
TEST(HostileOutputs, EvalLogitsOntoItsModelIsRefusedBeforeReadingIt) {
  TempDir dir;
  testing::write_bytes(dir.file("m.safetensors"), {'k', 'e', 'e', 'p'});
  const auto result = run_dptrain({"eval", "--data-dir", testing::tiny_data_dir(), "--devices",
                                   "cpu", "--threads", "1", "--model", dir.file("m.safetensors"),
                                   "--logits", dir.file("./m.safetensors")});
  expect_one_error_line(result, kUsage, "--logits and --model name one file");
  EXPECT_EQ(read_text(dir.file("m.safetensors")), "keep");
}

// Two runs given one output would both exit 0, their records interleaved. While another
// process holds the output (here: this test), a run is refused naming the holder.
TEST(HostileOutputs, ASecondWriterOfOneOutputIsRefusedNamingTheHolder) {
  TempDir dir;
  const std::string holder = "(pid " + std::to_string(::getpid()) + " on ";
  for (const auto& [flag, name] : std::vector<std::pair<std::string, std::string>>{
           {"--metrics", "m.csv"}, {"--save-model", "m.safetensors"}}) {
    const OutputLock first(dir.file(name), flag);
    const auto result =
        run_dptrain(tiny_train_on(testing::tiny_data_dir(), {flag, dir.file(name)}));
    expect_one_error_line(result, kUsage,
                          flag + " " + dir.file(name) + " is being written by another dptrain run");
    EXPECT_TRUE(contains(result.err, holder)) << describe(result);
    expect_nothing_read(result);
    EXPECT_FALSE(path_exists(dir.file(name)));
  }
  // Once the holder is done the output is free, and the run leaves no lock file behind.
  const auto result =
      run_dptrain(tiny_train_on(testing::tiny_data_dir(), {"--metrics", dir.file("m.csv")}));
  EXPECT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_EQ(testing::list_directory(dir.path()), std::vector<std::string>{"m.csv"});
}

// A directory whose checkpoints' temporaries exceed PATH_MAX must not pass the check and fail
// at the first save, after the training.
TEST(HostileOutputs, ACheckpointDirTooLongForItsTemporariesIsRefusedBeforeTheData) {
  TempDir dir;
  std::string deep = dir.path();
  while (deep.size() + 201 < PATH_MAX - 40) deep += "/" + std::string(200, 'd');
  deep += "/" + std::string(PATH_MAX - 40 - deep.size() - 1, 'e');
  const auto result =
      run_dptrain(tiny_train_on(testing::tiny_data_dir(), {"--checkpoint-dir", deep}));
  expect_one_error_line(result, kUsage, "cannot create a checkpoint there");
  EXPECT_TRUE(contains(result.err, "File name too long")) << describe(result);
  expect_nothing_read(result);
}

}  // namespace
}  // namespace dptrain
