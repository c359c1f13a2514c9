// Joining a world from a program of one's own (world.h): replicas as threads of one process
// reduce together and a failing one ends the others at once with its own error; explicit seats
// meet over TCP and compare their settings; bad seats and devices are one UsageError each.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/core/errors.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/world.h"
#include "support/test_support.h"

namespace {

using namespace dptrain;
using namespace std::chrono_literals;

// The message of the UsageError `action` throws (a test failure if it throws none).
std::string refusal(const std::function<void()>& action) {
  return dptrain::testing::expect_throws<UsageError>(action, {});
}

const std::vector<torch::Device> kTwoCpus{torch::Device(torch::kCPU), torch::Device(torch::kCPU)};

TEST(RunReplicas, ThreadsOfOneProcessReduceTogether) {
  std::vector<double> sums(3, 0.0);
  std::vector<std::vector<std::string>> devices(3);
  const std::vector<torch::Device> three(3, torch::Device(torch::kCPU));
  run_replicas(three, [&](World& world) {
    EXPECT_EQ(world.world_size(), 3);
    auto value = torch::full({2}, static_cast<double>(world.rank() + 1), torch::kFloat64);
    world.communicator().allreduce_sum(value, "a test's sum");
    world.communicator().wait_host("a test's sum");
    sums[static_cast<size_t>(world.rank())] = value[1].item<double>();
    devices[static_cast<size_t>(world.rank())] = world.devices();
  });
  EXPECT_EQ(sums, (std::vector<double>{6.0, 6.0, 6.0}));
  EXPECT_EQ(devices[2], (std::vector<std::string>{"cpu", "cpu", "cpu"}));
}

TEST(RunReplicas, OneReplicaIsAWorldOfOneWithoutAProcessGroup) {
  int calls = 0;
  run_replicas({torch::Device(torch::kCPU)}, [&](World& world) {
    EXPECT_EQ(world.rank(), 0);
    EXPECT_EQ(world.world_size(), 1);
    EXPECT_FALSE(world.communicator().has_process_group());
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

// Replica 1 fails before a collective that replica 0 is already waiting in: replica 0 ends
// long before the timeout, and the error rethrown is replica 1's own, not its peer's report.
TEST(RunReplicas, AFailingReplicaEndsTheOthersAndItsOwnErrorIsRethrown) {
  JoinOptions options;
  options.timeout = 60s;
  const auto start = std::chrono::steady_clock::now();
  try {
    run_replicas(
        kTwoCpus,
        [](World& world) {
          if (world.rank() == 1) throw UsageError("replica 1 found a bad batch");
          auto value = torch::ones({4});
          world.communicator().allreduce_sum(value, "a sum replica 1 never joins");
          world.communicator().wait_host("a sum replica 1 never joins");
        },
        options);
    FAIL() << "run_replicas returned";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "replica 1 found a bad batch");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

TEST(RunReplicas, RefusesNoDevicesAndAGpuThatIsNotThere) {
  EXPECT_EQ(refusal([] { run_replicas({}, [](World&) {}); }), "run_replicas: no devices given");
  const int gpus = cuda_device_count();
  EXPECT_EQ(refusal([] {
              run_replicas({torch::Device(torch::kCPU), torch::Device(torch::kCUDA, 15)},
                           [](World&) {});
            }),
            "replica 1: device cuda:15 is not there: this process sees " + std::to_string(gpus) +
                " GPU" + (gpus == 1 ? "" : "s"));
}

TEST(WorldJoin, RefusesASeatOutsideTheWorld) {
  ExplicitSeat seat;
  seat.world_size = 0;
  EXPECT_EQ(refusal([&] { World::join(seat); }), "world size 0: must be at least 1");
  seat.world_size = 2;
  seat.rank = 2;
  EXPECT_EQ(refusal([&] { World::join(seat); }), "rank 2 is outside a world of 2 (ranks 0 to 1)");
  seat.rank = 1;
  seat.master_port = 70000;
  EXPECT_EQ(refusal([&] { World::join(seat); }), "master port 70000: must be between 1 and 65535");
}

// Two explicit seats, threads here as they would be processes, meet at a TCP store; `lr[r]` is
// rank r's setting. Returns each rank's sum of (rank + 1), or its error's text.
std::vector<std::string> join_two(const std::vector<std::string>& lr) {
  const int port = dptrain::testing::free_port();
  std::vector<std::string> outcome(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ExplicitSeat seat;
      seat.rank = r;
      seat.world_size = 2;
      seat.master_port = port;
      JoinOptions options;
      options.timeout = 30s;
      options.settings = "lr=" + lr[static_cast<size_t>(r)] + "\n";
      try {
        World world = World::join(seat, options);
        auto value = torch::full({1}, static_cast<float>(r + 1));
        world.communicator().allreduce_sum(value, "a test's sum");
        world.communicator().wait_host("a test's sum");
        outcome[static_cast<size_t>(r)] = std::to_string(value.item<float>());
        world.leave();
      } catch (const std::exception& e) {
        outcome[static_cast<size_t>(r)] = std::string("error: ") + e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return outcome;
}

TEST(WorldJoin, ExplicitSeatsMeetOverTcp) {
  EXPECT_EQ(join_two({"0.1", "0.1"}), (std::vector<std::string>{"3.000000", "3.000000"}));
}

TEST(WorldJoin, RanksWithDifferentSettingsAreRefusedByName) {
  const std::string refused =
      "error: rank 1 was started with lr 0.2, rank 0 with lr 0.1; every rank needs the same "
      "flags and data";
  EXPECT_EQ(join_two({"0.1", "0.2"}), (std::vector<std::string>{refused, refused}));
}

}  // namespace
