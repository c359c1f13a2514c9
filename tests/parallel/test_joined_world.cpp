// Joining a world (joined_world.h): a world of one without a store is itself, thread ranks meet
// and learn every rank's device, ranks started with different settings all fail naming the
// first difference, and the settings comparison alone.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/parallel/joined_world.h"
#include "dptrain/parallel/rendezvous.h"

namespace {

using namespace dptrain;
using namespace std::chrono_literals;

TEST(JoinedWorld, WorldOfOneWithoutAStoreIsItself) {
  JoinedWorld world{WorldSeat{}};
  EXPECT_EQ(world.devices(), std::vector<std::string>{"cpu"});
  EXPECT_EQ(world.communicator().world_size(), 1);
  EXPECT_EQ(world.communicator().rank(), 0);
  world.leave();
}

// Runs rank r of a world of `settings.size()` thread ranks with settings[r]; returns each rank's
// devices, or its UsageError's text after "error: ".
std::vector<std::string> join_threads(const std::vector<std::string>& settings) {
  const auto store = make_in_process_store(20s);
  const int world_size = static_cast<int>(settings.size());
  std::vector<std::string> outcome(settings.size());
  LocalReplicas replicas;
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      WorldSeat seat;
      seat.rank = r;
      seat.world_size = world_size;
      seat.store = store;
      seat.settings = settings[static_cast<size_t>(r)];
      seat.timeout = 20s;
      seat.local = &replicas;
      try {
        JoinedWorld world(seat);
        for (const auto& device : world.devices()) outcome[static_cast<size_t>(r)] += device + ";";
        world.leave();
      } catch (const UsageError& e) {
        outcome[static_cast<size_t>(r)] = std::string("error: ") + e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return outcome;
}

TEST(JoinedWorld, ThreadRanksMeetAndLearnEveryDevice) {
  const auto outcome = join_threads({"--lr=0.1\n", "--lr=0.1\n"});
  EXPECT_EQ(outcome, (std::vector<std::string>{"cpu;cpu;", "cpu;cpu;"}));
}

TEST(JoinedWorld, DifferentSettingsFailOnEveryRank) {
  const auto outcome = join_threads({"--lr=0.1\n", "--lr=0.2\n"});
  const std::string expected =
      "error: rank 1 was started with --lr 0.2, rank 0 with --lr 0.1; every rank needs the same "
      "flags and data";
  EXPECT_EQ(outcome, (std::vector<std::string>{expected, expected}));
}

TEST(CheckSameSettings, NamesTheFirstRankAndSettingThatDiffer) {
  EXPECT_NO_THROW(check_same_settings({}));
  EXPECT_NO_THROW(check_same_settings({"a=1\nb=2\n", "a=1\nb=2\n"}));
  try {
    check_same_settings({"a=1\nb=2\n", "a=1\nb=2\n", "a=1\nb=3\n"});
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "rank 2 was started with b 3, rank 0 with b 2; every rank needs the same flags and "
              "data");
  }
  EXPECT_THROW(check_same_settings({"a=1\nb=2\n", "a=1\n"}), UsageError);  // another build
}

}  // namespace
