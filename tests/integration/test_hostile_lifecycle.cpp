// Hostile use of the run's life from start to end, against the dptrain binary: a
// record that fails beside the checkpoint, a resume with nothing left to train, the signals a
// scheduler sends besides SIGTERM, a stop while a peer is stalled, and `eval` ranks holding
// different weights. Not here: the library's own halves of these (test_train.cpp,
// test_distributed.cpp), the other hostile classes (test_hostile*.cpp, test_binary_runs.cpp).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dptrain/train/checkpoint_directory.h"
#include "support/cli_support.h"
#include "support/test_support.h"
#include "support/train_support.h"

namespace dptrain {
namespace {

using testing::binary_and;
using testing::CommandResult;
using testing::contains;
using testing::describe;
using testing::kRunTime;
using testing::kUsage;
using testing::read_text;
using testing::run_dptrain;
using testing::split_lines;
using testing::TempDir;
using testing::tiny_data_dir;
using testing::wait_for_text;

// A training of a width-1 model on `data` (the tiny set unless given), plus `more`.
std::vector<std::string> tiny_lifecycle_train(const std::vector<std::string>& more,
                                              const std::string& data = tiny_data_dir()) {
  std::vector<std::string> args{"train",     "--data-dir", data, "--devices", "cpu", "--width",
                                "1",         "--epochs",   "1",  "--threads", "1",   "--batch-size",
                                "8"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The environment of rank `rank` of a two-process launch on this host.
std::map<std::string, std::string> two_rank_env(int rank, int port) {
  return {{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"},
          {"LOCAL_RANK", "0"},            {"LOCAL_WORLD_SIZE", "1"},
          {"MASTER_ADDR", "127.0.0.1"},   {"MASTER_PORT", std::to_string(port)}};
}

// ---- 4. A failed record costs only itself ----------------------------------------------------

// The records were written before the epoch's checkpoint, so a --plot (or --metrics) write that
// failed (a full disk; here its path turned into a directory during the first epoch) ended the
// run with no checkpoint and no --save-model. Now one line names the failure, and the run goes
// on without the plot, keeping both checkpoints and the model, and exits 1.
TEST(HostileLifecycle, AFailedPlotWriteKeepsTheCheckpointsAndTheModel) {
  TempDir data;
  testing::write_fake_data(data, 2048, 8);  // a first epoch of 256 steps: time to hold it
  TempDir dir;
  const std::string plot = dir.file("p.svg");
  const std::string model = dir.file("m.safetensors");
  const std::string checkpoints = dir.file("ck");
  const auto child = testing::spawn_command(
      binary_and(tiny_lifecycle_train(
          {"--epochs", "2", "--plot", plot, "--save-model", model, "--checkpoint-dir", checkpoints},
          data.path())),
      {}, dir.file("run"));
  ASSERT_TRUE(wait_for_text(child.out_path, "dptrain: ")) << read_text(child.err_path);
  ASSERT_EQ(kill(child.pid, SIGSTOP), 0);  // the plot's path becomes a directory, the run held
  ASSERT_EQ(::mkdir(plot.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((plot + "/x").c_str(), 0755), 0);
  ASSERT_EQ(kill(child.pid, SIGCONT), 0);
  const auto result = testing::wait_command(child, 120);
  testing::expect_no_crash(result);
  EXPECT_EQ(result.exit_code, kRunTime) << describe(result);
  std::vector<std::string> errors;
  for (const auto& line : split_lines(result.err)) {
    if (line.rfind("error: ", 0) == 0) errors.push_back(line);
  }
  ASSERT_EQ(errors.size(), 1u) << describe(result);
  EXPECT_TRUE(contains(errors[0], plot)) << describe(result);
  EXPECT_TRUE(contains(errors[0], "; the run goes on without --plot (checkpoints and --save-model "
                                  "are kept) and will exit 1"))
      << describe(result);
  EXPECT_EQ(checkpoint_file_names(checkpoints),
            (std::vector<std::string>{checkpoint_file_name(1, 0), checkpoint_file_name(2, 0)}));
  EXPECT_TRUE(testing::path_exists(model)) << describe(result);
  EXPECT_TRUE(contains(result.out, "epoch 2/2: ")) << describe(result);
  EXPECT_TRUE(contains(result.out, "test acc: ")) << describe(result);
}

// ---- 8. A resume with nothing left to train --------------------------------------------------

// --epochs at or below the epochs done (or --max-steps at or below the step) ran no step and
// printed the checkpoint's last epoch as its result ("test acc: ..."), exit 0, in silence. Now
// one line says there is nothing left and why, no result is printed, --save-model is written
// with the checkpoint's weights and says so, and the status is still 0 (a requeued job that had
// finished is no failure).
TEST(HostileLifecycle, AResumeWithNothingLeftPrintsNoResultAndSaysWhy) {
  TempDir dir;
  const std::string checkpoints = dir.file("ck");
  ASSERT_EQ(run_dptrain(tiny_lifecycle_train({"--checkpoint-dir", checkpoints})).exit_code, 0);
  const std::string last = checkpoints + "/" + checkpoint_file_name(1, 0);
  const std::string model = dir.file("m.safetensors");
  const auto again = run_dptrain(
      tiny_lifecycle_train({"--checkpoint-dir", checkpoints, "--resume", "--save-model", model}));
  testing::expect_no_crash(again);
  EXPECT_EQ(again.exit_code, 0) << describe(again);
  EXPECT_FALSE(contains(again.out, "test acc")) << describe(again);
  EXPECT_FALSE(contains(again.out, "epoch ")) << describe(again);
  EXPECT_EQ(split_lines(again.err),
            std::vector<std::string>{
                "dptrain: nothing left to train: the checkpoint " + last +
                " has finished 1 epoch(s) and --epochs is 1; this run takes no step and reports "
                "no result; --save-model " + model +
                " gets the checkpoint's weights as they are (raise --epochs or --max-steps to "
                "train on)"})
      << describe(again);
  EXPECT_TRUE(testing::path_exists(model));
  const auto steps = run_dptrain(tiny_lifecycle_train(
      {"--checkpoint-dir", checkpoints, "--resume", "--epochs", "3", "--max-steps", "2"}));
  EXPECT_EQ(steps.exit_code, 0) << describe(steps);
  EXPECT_FALSE(contains(steps.out, "test acc")) << describe(steps);
  EXPECT_TRUE(contains(steps.err, "is at global step 2 and --max-steps is 2")) << describe(steps);
}

// ---- 10. Every signal that would end the run is a stop request -------------------------------

// Slurm's --signal warning (SIGUSR1), SIGUSR2, SIGALRM, SIGVTALRM, SIGXCPU and SIGPWR would end
// a training at once: no line, no checkpoint. Each is a stop request, as SIGTERM is.
TEST(HostileLifecycle, SchedulersOtherSignalsAreStopRequests) {
  for (const int signal_number : {SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGXCPU, SIGPWR}) {
    testing::expect_signal_stops_and_saves(
        signal_number,
        tiny_lifecycle_train({"--epochs", "100000", "--checkpoint-every", "100000"}));
  }
}

// Without --checkpoint-dir a stop must not drop --save-model in silence. The stop line says that
// the model was not written, and that the run's weights are lost.
TEST(HostileLifecycle, AStopSaysWhatBecameOfTheSavedModel) {
  TempDir dir;
  const std::string model = dir.file("m.safetensors");
  const auto child = testing::spawn_command(
      binary_and(
          tiny_lifecycle_train({"--epochs", "100000", "--log-every", "1", "--save-model", model})),
      {}, dir.file("run"));
  ASSERT_TRUE(wait_for_text(child.err_path, " step ")) << read_text(child.err_path);
  ASSERT_EQ(kill(child.pid, SIGTERM), 0);
  const auto result = testing::wait_command(child, 60);
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << describe(result);
  EXPECT_TRUE(contains(result.err, "dptrain: stopped by signal 15; --save-model " + model +
                                       " was not written (the run did not finish, and without "
                                       "--checkpoint-dir its weights are lost)\n"))
      << describe(result);
  EXPECT_FALSE(testing::path_exists(model));
}

// SIGTERM to a rank whose peer had stalled (here: SIGSTOP) waited in the collective for the whole
// timeout (300 s by default, 30 s here) before it ended. Now the stop ends the wait about a
// second after it, with one line saying so.
TEST(HostileLifecycle, SigtermWhileAPeerIsStalledEndsTheWaitWithinSeconds) {
  TempDir dir;
  const int port = testing::free_port();
  std::vector<testing::ChildProcess> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.push_back(testing::spawn_command(
        binary_and(tiny_lifecycle_train(
            {"--epochs", "100000", "--backend", "gloo", "--timeout", "30", "--log-every", "1"})),
        two_rank_env(rank, port), dir.file("rank" + std::to_string(rank))));
  }
  ASSERT_TRUE(wait_for_text(ranks[0].err_path, " step ")) << read_text(ranks[0].err_path);
  ASSERT_EQ(kill(ranks[1].pid, SIGSTOP), 0);
  // Rank 0 waits for it once every thread of rank 0 sleeps (it trains on the CPU until then).
  EXPECT_TRUE(testing::wait_until_blocked(ranks[0].pid, 20000)) << "rank 0 never waited";
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(ranks[0].pid, SIGTERM), 0);
  const auto result = testing::wait_command(ranks[0], 60);
  const auto waited = std::chrono::steady_clock::now() - start;
  kill(ranks[1].pid, SIGKILL);
  (void)testing::wait_command(ranks[1], 10);
  EXPECT_LT(waited, std::chrono::seconds(5)) << describe(result);
  EXPECT_EQ(result.exit_code, kRunTime) << describe(result);
  std::vector<std::string> errors;
  for (const auto& line : split_lines(result.err)) {
    if (line.rfind("error: ", 0) == 0) errors.push_back(line);
  }
  ASSERT_EQ(errors.size(), 1u) << describe(result);
  EXPECT_TRUE(contains(errors[0], "error: rank 0 of 2: the stop request (signal 15) ended the wait "
                                  "for "))
      << describe(result);
  EXPECT_TRUE(contains(errors[0], "which had not finished 1 s after it (a peer stalled or died)"))
      << describe(result);
}

// ---- 12. The ranks of an eval agree on the weights --------------------------------------------

// `eval` under a launcher never compared the ranks' weight files: rank 0 printed one result for
// files that differed. Now the weights' content digest is among the settings the ranks compare:
// different weights are refused on every rank, naming the rank; the same weights at another path
// evaluate.
TEST(HostileLifecycle, EvalRanksWithDifferentWeightsAreRefused) {
  TempDir dir;
  const std::string a = dir.file("a.safetensors");
  const std::string b = dir.file("b.safetensors");
  const std::string a_copy = dir.file("copy-of-a.safetensors");
  ASSERT_EQ(run_dptrain(tiny_lifecycle_train({"--save-model", a})).exit_code, 0);
  ASSERT_EQ(run_dptrain(tiny_lifecycle_train({"--save-model", b, "--seed", "7"})).exit_code, 0);
  std::filesystem::copy_file(a, a_copy);
  const auto eval_pair = [&](const std::string& rank1_model) {
    const int port = testing::free_port();
    std::vector<testing::ChildProcess> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.push_back(testing::spawn_command(
          binary_and({"eval", "--model", rank == 0 ? a : rank1_model, "--data-dir", tiny_data_dir(),
                      "--devices", "cpu", "--threads", "1", "--timeout", "30"}),
          two_rank_env(rank, port), dir.file("eval" + std::to_string(rank))));
    }
    std::vector<CommandResult> results;
    for (const auto& rank : ranks) results.push_back(testing::wait_command(rank, 60));
    return results;
  };
  for (const auto& result : eval_pair(b)) {
    testing::expect_one_error_line(result, kUsage, "rank 1 was started with the weights' SHA-256 ");
    EXPECT_TRUE(contains(result.err, ", rank 0 with the weights' SHA-256 ")) << describe(result);
    EXPECT_EQ(result.out, "") << describe(result);
  }
  const auto same = eval_pair(a_copy);
  EXPECT_EQ(same[0].exit_code, 0) << describe(same[0]);
  EXPECT_EQ(same[1].exit_code, 0) << describe(same[1]);
  EXPECT_TRUE(contains(same[0].out, "test acc")) << describe(same[0]);
}

}  // namespace
}  // namespace dptrain
