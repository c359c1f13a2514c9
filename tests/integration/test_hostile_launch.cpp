// The binary under hostile launches, on tiny data: an sbatch batch step taken for a
// launch, ranks on one host that each take every core, 256 in-process replicas, a serving rank
// whose port is taken, one rank given to two processes. Not here: the parts one by one
// (tests/parallel/test_distributed.cpp, test_world_plan.cpp, tests/core/test_devices.cpp).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "dptrain/core/devices.h"
#include "support/cli_support.h"

namespace dptrain::testing {
namespace {

std::vector<std::string> tiny_launch_args(std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"train", "--data-dir", tiny_data_dir(), "--width", "2",
                                "--epochs", "1", "--max-steps", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The environment of a launch with `rank` of `world_size` on this machine.
std::map<std::string, std::string> torchrun_env(int rank, int world_size, int port) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world_size)},
          {"LOCAL_RANK", std::to_string(rank)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)}};
}

// Inside an sbatch script, outside srun: SLURM_PROCID=0 and SLURM_NTASKS=4 belong to the batch
// step. A plain run there is not rank 0 of 4, refused for want of MASTER_ADDR (or waiting out
// --timeout for ranks that never come): it is the plain run it is.
TEST(HostileLaunch, SlurmBatchStepIsAPlainRun) {
  const auto result = run_dptrain(tiny_launch_args(),
                                  {{"SLURM_JOB_ID", "77"},
                                   {"SLURM_PROCID", "0"},
                                   {"SLURM_NTASKS", "4"},
                                   {"SLURM_LOCALID", "0"},
                                   {"SLURM_NODEID", "0"}},
                                  60);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_TRUE(contains(split_lines(result.out).at(0), "; rank 0 of 1; ")) << describe(result);
}

// 256 `cpu` entries never reached a first step in 150 s and printed nothing.
TEST(HostileLaunch, TooManyInProcessReplicasIsOneErrorLineAtOnce) {
  std::string devices = "cpu";
  for (int i = 1; i < 256; ++i) devices += ",cpu";
  const auto start = std::chrono::steady_clock::now();
  const auto result = run_dptrain(tiny_launch_args({"--devices", devices}), {}, 20);
  expect_one_error_line(result, 2,
                        "--devices lists 256 replicas; one process runs at most 16 (each is a "
                        "thread with its own model and a connection to every other)");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// Ranks on one host that each take every core run several times slower than one thread each,
// with nothing to say so. A rank of a launch whose host holds two ranks takes half, and the
// first line says where the figure came from.
TEST(HostileLaunch, FirstLineSaysTheThreadsAndWhereTheyCameFrom) {
  auto env = torchrun_env(0, 1, free_port());
  env["LOCAL_WORLD_SIZE"] = "2";
  // The default, not a setting the test's caller made (an empty value counts as unset; libgomp
  // warns of it, so only where there is one to hide).
  std::map<std::string, std::string> no_omp;
  if (std::getenv("OMP_NUM_THREADS") != nullptr) no_omp["OMP_NUM_THREADS"] = "";
  env.insert(no_omp.begin(), no_omp.end());
  const auto result = run_dptrain(tiny_launch_args(), env, 60);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto expected = default_intra_op_threads(nullptr, 2);
  const std::string first = split_lines(result.out).at(0);
  EXPECT_TRUE(contains(first, "; " + expected.reason)) << first;
  EXPECT_TRUE(contains(first, "/ 2 local ranks)")) << first;
  // Without a launcher: all of this host's cores, and the replicas share them.
  const auto alone = run_dptrain(tiny_launch_args({"--devices", "cpu,cpu"}), no_omp, 60);
  ASSERT_EQ(alone.exit_code, 0) << describe(alone);
  const std::string shared = default_intra_op_threads(nullptr, 1).reason + ", shared by 2 replicas";
  EXPECT_TRUE(contains(split_lines(alone.out).at(0), "; " + shared)) << describe(alone);
  // --threads is named as the source.
  const auto flag = run_dptrain(tiny_launch_args({"--threads", "1"}), {}, 60);
  ASSERT_EQ(flag.exit_code, 0) << describe(flag);
  EXPECT_TRUE(contains(split_lines(flag.out).at(0), "; 1 thread (--threads)")) << describe(flag);
}

// The serving rank could not bind: LibTorch's W and E socket.cpp lines came before dptrain's.
TEST(HostileLaunch, ServingRankWhosePortIsTakenIsOneLine) {
  const int holder = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
  ASSERT_EQ(::listen(holder, 1), 0);
  socklen_t length = sizeof any;
  ASSERT_EQ(::getsockname(holder, reinterpret_cast<sockaddr*>(&any), &length), 0);
  const int port = ntohs(any.sin_port);
  const auto result = run_dptrain(tiny_launch_args(), torchrun_env(0, 2, port), 30);
  ::close(holder);
  expect_one_error_line(result, 1,
                        "rank 0: rendezvous at 127.0.0.1:" + std::to_string(port) +
                            " (serving) failed: MASTER_PORT " + std::to_string(port) +
                            " is already in use on this machine: by another program, or by "
                            "another process started as rank 0 of this world (RANK=0 given "
                            "twice?)");
}

// Whether a process has claimed `rank` in the rendezvous served at `port` within `timeout`: read
// from the store as a client of it, under the key the ranks count their claims by
// (lib/src/parallel/rendezvous.cpp, claim_rank; first attempt).
bool rank_claimed(int port, int rank, std::chrono::seconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = timeout;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  try {
    c10d::PrefixStore store("dptrain/attempt0",
                            c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options));
    while (std::chrono::steady_clock::now() < deadline) {
      if (store.add("dptrain/claim/rank/" + std::to_string(rank), 0) >= 1) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "cannot read the rendezvous store at port " << port << ": " << e.what();
  }
  return false;
}

// Two processes started as rank 1 of 3: the second was a rank that "never arrived" to the
// others after the whole timeout, and nothing named the duplicate. Now it is told at once, and
// rank 0's timeout names the rank started twice.
TEST(HostileLaunch, DuplicateRankIsNamed) {
  const int port = free_port();
  TempDir logs;
  const auto rank0 = spawn_command(
      [] {
        auto args = tiny_launch_args({"--batch-size", "9", "--timeout", "5"});
        args.insert(args.begin(), dptrain_binary());
        return args;
      }(),
      torchrun_env(0, 3, port), logs.file("rank0"));
  const auto first = spawn_command(
      [] {
        auto args = tiny_launch_args({"--batch-size", "9", "--timeout", "5"});
        args.insert(args.begin(), dptrain_binary());
        return args;
      }(),
      torchrun_env(1, 3, port), logs.file("first1"));
  ASSERT_TRUE(rank_claimed(port, 1, std::chrono::seconds(30)))  // the first rank 1 claims first
      << read_text(logs.file("first1.err"));
  const auto start = std::chrono::steady_clock::now();
  const auto second = run_dptrain(tiny_launch_args({"--batch-size", "9", "--timeout", "5"}),
                                  torchrun_env(1, 3, port), 30);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(6));
  expect_one_error_line(second, 1,
                        "rank 1: another process has already joined this rendezvous as rank 1");
  const auto served = wait_command(rank0, 40);
  (void)wait_command(first, 40);
  EXPECT_EQ(served.exit_code, 1) << describe(served);
  EXPECT_TRUE(contains(served.err, "rank(s) 2 of 3 never arrived; rank(s) 1 were started in two "
                                   "processes each"))
      << describe(served);
}

}  // namespace
}  // namespace dptrain::testing
