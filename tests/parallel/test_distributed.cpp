// Tests of the collectives, the rendezvous and the replica helpers (distributed.h,
// rendezvous.h, replicas.h) over thread ranks, including timeouts that must fire, not hang.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <tuple>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/parallel/rendezvous.h"
#include "support/parallel_support.h"
#include "support/test_support.h"

namespace {

using namespace dptrain;
using dptrain::testing::run_thread_ranks;
using namespace std::chrono_literals;

TEST(Communicator, WorldOfOneIsTheIdentity) {
  Communicator single;
  auto t = torch::tensor({1.0f, 2.0f});
  single.allreduce_sum(t, "test");
  single.broadcast(t, 0, "test");
  single.barrier("test");
  EXPECT_TRUE(torch::equal(t, torch::tensor({1.0f, 2.0f})));
  EXPECT_EQ(single.world_size(), 1);
  EXPECT_EQ(single.rank(), 0);
}

TEST(Communicator, CollectivesOverThreeRanks) {
  run_thread_ranks(3, [](Communicator& c) {
    const auto r = static_cast<float>(c.rank());
    auto sum = torch::tensor({r, 10 * r});
    c.allreduce_sum(sum, "sum");
    EXPECT_TRUE(torch::equal(sum, torch::tensor({3.0f, 30.0f})));
    auto max = torch::tensor({r, -r}, torch::kInt64);
    c.allreduce_max(max, "max");
    EXPECT_TRUE(torch::equal(max, torch::tensor({2, 0}, torch::kInt64)));
    auto b = torch::full({4}, r);
    c.broadcast(b, /*root=*/1, "broadcast");
    EXPECT_TRUE(torch::all(b == 1).item<bool>());
    c.barrier("barrier");
  });
}

TEST(Communicator, MissingPeerTimesOutWithRankInMessage) {
  const auto start = std::chrono::steady_clock::now();
  try {
    run_thread_ranks(
        2,
        [](Communicator& c) {
          if (c.rank() == 1) return;  // rank 1 never joins the all-reduce
          auto t = torch::ones({3});
          c.allreduce_sum(t, "the test all-reduce");
        },
        2s);
    FAIL() << "expected a CollectiveError";
  } catch (const CollectiveError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 0 of 2"), std::string::npos) << message;
    EXPECT_NE(message.find("the test all-reduce"), std::string::npos) << message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

// A stop request (SIGTERM) while a peer stalled waited out the whole collective timeout (300 s
// by default, past a scheduler's 30 s grace). Now the wait ends kStopGrace after the request,
// with an error that says the stop ended it; a collective that finishes is not disturbed. The
// request comes once rank 0's thread sleeps inside the stalled wait, so a wait that looked at the
// request only as it began would run into the 30 s timeout instead.
TEST(Communicator, StopRequestEndsAWaitForAStalledPeerWithinTheGrace) {
  struct IgnoredSigpipe {
    void (*previous)(int) = signal(SIGPIPE, SIG_IGN);
    ~IgnoredSigpipe() { signal(SIGPIPE, previous); }
  } ignored_sigpipe;
  auto store = make_in_process_store(30s);
  std::atomic<int> stop{0};
  std::atomic<bool> rank0_done{false};
  std::atomic<int> rank0_thread{0};  // its gettid(), once it starts the stalled all-reduce
  std::string error;
  std::chrono::steady_clock::time_point stopped_at{}, ended_at{};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      WorldOptions options;
      options.timeout = 30s;
      options.stop_signal = &stop;
      Communicator communicator(store, rank, 2, options);
      auto both = torch::ones({2});
      communicator.allreduce_sum(both, "a collective both ranks join");
      EXPECT_TRUE(torch::equal(both, torch::full({2}, 2.0f)));
      if (rank == 1) {  // stalls: alive, its connection open, never joining the next collective
        while (!rank0_done) std::this_thread::sleep_for(10ms);
        return;
      }
      rank0_thread = static_cast<int>(::syscall(SYS_gettid));
      try {
        auto t = torch::ones({3});
        communicator.allreduce_sum(t, "the stalled all-reduce");
      } catch (const CollectiveError& e) {  // StopEndedTheWait, or the timeout's error
        error = e.what();
      }
      ended_at = std::chrono::steady_clock::now();
      rank0_done = true;
    });
  }
  std::thread stopper([&] {
    while (rank0_thread == 0) std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(dptrain::testing::wait_until_thread_blocked(rank0_thread, 20000))
        << "rank 0 never slept in the stalled all-reduce";
    stopped_at = std::chrono::steady_clock::now();
    stop = SIGTERM;
  });
  stopper.join();
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(error,
            "rank 0 of 2: the stop request (signal 15) ended the wait for the stalled all-reduce, "
            "which had not finished 1 s after it (a peer stalled or died); no checkpoint was "
            "written for this stop");
  EXPECT_GE(ended_at - stopped_at, kStopGrace);
  EXPECT_LT(ended_at - stopped_at, kStopGrace + 2s);
}

TEST(Communicator, DiagnosisBudgetIsAFifthOfTheTimeoutAtMostThreeSeconds) {
  EXPECT_EQ(diagnosis_budget(std::chrono::milliseconds(1000)), std::chrono::milliseconds(200));
  EXPECT_EQ(diagnosis_budget(std::chrono::seconds(10)), std::chrono::seconds(2));
  EXPECT_EQ(diagnosis_budget(std::chrono::seconds(15)), std::chrono::seconds(3));
  EXPECT_EQ(diagnosis_budget(std::chrono::minutes(5)), std::chrono::seconds(3));
}

// allreduce_max, broadcast and barrier report a collective that cannot start as every other
// failure: one CollectiveError naming the rank and the collective (a c10 error escaped before).
TEST(Communicator, CollectivesThatCannotStartAreCollectiveErrorsNamingTheRank) {
  using Action = std::function<void(Communicator&)>;
  const std::vector<std::pair<std::string, Action>> cases{
      {"the broadcast from rank 7",
       [](Communicator& c) {
         c.broadcast(torch::ones({2}), /*root=*/7, "the broadcast from rank 7");
       }},
      {"the max on the meta device", [](Communicator& c) {
         c.allreduce_max(torch::ones({2}, torch::kMeta), "the max on the meta device");
       }}};
  for (const auto& one_case : cases) {
    // Named, not a structured binding: clang 14 (the sanitizer build) cannot capture those.
    const std::string& what = one_case.first;
    const Action& action = one_case.second;
    run_thread_ranks(2, [&](Communicator& c) {
      // Both connected first: a rank that fails at once and leaves would otherwise close its
      // sockets while the other still connects.
      c.barrier("connected");
      try {
        action(c);
        ADD_FAILURE() << what << ": expected a CollectiveError";
      } catch (const CollectiveError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("rank " + std::to_string(c.rank()) + " of 2"), std::string::npos)
            << message;
        EXPECT_NE(message.find(what), std::string::npos) << message;
      }
    });
  }
}

// A world of one made with a store has a real process group: its collectives run through it.
TEST(Communicator, WorldOfOneWithAProcessGroupCommunicates) {
  auto store = make_in_process_store(10s);
  WorldOptions options;
  options.timeout = 10s;
  Communicator one(store, 0, 1, options);
  EXPECT_TRUE(one.has_process_group());
  EXPECT_FALSE(Communicator().has_process_group());
  auto t = torch::tensor({1.5f, -2.0f});
  one.allreduce_sum(t, "sum");
  auto pending = one.allreduce_sum_async(t, "async sum");
  one.wait(pending);
  one.wait_host("the check");
  one.barrier("barrier");
  EXPECT_TRUE(torch::equal(t, torch::tensor({1.5f, -2.0f})));
  one.shutdown();
}

// After abort() (here from the rank itself; in training from a failed replica of the same
// process), every collective fails at once instead of waiting for peers until the timeout.
TEST(Communicator, AbortedGroupFailsEveryLaterCollectiveAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  run_thread_ranks(
      2,
      [](Communicator& c) {
        c.barrier("connected");  // as above: no rank leaves while the other still connects
        c.abort();
        c.abort();  // idempotent
        auto t = torch::ones({3});
        try {
          c.allreduce_sum(t, "the sum after the abort");
          ADD_FAILURE() << "expected a CollectiveError";
        } catch (const CollectiveError& e) {
          EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("the sum after the abort"), std::string::npos);
        }
        c.wait_host("a check");  // nothing was started: nothing to wait for
      },
      30s);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

// ---- The NCCL environment ---------------------------------------------------------------

TEST(NcclEnvironment, DefaultsOnlyWhatTheUserLeftUnset) {
  using Pairs = std::vector<std::pair<std::string, std::string>>;
  const auto with = [](std::map<std::string, std::string> env) {
    return nccl_environment_defaults([env](const char* name) -> const char* {
      const auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  };
  EXPECT_EQ(with({}), (Pairs{{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"},
                             {"TORCH_NCCL_DUMP_ON_TIMEOUT", "0"},
                             {"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "0"}}));
  // The user's mode under either name wins; so does a wish for dumps, with its own wait.
  EXPECT_EQ(
      with({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}}),
      (Pairs{{"TORCH_NCCL_DUMP_ON_TIMEOUT", "0"}, {"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "0"}}));
  EXPECT_EQ(with({{"NCCL_ASYNC_ERROR_HANDLING", "3"}, {"TORCH_NCCL_DUMP_ON_TIMEOUT", "1"}}),
            Pairs{});
  EXPECT_EQ(with({{"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "500"}}),
            (Pairs{{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"}, {"TORCH_NCCL_DUMP_ON_TIMEOUT", "0"}}));
}

// Blocking wait read as c10d's getCvarBool reads it (Note [Blocking wait as c10d reads it]):
// one case per spelling under each name, then the two names together.
using Environment = std::map<std::string, std::string>;
NcclBlockingWait blocking_wait_with(const Environment& env) {
  return nccl_blocking_wait([&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

struct Spelling {
  std::string value;
  int on;  // 1 on, 0 off, -1 refused
};
void PrintTo(const Spelling& spelling, std::ostream* os) {  // a failure names the value
  *os << "'" << spelling.value << "' ("
      << (spelling.on > 0 ? "on" : spelling.on == 0 ? "off" : "refused") << ")";
}

class BlockingWaitSpelling : public ::testing::TestWithParam<std::tuple<std::string, Spelling>> {};

TEST_P(BlockingWaitSpelling, ReadAsC10dReadsIt) {
  const auto& [name, spelling] = GetParam();
  if (spelling.on < 0) {
    try {
      (void)blocking_wait_with({{name, spelling.value}});
      FAIL() << name << "='" << spelling.value << "' was not refused";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()),
                name + "='" + spelling.value +
                    "' is not a value LibTorch's NCCL process group reads: it takes "
                    "1/y/yes/t/true or 0/n/no/f/false, in any case; set one or unset " +
                    name);
    }
    return;
  }
  const auto wait = blocking_wait_with({{name, spelling.value}});
  EXPECT_EQ(wait.on, spelling.on == 1);
  EXPECT_EQ(wait.name, name);
  EXPECT_EQ(wait.value, spelling.value);
}

INSTANTIATE_TEST_SUITE_P(
    NcclEnvironment, BlockingWaitSpelling,
    ::testing::Combine(
        ::testing::Values("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"),
        ::testing::Values(Spelling{"1", 1}, Spelling{"y", 1}, Spelling{"Y", 1},
                          Spelling{"yes", 1}, Spelling{"YES", 1}, Spelling{"Yes", 1},
                          Spelling{"t", 1}, Spelling{"T", 1}, Spelling{"true", 1},
                          Spelling{"TRUE", 1}, Spelling{"True", 1}, Spelling{"0", 0},
                          Spelling{"n", 0}, Spelling{"N", 0}, Spelling{"no", 0},
                          Spelling{"NO", 0}, Spelling{"No", 0}, Spelling{"f", 0},
                          Spelling{"F", 0}, Spelling{"false", 0}, Spelling{"FALSE", 0},
                          Spelling{"False", 0}, Spelling{"", -1}, Spelling{"2", -1},
                          Spelling{"on", -1}, Spelling{"off", -1}, Spelling{" 1", -1},
                          Spelling{"yes ", -1}, Spelling{"01", -1}, Spelling{"-1", -1})));

TEST(NcclEnvironment, BlockingWaitNewNameWinsOverTheOld) {
  EXPECT_FALSE(blocking_wait_with({}).on);
  EXPECT_EQ(blocking_wait_with({}).name, "");
  auto wait = blocking_wait_with({{"TORCH_NCCL_BLOCKING_WAIT", "0"}, {"NCCL_BLOCKING_WAIT", "1"}});
  EXPECT_FALSE(wait.on);
  EXPECT_EQ(wait.name, "TORCH_NCCL_BLOCKING_WAIT");
  wait = blocking_wait_with({{"TORCH_NCCL_BLOCKING_WAIT", "Yes"}, {"NCCL_BLOCKING_WAIT", "no"}});
  EXPECT_TRUE(wait.on);
  EXPECT_EQ(wait.name, "TORCH_NCCL_BLOCKING_WAIT");
  EXPECT_EQ(wait.value, "Yes");
  // c10d reads the old name first and refuses its bad value before the new name can win.
  EXPECT_THROW((void)blocking_wait_with({{"TORCH_NCCL_BLOCKING_WAIT", "0"},
                                         {"NCCL_BLOCKING_WAIT", "maybe"}}),
               UsageError);
  EXPECT_THROW((void)blocking_wait_with({{"TORCH_NCCL_BLOCKING_WAIT", "maybe"},
                                         {"NCCL_BLOCKING_WAIT", "0"}}),
               UsageError);
}

TEST(Rendezvous, GatherPlacementsGivesEveryRanksInRankOrder) {
  auto store = make_in_process_store(5s);
  std::vector<std::vector<RankPlacement>> seen(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      const RankPlacement mine{"host" + std::to_string(r % 2), "cuda:" + std::to_string(r),
                               r == 2 ? "" : "GPU-" + std::to_string(r)};
      seen[static_cast<size_t>(r)] = gather_placements(*store, r, 3, mine, 5s);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& placements : seen) {
    ASSERT_EQ(placements.size(), 3u);
    EXPECT_EQ(placements[1].host, "host1");
    EXPECT_EQ(placements[2].device, "cuda:2");
    EXPECT_EQ(placements[0].gpu, "GPU-0");
    EXPECT_EQ(placements[2].gpu, "");
  }
}

TEST(Rendezvous, BarrierNamesTheRanksThatNeverArrived) {
  auto store = make_in_process_store(2s);
  const auto start = std::chrono::steady_clock::now();
  try {
    store_barrier(*store, "rendezvous", /*rank=*/0, /*world_size=*/3, 500ms);
    FAIL() << "expected a CollectiveError";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2 of 3 never arrived"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// A store that answers `checks` checks and then fails, as one does when the process serving
// it ends.
class StoreThatGoesAway : public c10d::HashStore {
 public:
  explicit StoreThatGoesAway(int checks) : checks_left_(checks) {}
  bool check(const std::vector<std::string>& keys) override {
    if (checks_left_-- <= 0) throw std::runtime_error("Connection reset by peer");
    return HashStore::check(keys);
  }

 private:
  int checks_left_;
};

TEST(Rendezvous, CheckInsKeepTheLastFullRoundWhenTheStoreGoesAway) {
  // Three ranks, two checked in; the store serves two full rounds (6 checks) and one check of
  // the third, then fails: the answer is the second round's, with the store's error beside it.
  StoreThatGoesAway store(7);
  store.set("p/0", std::vector<uint8_t>{'1'});
  store.set("p/1", std::vector<uint8_t>{'1'});
  const auto check_ins = poll_check_ins(store, "p/", 3, 5s);
  EXPECT_EQ(check_ins.missing, std::vector<int>{2});
  EXPECT_EQ(check_ins.store_error, "Connection reset by peer");
  EXPECT_GE(check_ins.polled, 20ms);  // the second round came after one 20 ms pause
  EXPECT_LT(check_ins.polled, 5s);
  // ranks_missing_after has no partial answer to give: the store's error is thrown.
  StoreThatGoesAway again(4);
  again.set("p/0", std::vector<uint8_t>{'1'});
  EXPECT_THROW(ranks_missing_after(again, "p/", 3, 5s), std::runtime_error);
}

TEST(Rendezvous, CheckInsThrowWhenTheStoreFailsInTheFirstRound) {
  StoreThatGoesAway store(1);
  EXPECT_THROW(poll_check_ins(store, "p/", 3, 5s), std::runtime_error);
}

TEST(Rendezvous, CheckInsEndAsSoonAsEveryRankIsIn) {
  StoreThatGoesAway store(100);
  for (const char* key : {"p/0", "p/1"}) store.set(key, std::vector<uint8_t>{'1'});
  const auto check_ins = poll_check_ins(store, "p/", 2, 5s);
  EXPECT_TRUE(check_ins.missing.empty());
  EXPECT_TRUE(check_ins.store_error.empty());
  EXPECT_LT(check_ins.polled, 1s);
}

TEST(Rendezvous, BarrierRejectsDisagreeingWorldSizes) {
  auto store = make_in_process_store(2s);
  store_barrier(*store, "warm", 0, 1, 1s);                            // a world of one passes alone
  store->set("dptrain/barrier/b/rank/1", std::vector<uint8_t>{'3'});  // rank 1: a world of 3
  EXPECT_THROW(store_barrier(*store, "b", 0, 2, 1s), CollectiveError);
}

TEST(Rendezvous, AllGatherStrings) {
  auto store = make_in_process_store(5s);
  std::vector<std::vector<std::string>> seen(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      seen[static_cast<size_t>(r)] =
          all_gather_strings(*store, "names", r, 3, "dev" + std::to_string(r), 5s);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& values : seen) {
    EXPECT_EQ(values, (std::vector<std::string>{"dev0", "dev1", "dev2"}));
  }
}

// ---- Launcher environments ---------------------------------------------------------

TEST(LaunchEnvironment, NoneWithoutLauncherVariables) {
  EXPECT_FALSE(read_launch_environment({{"HOME", "/root"}}).has_value());
}

TEST(LaunchEnvironment, Torchrun) {
  const auto launch = read_launch_environment({{"RANK", "3"},
                                               {"WORLD_SIZE", "4"},
                                               {"LOCAL_RANK", "1"},
                                               {"MASTER_ADDR", "10.1.2.3"},
                                               {"MASTER_PORT", "29501"}});
  ASSERT_TRUE(launch.has_value());
  EXPECT_EQ(launch->launcher, "torchrun");
  EXPECT_EQ(launch->rank, 3);
  EXPECT_EQ(launch->world_size, 4);
  EXPECT_EQ(launch->local_rank, 1);
  EXPECT_EQ(launch->master_addr, "10.1.2.3");
  EXPECT_EQ(launch->master_port, 29501);
}

// A task of a job step started by srun (Note [The batch step is no launch]): SLURM_STEP_ID is a
// number, and the step's own SLURM_STEP_NUM_TASKS is the world.
TEST(LaunchEnvironment, Slurm) {
  const auto launch = read_launch_environment({{"SLURM_STEP_ID", "0"},
                                               {"SLURM_PROCID", "5"},
                                               {"SLURM_NTASKS", "16"},
                                               {"SLURM_STEP_NUM_TASKS", "8"},
                                               {"SLURM_LOCALID", "1"},
                                               {"MASTER_ADDR", "node1"},
                                               {"MASTER_PORT", "1234"}});
  ASSERT_TRUE(launch.has_value());
  EXPECT_EQ(launch->launcher, "slurm");
  EXPECT_EQ(launch->rank, 5);
  EXPECT_EQ(launch->world_size, 8);
  EXPECT_EQ(launch->local_rank, 1);
}

// Inside an sbatch script but outside srun, SLURM_PROCID=0 and SLURM_NTASKS=N describe the batch
// step: a plain run there taken as rank 0 of N would wait for ranks that never come. It is no
// launch, whatever the batch step's SLURM_STEP_ID says of it.
TEST(LaunchEnvironment, SlurmBatchStepIsNoLaunch) {
  const std::map<std::string, std::string> batch{{"SLURM_JOB_ID", "77"},
                                                 {"SLURM_PROCID", "0"},
                                                 {"SLURM_NTASKS", "4"},
                                                 {"SLURM_LOCALID", "0"}};
  EXPECT_FALSE(read_launch_environment(batch).has_value());
  for (const char* step : {"batch", "extern", "interactive", "4294967294", "4294967290",
                           "4294967295", "", "-1", "12345678901"}) {
    auto env = batch;
    env["SLURM_STEP_ID"] = step;
    EXPECT_FALSE(read_launch_environment(env).has_value()) << "SLURM_STEP_ID=" << step;
  }
  auto step = batch;
  step["SLURM_STEP_ID"] = "2";
  step["SLURM_STEP_NUM_TASKS"] = "2";
  step["MASTER_ADDR"] = "node0";
  step["MASTER_PORT"] = "29500";
  const auto launch = read_launch_environment(step);
  ASSERT_TRUE(launch.has_value());
  EXPECT_EQ(launch->world_size, 2);  // the step's tasks, not the job's
  auto legacy = step;  // older Slurm: SLURM_STEPID
  legacy.erase("SLURM_STEP_ID");
  legacy["SLURM_STEPID"] = "0";
  EXPECT_TRUE(read_launch_environment(legacy).has_value());
}

// A launch's errors name the variables that made the process a rank.
TEST(LaunchEnvironment, ErrorsNameTheVariablesThatMadeARank) {
  dptrain::testing::expect_throws<UsageError>(
      [] {
        read_launch_environment({{"SLURM_STEP_ID", "3"},
                                 {"SLURM_PROCID", "0"},
                                 {"SLURM_STEP_NUM_TASKS", "2"},
                                 {"SLURM_NTASKS", "4"}});
      },
      {"environment: MASTER_ADDR is not set (slurm launch, rank 0, from SLURM_STEP_ID=3, "
       "SLURM_PROCID=0, SLURM_STEP_NUM_TASKS=2)"});
  dptrain::testing::expect_throws<UsageError>(
      [] { read_launch_environment({{"RANK", "0"}, {"WORLD_SIZE", "2"}}); },
      {"MASTER_ADDR is not set (torchrun launch, rank 0, from RANK=0, WORLD_SIZE=2)"});
  dptrain::testing::expect_throws<UsageError>(
      [] {
        read_launch_environment({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}});
      },
      {"environment: MASTER_PORT is not set (this process is a rank because of RANK=0, "
       "WORLD_SIZE=2)"});
}

// Two processes given the same RANK: the second is told at once, naming the rank; the others'
// timeout names it too (it was called a rank that never came, or for rank 0 a port conflict).
TEST(Rendezvous, ARankClaimedTwiceIsNamed) {
  const auto store = make_in_process_store(5s);
  EXPECT_NO_THROW(claim_rank(*store, 0));
  EXPECT_NO_THROW(claim_rank(*store, 1));
  dptrain::testing::expect_throws<CollectiveError>(
      [&] { claim_rank(*store, 1); },
      {"rank 1: another process has already joined this rendezvous as rank 1 (the same RANK"});
  store_barrier(*store, "first", 0, 1, 1s);  // unaffected where nothing is missing
  store->set("dptrain/barrier/late/rank/0", std::vector<uint8_t>{'3'});
  dptrain::testing::expect_throws<CollectiveError>(
      [&] { store_barrier(*store, "late", 0, 3, 200ms); },
      {"rank(s) 1, 2 of 3 never arrived; rank(s) 1 were started in two processes each"});
}

// A serving rank whose MASTER_PORT another process holds: one line of dptrain's, without
// LibTorch's W/E socket.cpp lines before it.
TEST(Rendezvous, AServingRankWhosePortIsTakenSaysSoAlone) {
  const int holder = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // IPv4: there everywhere
  ASSERT_GE(holder, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
  ASSERT_EQ(::listen(holder, 1), 0);
  socklen_t length = sizeof any;
  ASSERT_EQ(::getsockname(holder, reinterpret_cast<sockaddr*>(&any), &length), 0);
  const int port = ntohs(any.sin_port);
  LaunchEnvironment launch;
  launch.launcher = "torchrun";
  launch.world_size = 2;
  launch.master_addr = "127.0.0.1";
  launch.master_port = port;
  ::testing::internal::CaptureStderr();
  std::string message;
  try {
    connect_tcp_store(launch, 5s);
  } catch (const CollectiveError& e) {
    message = e.what();
  }
  const std::string logged = ::testing::internal::GetCapturedStderr();
  ::close(holder);
  EXPECT_EQ(message, "rank 0: rendezvous at 127.0.0.1:" + std::to_string(port) +
                         " (serving) failed: MASTER_PORT " + std::to_string(port) +
                         " is already in use on this machine: by another program, or by another "
                         "process started as rank 0 of this world (RANK=0 given twice?); end it, "
                         "or choose a free MASTER_PORT");
  EXPECT_EQ(logged, "");
}

struct BadEnvironment {
  const char* name;
  std::map<std::string, std::string> env;
  const char* expected;  // in the message
};

class LaunchEnvironmentErrors : public ::testing::TestWithParam<BadEnvironment> {};

TEST_P(LaunchEnvironmentErrors, NamesTheVariable) {
  try {
    read_launch_environment(GetParam().env);
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(GetParam().expected), std::string::npos) << e.what();
  }
}

const std::map<std::string, std::string> kGood{
    {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
std::map<std::string, std::string> with(std::map<std::string, std::string> env,
                                        const std::string& name, const std::string& value) {
  if (value.empty()) {
    env.erase(name);
  } else {
    env[name] = value;
  }
  return env;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LaunchEnvironmentErrors,
    ::testing::Values(BadEnvironment{"RankNotNumber", with(kGood, "RANK", "abc"), "RANK=abc"},
                      BadEnvironment{"RankTooLarge", with(kGood, "RANK", "2"), "RANK=2"},
                      BadEnvironment{"NoWorldSize", with(kGood, "WORLD_SIZE", ""), "WORLD_SIZE"},
                      BadEnvironment{"ZeroWorld", with(kGood, "WORLD_SIZE", "0"), "WORLD_SIZE=0"},
                      BadEnvironment{"NoMaster", with(kGood, "MASTER_ADDR", ""), "MASTER_ADDR"},
                      BadEnvironment{"BadPort", with(kGood, "MASTER_PORT", "70000"),
                                     "MASTER_PORT=70000"}),
    [](const auto& info) { return std::string(info.param.name); });

// An unresolvable MASTER_ADDR had LibTorch retry it for the whole timeout; it is named at once.
TEST(LaunchEnvironment, UnresolvableMasterAddrIsNamedAtOnce) {
  auto launch = read_launch_environment(kGood);
  ASSERT_TRUE(launch.has_value());
  EXPECT_NO_THROW(check_master_address(*launch));
  launch->master_addr = "localhost";
  EXPECT_NO_THROW(check_master_address(*launch));
  for (const std::string host : {"no-such-host.invalid", "127.0.0.1:29500", "exa mple"}) {
    launch->master_addr = host;
    const auto start = std::chrono::steady_clock::now();
    try {
      check_master_address(*launch);
      ADD_FAILURE() << host << " resolved";
    } catch (const CollectiveError& e) {
      EXPECT_EQ(
          std::string(e.what()).rfind("rank 0: MASTER_ADDR=" + host + " does not resolve (", 0), 0u)
          << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << host;
  }
}

// ---- Replica helpers ----------------------------------------------------------------




}  // namespace
