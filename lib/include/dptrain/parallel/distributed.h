// One rank's handle on the world of replicas: the c10d process group (Gloo or NCCL) behind a
// small interface of the collectives dptrain needs, each bounded by a timeout and named in its
// errors. A world of one needs no process group (every collective is then the identity), but
// may have one. Not here: which gradients are reduced when (reducer.h), or how ranks find each
// other (rendezvous.h).
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"

namespace dptrain {

enum class Backend { kGloo, kNccl };

std::string backend_name(Backend backend);
// True where this build of dptrain (and its LibTorch) carries the backend.
bool backend_available(Backend backend);

// The environment variables dptrain sets for LibTorch's NCCL process group, as (name, value)
// pairs, given `lookup` (getenv, or a test's map): only those the user has not set, under either
// of the names LibTorch reads (Note [NCCL failures end in our error line] in distributed.cpp).
std::vector<std::pair<std::string, std::string>> nccl_environment_defaults(
    const std::function<const char*(const char*)>& lookup);
// Whether LibTorch's NCCL process group will use blocking wait, read from `lookup` (getenv, or a
// test's map) as c10d reads TORCH_NCCL_BLOCKING_WAIT and its old name NCCL_BLOCKING_WAIT (Note
// [Blocking wait as c10d reads it] in distributed.cpp). Throws UsageError naming the variable
// and the spellings c10d takes for a value that c10d would refuse.
struct NcclBlockingWait {
  bool on = false;
  std::string name;   // the variable that decided: the new name when both are set; empty: neither
  std::string value;  // its value as set
};
NcclBlockingWait nccl_blocking_wait(const std::function<const char*(const char*)>& lookup);
// Sets nccl_environment_defaults(getenv). Call it before any thread starts (setenv races with
// getenv in other threads): main() does, first thing. Harmless without NCCL and when repeated.
void prepare_nccl_environment();

struct WorldOptions {
  Backend backend = Backend::kGloo;
  // Bounds the rendezvous and every collective, the report of a failed one included: a peer
  // that is not there by then is an error (Note [Naming the missing rank] in distributed.cpp).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // The host of every rank, in rank order, as the rendezvous learnt them: a failure names the
  // hosts of the ranks that stopped answering. Empty: ranks only.
  std::vector<std::string> rank_hosts;
  // All ranks on this machine: Gloo then talks over 127.0.0.1. Otherwise it uses the interface
  // named by GLOO_SOCKET_IFNAME, else the one this host's name resolves to.
  bool loopback = true;
  // A stop request (a signal number, set by a signal handler; null: none can come): a wait on a
  // collective that has not finished kStopGrace after the request ends with a CollectiveError
  // saying so, instead of waiting out the timeout for a peer that stalled (Note [A stop request
  // ends a wait on a collective] in distributed.cpp).
  const std::atomic<int>* stop_signal = nullptr;
};

// How long a collective may still take once a stop is requested: enough for peers that are
// alive to reach it (they are at most a step apart), short of a scheduler's grace (30 s).
constexpr std::chrono::milliseconds kStopGrace{1000};

// A wait on a collective that a stop request ended (Note [A stop request ends a wait on a
// collective] in distributed.cpp): the message says so, and no peer was diagnosed.
class StopEndedTheWait : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// Gloo writes to sockets that a failed peer may have closed: a process with a Communicator must
// ignore SIGPIPE (the dptrain binary does, app/signals.h), or that write ends it.
class Communicator {
 public:
  // An asynchronous collective in flight; wait() on it before reading its tensor.
  class Pending {
   public:
    Pending() = default;
    explicit Pending(c10::intrusive_ptr<c10d::Work> work, std::string what);
    Pending(Pending&&) noexcept;
    Pending& operator=(Pending&&) noexcept;
    ~Pending();
    bool active() const;

   private:
    friend class Communicator;
    c10::intrusive_ptr<c10d::Work> work_;
    std::string what_;
  };

  // The world of one: no process group, no communication.
  Communicator();
  // Creates this rank's process group on `store`; every rank of the world must do the same.
  // A world of one made this way has a real process group, so its collectives really run.
  Communicator(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
               const WorldOptions& options);
  // Aborts the process group unless shutdown() ended it (a failure is on its way up).
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // What a collective may take: the timeout less the time kept for naming the missing ranks.
  std::chrono::milliseconds collective_timeout() const { return collective_timeout_; }
  // True when there is a process group, so collectives communicate (even in a world of one).
  bool has_process_group() const { return group_ != nullptr; }

  // Starts an in-place sum of `tensor` over all ranks; `what` names it in errors.
  Pending allreduce_sum_async(torch::Tensor tensor, const std::string& what);
  // Makes later work wait for `pending` (Note [Waiting without blocking the host]): on NCCL the
  // current CUDA stream waits and the host goes on; elsewhere the host waits, bounded by the
  // timeout. Throws CollectiveError naming this rank and `what` for a failure known by then.
  void wait(Pending& pending);
  // Blocks the host until every collective started so far has finished, bounded by the
  // timeout. Call it before the host reads a value computed after a wait() (an item(), a copy
  // to the CPU). Throws CollectiveError, after aborting the process group, when one failed,
  // timed out or the group was aborted. Returns at once where wait() already blocks.
  void wait_host(const std::string& what);

  // Start and wait() in one: the result is there for work queued after it (sync-bn
  // statistics, buffers, weights). Before the host reads it, wait_host().
  void allreduce_sum(torch::Tensor tensor, const std::string& what);
  void broadcast(torch::Tensor tensor, int root, const std::string& what);
  // These return once the host may read the result: they are for agreements between ranks.
  void allreduce_max(torch::Tensor tensor, const std::string& what);
  void barrier(const std::string& what);

  // Ends the process group after the last collective of a successful run (LibTorch 2.4+ warns
  // about a group that is only destroyed). Call on every rank, after a barrier.
  void shutdown();
  // Ends the process group at once: collectives in flight stop, and peers waiting for this
  // rank fail instead of waiting out the timeout. Safe from another thread, and idempotent.
  void abort();

 private:
  struct ProcessGroup;  // hides the c10d class, whose base differs between 1.13 and 2.x
  // Starts one collective through `start`, wrapping its errors like every other failure.
  Pending launch(const std::function<c10::intrusive_ptr<c10d::Work>()>& start,
                 const std::string& what);
  // wait(), preceded on NCCL by the host-side wait for this collective (blocking forms).
  void complete(Pending& pending);
  // Polls `work` until it finishes, fails or the timeout passes (NCCL's host-side wait).
  void wait_host_for(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what);
  // Gloo's wait: in slices of the timeout, so that a stop request is seen. Throws what the work
  // failed with, or c10d's "Operation timed out!" at the timeout.
  void wait_in_slices(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what);
  // Called while a collective is unfinished: fails `what` once a stop request is kStopGrace old.
  void fail_if_stopped(const std::string& what);
  // The CollectiveError for a failed `what` (aborting the group first, so peers fail too).
  [[noreturn]] void fail(const std::string& what, std::string reason);
  // After a failed collective: which ranks still answer through the store (Note [Naming the
  // missing rank] in distributed.cpp).
  std::string diagnose_peers();

  std::unique_ptr<ProcessGroup> group_;
  c10::intrusive_ptr<c10d::Store> store_;
  bool diagnosed_ = false;
  bool shut_down_ = false;
  std::atomic<bool> aborted_{false};
  bool stream_ordered_ = false;  // NCCL: wait() orders streams, wait_host() blocks the host
  std::mutex last_mutex_;        // launches may come from autograd's device threads
  c10::intrusive_ptr<c10d::Work> last_work_;  // the latest collective started (NCCL only)
  std::string last_what_;
  int rank_ = 0;
  int world_size_ = 1;
  std::chrono::milliseconds timeout_{0};
  std::chrono::milliseconds collective_timeout_{0};
  std::vector<std::string> rank_hosts_;
  const std::atomic<int>* stop_signal_ = nullptr;
  // When this rank's waits first saw the stop request (the epoch: not yet).
  std::chrono::steady_clock::time_point stop_seen_{};
  bool stopped_in_flight_ = false;  // a stop ended a wait: the group is left to the exit
};

// The part of `timeout` kept, after a collective fails, for finding out which ranks still
// answer: a fifth, at most 3 s.
std::chrono::milliseconds diagnosis_budget(std::chrono::milliseconds timeout);

}  // namespace dptrain
