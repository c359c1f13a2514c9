// Joining a world: the rendezvous of one rank (every rank present, their settings compared, their
// placements exchanged and checked), its process group, and its membership of this process's
// replicas, so that a failing sibling can abort it. Takes plain values, not a trainer's plan.
// Not here: the store they meet in (rendezvous.h), the collectives (distributed.h), or what the
// settings are (train/run_configuration.h).
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "dptrain/parallel/distributed.h"

namespace dptrain {

// The replicas of this process, each a thread with its own communicator. When one fails, the
// others' process groups are aborted, so that their collectives with it end at once instead of
// at the timeout (Communicator::abort; a no-op for Gloo, whose peers see the closed connection).
class LocalReplicas {
 public:
  void add(Communicator* communicator);
  void remove(Communicator* communicator);
  void abort_all();

 private:
  std::mutex mutex_;
  std::vector<Communicator*> members_;
  bool failed_ = false;
};

// Runs `run_one(i)` for i < `count`, a thread each, and returns once all have ended. The first
// failure aborts the others' process groups (replicas.abort_all), so that they end at once; the
// one rethrown is a replica's own failure over a CollectiveError that only reports its peer's
// going, and among CollectiveErrors the first to happen: the others follow from it and would
// only hide the cause.
void run_on_threads(int count, LocalReplicas& replicas, const std::function<void(int)>& run_one);

// Where one rank takes its place in the world, and how it gets there.
struct WorldSeat {
  int rank = 0;
  int world_size = 1;
  torch::Device device{torch::kCPU};
  c10::intrusive_ptr<c10d::Store> store;  // null: a world of one without a process group
  bool loopback = true;                   // WorldOptions::loopback
  // One line per setting, "name=value": what this rank publishes, to be compared with every
  // other rank's (check_same_settings).
  std::string settings;
  Backend backend = Backend::kGloo;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // bounds every wait
  LocalReplicas* local = nullptr;  // this process's replicas, when there are several
  const std::atomic<int>* stop_signal = nullptr;  // WorldOptions::stop_signal
};

// `texts[r]` is rank r's settings, one "name=value" line each. Throws UsageError naming the first
// rank and setting that differ from rank 0's: "rank 1 was started with --lr 0.2, rank 0 with
// --lr 0.1; ...".
void check_same_settings(const std::vector<std::string>& texts);

// One rank's place in the world: its communicator, every rank's device, and its membership of
// this process's replicas. Made by the rendezvous (UsageError when the ranks' settings or
// placements disagree, CollectiveError when a rank does not come); a world of one without a
// store skips it.
class JoinedWorld {
 public:
  explicit JoinedWorld(const WorldSeat& seat);
  ~JoinedWorld();
  JoinedWorld(const JoinedWorld&) = delete;
  JoinedWorld& operator=(const JoinedWorld&) = delete;

  Communicator& communicator() { return *communicator_; }
  // Every rank's device as its process names it ("cpu", "cuda:0"), in rank order.
  const std::vector<std::string>& devices() const { return devices_; }
  // No rank leaves while others may still talk to it; then the process group is shut down.
  void leave();

 private:
  std::vector<std::string> devices_;
  std::unique_ptr<Communicator> communicator_;
  LocalReplicas* local_;
};

}  // namespace dptrain
