// Joining a world: the rendezvous of one rank and its process group. See joined_world.h.
#include "dptrain/parallel/joined_world.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/core/errors.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/rendezvous.h"
#include "dptrain/parallel/world_plan.h"

namespace dptrain {
namespace {

std::vector<std::pair<std::string, std::string>> parse_settings(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> settings;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    const size_t equals = line.find('=');
    settings.emplace_back(line.substr(0, equals),
                          equals == std::string::npos ? "" : line.substr(equals + 1));
    begin = end + 1;
  }
  return settings;
}

// The rendezvous of one rank: every rank present and agreeing on the world, their settings
// compared, their placements exchanged (into `devices`, every rank's device in rank order) and
// checked against the backend, then the process group. A world of one without a process group
// skips all of it.
std::unique_ptr<Communicator> connect_rank(const WorldSeat& seat,
                                           std::vector<std::string>& devices) {
  if (!seat.store) {
    devices = {device_name(seat.device)};
    return std::make_unique<Communicator>();
  }
  claim_rank(*seat.store, seat.rank);
  store_barrier(*seat.store, "rendezvous", seat.rank, seat.world_size, seat.timeout);
  const RankPlacement mine{host_name(), device_name(seat.device), gpu_identity(seat.device)};
  const auto placements =
      gather_placements(*seat.store, seat.rank, seat.world_size, mine, seat.timeout);
  const auto settings = all_gather_strings(*seat.store, "settings", seat.rank, seat.world_size,
                                           seat.settings, seat.timeout);
  try {
    check_same_settings(settings);
    check_placements(placements, seat.backend);
  } catch (const UsageError&) {
    // Every rank finds the same mistake. Rank 0 may serve the store: it leaves only once the
    // others have read what it holds, so that they report the mistake too, not a lost store.
    const std::string prefix = "dptrain/rendezvous-read/";
    seat.store->set(prefix + std::to_string(seat.rank), std::vector<uint8_t>{'1'});
    if (seat.rank == 0) ranks_missing_after(*seat.store, prefix, seat.world_size, seat.timeout);
    throw;
  }
  devices.clear();
  WorldOptions world_options;
  for (const auto& placement : placements) {
    devices.push_back(placement.device);
    world_options.rank_hosts.push_back(placement.host);
  }
  world_options.backend = seat.backend;
  world_options.timeout = seat.timeout;
  world_options.loopback = seat.loopback;
  world_options.stop_signal = seat.stop_signal;
  return std::make_unique<Communicator>(seat.store, seat.rank, seat.world_size, world_options);
}

}  // namespace

void LocalReplicas::add(Communicator* communicator) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_) communicator->abort();
  members_.push_back(communicator);
}

void LocalReplicas::remove(Communicator* communicator) {
  std::lock_guard<std::mutex> lock(mutex_);
  members_.erase(std::remove(members_.begin(), members_.end(), communicator), members_.end());
}

void LocalReplicas::abort_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  failed_ = true;
  for (auto* communicator : members_) communicator->abort();
}

void check_same_settings(const std::vector<std::string>& texts) {
  if (texts.empty()) return;
  const auto reference = parse_settings(texts[0]);
  std::map<std::string, std::string> rank0(reference.begin(), reference.end());
  for (size_t rank = 1; rank < texts.size(); ++rank) {
    const auto theirs = parse_settings(texts[rank]);
    for (const auto& [name, value] : theirs) {
      const auto found = rank0.find(name);
      const std::string mine = found == rank0.end() ? "(not set: another dptrain?)" : found->second;
      if (mine == value) continue;
      throw UsageError("rank " + std::to_string(rank) + " was started with " + name + " " + value +
                       ", rank 0 with " + name + " " + mine +
                       "; every rank needs the same flags and data");
    }
    if (theirs.size() != reference.size()) {
      throw UsageError("rank " + std::to_string(rank) + " publishes " +
                       std::to_string(theirs.size()) + " settings, rank 0 " +
                       std::to_string(reference.size()) +
                       ": another version of dptrain? every rank needs the same build");
    }
  }
}

JoinedWorld::JoinedWorld(const WorldSeat& seat)
    : communicator_(connect_rank(seat, devices_)), local_(seat.local) {
  if (local_) local_->add(communicator_.get());
}

JoinedWorld::~JoinedWorld() {
  if (local_) local_->remove(communicator_.get());
}

void JoinedWorld::leave() {
  communicator_->barrier("final barrier");
  communicator_->shutdown();
}

namespace {

// The failure run_on_threads reports: `order[i]` is when thread i failed, 1 for the first.
void rethrow_first_failure(const std::vector<std::exception_ptr>& errors,
                           const std::vector<int>& order) {
  std::exception_ptr first_collective;
  int first_order = 0;
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const CollectiveError&) {
      if (!first_collective || order[i] < first_order) {
        first_collective = errors[i];
        first_order = order[i];
      }
    }
  }
  if (first_collective) std::rethrow_exception(first_collective);
}

}  // namespace

void run_on_threads(int count, LocalReplicas& replicas, const std::function<void(int)>& run_one) {
  const auto n = static_cast<size_t>(std::max(count, 0));
  std::vector<std::exception_ptr> errors(n);
  std::vector<int> failure_order(n, 0);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        run_one(static_cast<int>(i));
      } catch (...) {
        failure_order[i] = ++failures;
        errors[i] = std::current_exception();
        replicas.abort_all();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  rethrow_first_failure(errors, failure_order);
}

}  // namespace dptrain
