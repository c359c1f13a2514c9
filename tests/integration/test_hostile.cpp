// Hostile use against the dptrain binary: a weights file that would run code, inputs far larger
// than they can be, closed standard descriptors, the environment's thread count, stop requests
// before the first step, --fresh in a directory of strangers' files, a connect that LibTorch
// would retry out loud, and the address-space limit. Not here: the readers' own unit tests
// (test_checkpoint.cpp), the other hostile cases (test_binary_runs.cpp, test_hostile_*.cpp).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "support/cli_support.h"
#include "dptrain/data/data.h"
#include "dptrain/core/safetensors.h"
#include "dptrain/model/model.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_directory.h"
#include "support/test_support.h"
#include "support/train_support.h"

namespace dptrain {
namespace {

using testing::binary_and;
using testing::CommandResult;
using testing::contains;
using testing::describe;
using testing::expect_no_crash;
using testing::expect_one_error_line;
using testing::kRunTime;
using testing::kUsage;
using testing::read_text;
using testing::run_dptrain;
using testing::split_lines;
using testing::TempDir;
using testing::tiny_data_dir;
using testing::wait_for_text;

// A one-epoch run of a width-`width` model on the tiny data set, plus `more`.
std::vector<std::string> tiny_train(const std::vector<std::string>& more,
                                    const std::string& width = "1") {
  std::vector<std::string> args{"train",   "--data-dir", tiny_data_dir(), "--devices",    "cpu",
                                "--width", width,        "--epochs",      "1",            "--threads",
                                "1",       "--batch-size", "8"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The one file of `directory` whose name starts "checkpoint-" and ends ".dpt".
std::string only_checkpoint(const std::string& directory) {
  const auto names = checkpoint_file_names(directory);
  EXPECT_EQ(names.size(), 1u);
  return names.empty() ? "" : directory + "/" + names.front();
}

// A checkpoint-format file of a model of `width` that holds no tensors: what a crafted file
// can claim at no cost.
void write_hollow_checkpoint(const std::string& path, int64_t width) {
  Checkpoint c;
  c.config = CheckpointConfig{width, 10, 1, 8, 0.1, 0, 16, 1, std::string(64, 'a'), Recipe{}, 0};
  write_checkpoint_atomically(c, path);
}

// ---- 1. A weights file never runs code ----------------------------------------------------

// `eval --model` must not compile and run the TorchScript inside a torch::save archive. An
// archive is refused, unopened, and a --save-model file (the checkpoint format) evaluates to the
// training's own test accuracy.
TEST(HostileWeights, ArchivesAreRefusedAndSavedModelsEvaluate) {
  TempDir dir;
  const std::string archive = dir.file("archive.pt");
  ResNet model(ResNetOptions{kNumClasses, 1, 1});
  torch::save(model, archive);
  const auto refused = run_dptrain({"eval", "--model", archive, "--data-dir", tiny_data_dir()});
  expect_one_error_line(refused, kRunTime, "--model " + archive + ": a zip archive");
  EXPECT_TRUE(contains(refused.err, "never opens archives")) << describe(refused);
  EXPECT_EQ(refused.out, "") << describe(refused);

  const std::string saved = dir.file("m.safetensors");
  const auto trained = run_dptrain(tiny_train({"--save-model", saved}));
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  const auto weights = read_checkpoint(saved);
  EXPECT_EQ(weights.config.width, 1);
  EXPECT_EQ(weights.epochs_done, 1);
  const auto evaluated =
      run_dptrain({"eval", "--model", saved, "--data-dir", tiny_data_dir(), "--threads", "1"});
  ASSERT_EQ(evaluated.exit_code, 0) << describe(evaluated);
  char accuracy[32];
  std::snprintf(accuracy, sizeof accuracy, "test acc: %.4f", weights.history.back().test_acc);
  EXPECT_TRUE(contains(evaluated.out, accuracy)) << accuracy << "\n" << describe(evaluated);
  // The same tensors in a plain safetensors file (as PyTorch's save_file writes a state_dict:
  // no run state, no digest) evaluate alike, the width read from the stem's shape.
  const std::string plain = dir.file("plain.safetensors");
  const auto plain_bytes = serialize_safetensors(weights.tensors, {{"format", "pt"}});
  testing::write_bytes(plain, plain_bytes);
  const auto from_plain =
      run_dptrain({"eval", "--model", plain, "--data-dir", tiny_data_dir(), "--threads", "1"});
  ASSERT_EQ(from_plain.exit_code, 0) << describe(from_plain);
  EXPECT_EQ(from_plain.out, evaluated.out);
  // Without the stem, or with a tensor of another shape, it is named.
  auto tensors = weights.tensors;
  tensors.erase(tensors.begin());  // "0.weight"
  testing::write_bytes(plain, serialize_safetensors(tensors, {}));
  expect_one_error_line(run_dptrain({"eval", "--model", plain, "--data-dir", tiny_data_dir()}),
                        kRunTime, "--model " + plain + ": has no tensor '0.weight'");
  // A --width that disagrees with the file is named; the file's own width needs none.
  expect_one_error_line(
      run_dptrain({"eval", "--model", saved, "--width", "4", "--data-dir", tiny_data_dir()}),
      kUsage, "--width 4: --model " + saved + " holds a model of width 1");
}

// ---- 2. Inputs are bounded by what they can hold --------------------------------------------

// A 20 GiB sparse file with a checkpoint's header (width 1) among the checkpoints: refused by
// its size, unread (read whole, at every resume, this one would end in std::bad_alloc naming
// no file), and eval refuses it the same way.
TEST(HostileInputs, OversizedCheckpointIsRefusedUnreadNamingTheFile) {
  TempDir dir;
  const std::string checkpoints = dir.file("ck");
  ASSERT_EQ(run_dptrain(tiny_train({"--checkpoint-dir", checkpoints})).exit_code, 0);
  const Checkpoint trained = read_checkpoint(only_checkpoint(checkpoints));
  const std::string huge = checkpoints + "/" + checkpoint_file_name(99, 0);
  // Sparse files as long as their header declares, one tensor of that many bytes: refused by
  // what a width-1 model can hold, before their data is read.
  const std::vector<std::pair<uint64_t, std::string>> cases = {
      {uint64_t{3} << 30, "bytes, more than a file of a width-1 model can hold"},
      {uint64_t{20} << 30, "bytes, more than a file of a width-1 model can hold"}};
  for (const auto& [size, why] : cases) {
    SCOPED_TRACE(std::to_string(size) + " bytes");
    const uint64_t count = size / 8;
    const auto bytes = testing::header_claiming(trained, count * 8);
    testing::write_bytes(huge, bytes);
    const uint64_t total = bytes.size() + count * 8;
    ASSERT_EQ(::truncate(huge.c_str(), static_cast<off_t>(total)), 0);
    const std::string expected = "checkpoint " + huge + ": " + std::to_string(total) + " " + why;
    const auto resumed = run_dptrain(tiny_train({"--checkpoint-dir", checkpoints, "--resume"}));
    expect_one_error_line(resumed, kUsage, expected);
    const auto evaluated =
        run_dptrain({"eval", "--checkpoint", huge, "--data-dir", tiny_data_dir()});
    expect_one_error_line(evaluated, kRunTime, expected);
  }
}

// eval --model of a file that claims width 4096 must not build the model (gigabytes) before any
// check: the reader's own bound refuses it first, before the file's data is read, blaming the
// file's width, not a flag (Note [A file is bounded by what the run can use, not by its own
// word] in checkpoint.h).
TEST(HostileInputs, EvalOfAHugeWidthIsRefusedByTheMemoryEstimate) {
  TempDir dir;
  const std::string wide = dir.file("wide.pt");
  write_hollow_checkpoint(wide, 4096);
  const auto start = std::chrono::steady_clock::now();
  const auto result = run_dptrain({"eval", "--model", wide, "--data-dir", tiny_data_dir()});
  expect_one_error_line(result, kUsage, "--model " + wide);
  EXPECT_TRUE(contains(result.err, "cannot hold a width-4096 model")) << describe(result);
  EXPECT_FALSE(contains(result.err, "--width")) << describe(result);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// `ulimit -v` caps what the process may allocate whatever the host has free: the estimate
// counts it (a width-256 model needs some 3.5 GB; the limit leaves less).
TEST(HostileInputs, AddressSpaceLimitIsPartOfTheMemoryEstimate) {
  testing::ChildSetup limited;
  limited.address_space_limit_bytes = int64_t{3} << 30;
  const auto result = testing::run_command(
      binary_and(tiny_train({}, "256")), {}, 120, limited);
  expect_one_error_line(result, kUsage, "--batch-size and --width too large for this machine");
  EXPECT_TRUE(contains(result.err, "of address space is left under its limit (ulimit -v)"))
      << describe(result);
}

// ---- 3. Closed standard descriptors ---------------------------------------------------------

// With 1 or 2 closed, the metrics file was opened as that descriptor and received the progress
// and error lines. Now /dev/null stands in for them, and a closed stdout is still an error.
TEST(HostileDescriptors, ClosedStdoutOrStderrNeverReachesDptrainsFiles) {
  for (const int closed : {STDOUT_FILENO, STDERR_FILENO}) {
    SCOPED_TRACE("descriptor " + std::to_string(closed) + " closed");
    TempDir dir;
    const std::string metrics = dir.file("m.csv");
    testing::ChildSetup setup;
    setup.closed_descriptors = {closed};
    // Progress lines on stderr (--log-every 1) and epoch lines on stdout, to land somewhere.
    std::vector<std::string> more{"--metrics", metrics};
    if (closed == STDERR_FILENO) more.insert(more.end(), {"--log-every", "1"});
    const auto result = testing::run_command(binary_and(tiny_train(more)), {}, 120, setup);
    expect_no_crash(result);
    const std::string text = read_text(metrics);
    for (const char* stray : {"dptrain", "error", "train loss", " step "}) {
      EXPECT_FALSE(contains(text, stray)) << text;
    }
    if (closed == STDOUT_FILENO) {
      expect_one_error_line(result, kRunTime, "cannot write to standard output: Bad file descriptor");
    } else {
      EXPECT_EQ(result.exit_code, 0) << describe(result);
      EXPECT_EQ(text.rfind("epoch,", 0), 0u) << text;
      EXPECT_EQ(split_lines(text).size(), 2u) << text;  // the header and the one epoch
    }
  }
}

// ---- 4. The environment's thread count ---------------------------------------------------------

// OMP_NUM_THREADS taken as it comes: 64 on 2 cores makes a step 30 times slower, 100000 crashes
// in libgomp, 0 prints a c10 backtrace. It gets --threads' checks, before the data is read.
// (libgomp itself complains at start, before main, of a value it cannot parse.)
TEST(HostileEnvironment, OmpNumThreadsIsCheckedLikeTheThreadsFlag) {
  for (const std::string value : {"100000", "0", "abc", "4,2", "-1"}) {
    SCOPED_TRACE("OMP_NUM_THREADS=" + value);
    const auto result = run_dptrain({"train", "--data-dir", "/nonexistent", "--width", "1"},
                                    {{"OMP_NUM_THREADS", value}}, 60);
    expect_no_crash(result);
    EXPECT_EQ(result.exit_code, kUsage) << describe(result);
    const auto lines = split_lines(result.err);
    ASSERT_FALSE(lines.empty()) << describe(result);
    EXPECT_EQ(lines.back().rfind("error: OMP_NUM_THREADS=" + value + ": ", 0), 0u)
        << describe(result);
    // libgomp's own complaint, a blank line and one "libgomp: " line, may come first.
    for (size_t i = 0; i + 1 < lines.size(); ++i) {
      EXPECT_TRUE(lines[i].empty() || lines[i].rfind("libgomp: ", 0) == 0) << describe(result);
    }
  }
  // A count the machine holds is fine, and --threads wins over it.
  const auto fine = run_dptrain(tiny_train({}), {{"OMP_NUM_THREADS", "1"}}, 120);
  EXPECT_EQ(fine.exit_code, 0) << describe(fine);
}

// ---- 5. A stop request before the first step -------------------------------------------------

// SIGTERM while rank 0 waits for its peer is not left waiting for the whole --timeout, nor is it
// a failure for a connecting rank. Both end within a second, 128 + 15.
TEST(HostileStops, SigtermAtTheRendezvousEndsBothKindsOfRankAtOnce) {
  for (const int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    TempDir dir;
    const std::map<std::string, std::string> env{
        {"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"},        {"LOCAL_RANK", "0"},
        {"MASTER_ADDR", "127.0.0.1"},   {"MASTER_PORT", std::to_string(testing::free_port())}};
    const auto child = testing::spawn_command(
        binary_and(tiny_train({"--backend", "gloo", "--timeout", "300", "--verbose"})), env,
        dir.file("run"));
    ASSERT_TRUE(wait_for_text(child.out_path, "dptrain: ")) << read_text(child.err_path);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // into the rendezvous
    ASSERT_EQ(kill(child.pid, SIGTERM), 0);
    const auto start = std::chrono::steady_clock::now();
    const auto result = testing::wait_command(child, 30);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << describe(result);
    EXPECT_EQ(result.exit_code, 128 + SIGTERM) << describe(result);
    EXPECT_TRUE(contains(result.err, "stopped by signal 15 before the first step; nothing to save"))
        << describe(result);
    EXPECT_FALSE(contains(result.err, "error:")) << describe(result);
  }
}

// A lost terminal (SIGHUP) or Ctrl-\ (SIGQUIT) killed a training with no line and no checkpoint.
TEST(HostileStops, SighupAndSigquitAreStopRequests) {
  for (const int signal_number : {SIGHUP, SIGQUIT}) {
    testing::expect_signal_stops_and_saves(
        signal_number, tiny_train({"--epochs", "1000", "--checkpoint-every", "1000"}));
  }
}

// ---- 6. --fresh removes only checkpoints -----------------------------------------------------

// --fresh deleted any file named checkpoint-*.dpt (a text file, a copy of a password file), and
// one failed removal left the rest gone. Now it removes dptrain checkpoints of this user's only,
// all or none.
TEST(HostileFresh, OnlyCheckpointsAreRemovedAndAllOrNone) {
  TempDir dir;
  const std::string checkpoints = dir.file("ck");
  ASSERT_EQ(run_dptrain(tiny_train({"--checkpoint-dir", checkpoints})).exit_code, 0);
  const std::string real = only_checkpoint(checkpoints);
  const std::string text = checkpoints + "/" + checkpoint_file_name(7, 0);
  testing::write_bytes(text, {'n', 'o', 't', 'e', 's', '\n'});
  const auto refused = run_dptrain(tiny_train({"--checkpoint-dir", checkpoints, "--fresh"}));
  expect_one_error_line(refused, kUsage, "--fresh: " + text + ": it is not a dptrain checkpoint");
  EXPECT_TRUE(contains(refused.err, "nothing was removed")) << describe(refused);
  EXPECT_EQ(read_text(text), "notes\n");
  EXPECT_EQ(::access(real.c_str(), F_OK), 0) << real << " was removed";

  ASSERT_EQ(::unlink(text.c_str()), 0);
  const auto fresh = run_dptrain(tiny_train({"--checkpoint-dir", checkpoints, "--fresh"}));
  EXPECT_EQ(fresh.exit_code, 0) << describe(fresh);
  EXPECT_TRUE(contains(fresh.err, "--fresh: removed " + real)) << describe(fresh);
}

// ---- 12. Temporaries of killed writers -------------------------------------------------------

// A pid that ran and is gone.
pid_t dead_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

// A .tmp left by a kill during a write (45 MB at width 64) was never removed: --resume and
// --fresh remove those of writers that are gone, and only those.
TEST(HostileFresh, ResumeRemovesTheTemporariesOfDeadWriters) {
  TempDir dir;
  const std::string checkpoints = dir.file("ck");
  ASSERT_EQ(run_dptrain(tiny_train({"--checkpoint-dir", checkpoints})).exit_code, 0);
  const std::string stale = only_checkpoint(checkpoints) + "." + std::to_string(dead_pid()) + "-3.tmp";
  const std::string alive = only_checkpoint(checkpoints) + "." + std::to_string(::getppid()) + "-0.tmp";
  const std::string other = checkpoints + "/notes." + std::to_string(dead_pid()) + "-0.tmp";
  for (const auto& path : {stale, alive, other}) testing::write_bytes(path, {'x'});
  const auto resumed = run_dptrain(
      tiny_train({"--checkpoint-dir", checkpoints, "--resume", "--epochs", "2"}));
  EXPECT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_TRUE(contains(resumed.err, "removed " + stale + ", left by a writer that was killed"))
      << describe(resumed);
  EXPECT_NE(::access(stale.c_str(), F_OK), 0) << stale;
  EXPECT_EQ(::access(alive.c_str(), F_OK), 0) << alive << ": its writer still runs";
  EXPECT_EQ(::access(other.c_str(), F_OK), 0) << other << ": not a checkpoint's temporary";
}

// ---- 16, 19: what the messages name, and when ------------------------------------------------

// eval's errors name the file, not "checkpoint to evaluate".
TEST(HostileMessages, EvalErrorsNameTheFile) {
  TempDir dir;
  const std::string hollow = dir.file("hollow.dpt");
  write_hollow_checkpoint(hollow, 1);
  const auto result =
      run_dptrain({"eval", "--checkpoint", hollow, "--data-dir", tiny_data_dir(), "--threads", "1"});
  expect_one_error_line(result, kRunTime,
                        "checkpoint " + hollow + ": has no tensor '0.weight' of the width-1 model "
                        "(nor 126 more); not read");
}

// A bad --checkpoint-dir is found before the data is read, not after: like the other output
// paths it is a usage error before (here the data directory does not even exist).
TEST(HostileMessages, BadCheckpointDirIsAUsageErrorBeforeTheData) {
  const auto result = run_dptrain(
      {"train", "--checkpoint-dir", "/proc/version/ck", "--data-dir", "/nonexistent"});
  expect_one_error_line(result, kUsage, "--checkpoint-dir: checkpoint directory /proc/version/ck");
}

// ---- 18. A connect timeout is dptrain's one line ---------------------------------------------

// LibTorch's client logged a W... socket.cpp line per retry before dptrain's error.
TEST(HostileMessages, NothingListeningAtTheMasterPortIsOneLine) {
  const std::string port = std::to_string(testing::free_port());
  const auto result = run_dptrain(
      tiny_train({"--backend", "gloo", "--timeout", "3"}),
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", port}},
      60);
  expect_one_error_line(result, kRunTime,
                        "rank 1: rendezvous at 127.0.0.1:" + port +
                            " (connecting) failed: nothing accepted a connection there within 3 s");
}

}  // namespace
}  // namespace dptrain
