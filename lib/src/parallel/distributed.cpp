// The Communicator: c10d process groups behind dptrain's few collectives, with timeouts and
// errors that name the rank. LibTorch 1.13 derives its process groups from c10d::ProcessGroup,
// 2.x from c10d::Backend; the difference stays inside this file.
#include "dptrain/parallel/distributed.h"

#include <signal.h>
#include <stdlib.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/parallel/rendezvous.h"

// DPTRAIN_WITH_GLOO: third_party/dependencies.cmake found Gloo headers that compile against this
// LibTorch's ProcessGroupGloo.hpp (option DPTRAIN_GLOO).
#if defined(DPTRAIN_WITH_GLOO) && defined(USE_C10D_GLOO)
#define DPTRAIN_HAVE_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
// DPTRAIN_WITH_NCCL: third_party/nccl.cmake found the nccl.h of the NCCL version this LibTorch
// was built with, and it compiles against its ProcessGroupNCCL.hpp (option DPTRAIN_NCCL; Note
// [nccl.h must be the NCCL LibTorch was built with]).
#if defined(DPTRAIN_WITH_CUDA) && defined(DPTRAIN_WITH_NCCL) && defined(USE_C10D_NCCL) && \
    TORCH_VERSION_MAJOR >= 2
#define DPTRAIN_HAVE_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace dptrain {

#if TORCH_VERSION_MAJOR >= 2
using ProcessGroupBase = c10d::Backend;
#else
using ProcessGroupBase = c10d::ProcessGroup;
#endif

struct Communicator::ProcessGroup {
  c10::intrusive_ptr<ProcessGroupBase> group;
};

std::string backend_name(Backend backend) { return backend == Backend::kNccl ? "nccl" : "gloo"; }

bool backend_available(Backend backend) {
  (void)backend;  // a build with neither backend compiled in looks at nothing
#if defined(DPTRAIN_HAVE_NCCL)
  if (backend == Backend::kNccl) return true;
#endif
#if defined(DPTRAIN_HAVE_GLOO)
  if (backend == Backend::kGloo) return true;
#endif
  return false;
}

// ---- The NCCL environment ---------------------------------------------------------

// Note [NCCL failures end in our error line]
// LibTorch 2.x's ProcessGroupNCCL reads its error handling mode once, in its constructor, from
// TORCH_NCCL_ASYNC_ERROR_HANDLING (old name NCCL_ASYNC_ERROR_HANDLING), defaulting to 3,
// SkipCleanUp (ProcessGroupNCCL.cpp: `getCvarInt(TORCH_NCCL_ASYNC_ERROR_HANDLING, 3)`). When a
// collective fails or outlives Options::timeout, its watchdog thread calls
// WorkNCCL::handleException(mode), which rethrows on the watchdog thread for every mode that
// SHOULD_TEAR_DOWN (ProcessGroupNCCL.hpp: 1 and 3): std::terminate, a core dump, no error line.
// Mode 2, CleanUpOnly, aborts the communicators instead (so kernels stuck on a dead peer end and
// a host blocked in a CUDA call returns) and leaves the exception on the work, where wait() and
// wait_host() find it and throw CollectiveError. Two more defaults, only where the user chose no
// dumps: TORCH_NCCL_DUMP_ON_TIMEOUT=0, because with it the heartbeat monitor thread, once a
// collective has failed, dumps the flight recorder and then sleeps
// TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (8 minutes) before std::abort() unless the group was aborted
// first (HeartbeatMonitor::runLoop); and TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC=0, because the
// watchdog sleeps four times that (a minute by default) after each failed work, so that ranks
// can dump, before it aborts anything: with no dump there is nothing to wait for.
std::vector<std::pair<std::string, std::string>> nccl_environment_defaults(
    const std::function<const char*(const char*)>& lookup) {
  std::vector<std::pair<std::string, std::string>> defaults;
  if (!lookup("TORCH_NCCL_ASYNC_ERROR_HANDLING") && !lookup("NCCL_ASYNC_ERROR_HANDLING")) {
    defaults.emplace_back("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2");
  }
  if (!lookup("TORCH_NCCL_DUMP_ON_TIMEOUT")) {
    defaults.emplace_back("TORCH_NCCL_DUMP_ON_TIMEOUT", "0");
    if (!lookup("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC")) {
      defaults.emplace_back("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "0");
    }
  }
  return defaults;
}

// Note [Blocking wait as c10d reads it]
// LibTorch 2.x's ProcessGroupNCCL sets blockingWait_ = getCvarBool(TORCH_NCCL_BLOCKING_WAIT,
// false) in its constructor, where TORCH_NCCL_BLOCKING_WAIT is {"TORCH_NCCL_BLOCKING_WAIT",
// "NCCL_BLOCKING_WAIT"} (ProcessGroupNCCL.hpp). getCvarBool (c10d/Utils.hpp, the same in 2.11's
// headers) walks the names from the last to the first, so the new name's value overwrites the
// old one's; it lowers each value and reads 1/y/yes/t/true as on and 0/n/no/f/false as off, and
// any other value, the empty one included, fails a TORCH_CHECK ("Invalid value for environment
// variable: NAME") whichever name holds it. This reads them the same way, so that dptrain
// refuses exactly what c10d would run with blocking wait, and says so before c10d would throw.
// LibTorch 1.13 read only NCCL_BLOCKING_WAIT and only 0 and 1; its CPU builds have no NCCL.
NcclBlockingWait nccl_blocking_wait(const std::function<const char*(const char*)>& lookup) {
  NcclBlockingWait wait;
  for (const char* name : {"NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT"}) {  // old, then new
    const char* set = lookup(name);
    if (set == nullptr) continue;
    std::string value(set);
    std::transform(value.begin(), value.end(), value.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (value == "1" || value == "y" || value == "yes" || value == "t" || value == "true") {
      wait.on = true;
    } else if (value == "0" || value == "n" || value == "no" || value == "f" || value == "false") {
      wait.on = false;
    } else {
      throw UsageError(std::string(name) + "='" + set +
                       "' is not a value LibTorch's NCCL process group reads: it takes "
                       "1/y/yes/t/true or 0/n/no/f/false, in any case; set one or unset " +
                       name);
    }
    wait.name = name;
    wait.value = set;
  }
  return wait;
}

void prepare_nccl_environment() {
  for (const auto& [name, value] : nccl_environment_defaults(std::getenv)) {
    ::setenv(name.c_str(), value.c_str(), /*overwrite=*/0);
  }
}

// ---- Pending ----------------------------------------------------------------

Communicator::Pending::Pending(c10::intrusive_ptr<c10d::Work> work, std::string what)
    : work_(std::move(work)), what_(std::move(what)) {}
Communicator::Pending::Pending(Pending&&) noexcept = default;
Communicator::Pending& Communicator::Pending::operator=(Pending&&) noexcept = default;
Communicator::Pending::~Pending() = default;
bool Communicator::Pending::active() const { return static_cast<bool>(work_); }

// ---- Creation ---------------------------------------------------------------

namespace {

#if defined(DPTRAIN_HAVE_GLOO)
std::shared_ptr<::gloo::transport::Device> make_gloo_device(bool loopback) {
  if (loopback) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface && *interface) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}
#endif

// c10d appends a C++ stack trace to some messages; the first line says what happened.
std::string first_line(std::string text) {
  if (const auto newline = text.find('\n'); newline != std::string::npos) text.resize(newline);
  return text;
}

}  // namespace

Communicator::Communicator() = default;

Communicator::~Communicator() {
  // Still open here means an exception is unwinding this rank: abort, so that no peer waits for
  // it, and so that LibTorch's destructor has nothing to flush or warn about.
  if (group_ && !shut_down_) abort();
  // A stop ended a wait on a collective that is still in flight: ProcessGroupGloo's destructor
  // would drain its work queue, i.e. wait for that collective, for the stalled peer, up to the
  // timeout (abort() stops nothing in Gloo). The process is on its way out with the stop's
  // error, so the group is left to the exit (Note [A stop request ends a wait on a collective]).
  if (group_ && stopped_in_flight_) (void)group_->group.release();
}

Communicator::Communicator(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                           const WorldOptions& options)
    : group_(std::make_unique<ProcessGroup>()),
      store_(store),
      rank_(rank),
      world_size_(world_size),
      timeout_(options.timeout),
      collective_timeout_(options.timeout - diagnosis_budget(options.timeout)),
      rank_hosts_(options.rank_hosts),
      stop_signal_(options.stop_signal) {
  TORCH_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rank ", rank,
              " is outside a world of ", world_size);
  if (!backend_available(options.backend)) {
    throw std::runtime_error("the " + backend_name(options.backend) +
                             " backend is not available in this build of dptrain (LibTorch " +
                             TORCH_VERSION + ")");
  }
  try {
#if defined(DPTRAIN_HAVE_NCCL)
    if (options.backend == Backend::kNccl) {
      prepare_nccl_environment();  // a no-op once main() has done it
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      // The watchdog's bound on every collective (Note [NCCL failures end in our error line]).
      nccl_options->timeout = collective_timeout_;
      group_->group =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, nccl_options);
      stream_ordered_ = true;
      return;
    }
#endif
#if defined(DPTRAIN_HAVE_GLOO)
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(collective_timeout_);
    gloo_options->devices.push_back(make_gloo_device(options.loopback));
    gloo_options->threads = 2;  // two in-flight collectives per rank: buckets overlap each other
    group_->group =
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo_options);
#endif
  } catch (const std::exception& e) {
    std::ostringstream message;
    message << "rank " << rank << " of " << world_size << ": could not connect the "
            << backend_name(options.backend) << " process group within "
            << options.timeout.count() / 1000.0 << " s: " << first_line(e.what());
    throw CollectiveError(message.str());
  }
}

void Communicator::shutdown() {
  if (!group_ || shut_down_ || aborted_) return;
  shut_down_ = true;
#if TORCH_VERSION_MAJOR >= 2
  try {
    group_->group->shutdown();  // NCCL: finalises and destroys the communicators
  } catch (const std::exception& e) {
    throw CollectiveError("rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) +
                          ": shutting down the process group failed: " + first_line(e.what()));
  }
#endif
}

void Communicator::abort() {
  if (!group_ || aborted_.exchange(true)) return;
#if TORCH_VERSION_MAJOR >= 2
  try {
    group_->group->abort();  // NCCL: ncclCommAbort on every communicator; Gloo: nothing
  } catch (const std::exception&) {
    // Aborting happens on the way out of a failure, which is the error worth reporting.
  }
#endif
}

// ---- Collectives ------------------------------------------------------------

// Note [Waiting without blocking the host]
// c10d's Work::wait(timeout) means different things per backend. Gloo runs collectives on its
// own threads, and waiting is the host's to do. ProcessGroupNCCL enqueues on a CUDA stream of its
// own; WorkNCCL::wait() without a timeout only makes the current stream wait for that stream's
// end event, but with any timeout it also blocks the host in a polling loop until the kernel has
// finished (ProcessGroupNCCL.hpp, WorkNCCL::wait: "Otherwise, it will block the CPU thread until
// the NCCL work is completed or timed out"; pytorch#100162). Passing our timeout would therefore
// make every gradient bucket, every sync-bn statistic and every buffer average a host
// synchronisation. So on NCCL wait() orders streams only, and the host blocks in wait_host() --
// bounded by our timeout, polling the newest collective -- just before it reads a value. NCCL
// keeps one stream per device for a process group, so the newest collective finishing means all
// earlier ones did. Where the host is stuck inside a CUDA call instead (a full launch queue
// behind a collective that never ends), ProcessGroupNCCL's watchdog ends the wait after
// Options::timeout by aborting the communicators (Note [NCCL failures end in our error line]).

Communicator::Pending Communicator::launch(
    const std::function<c10::intrusive_ptr<c10d::Work>()>& start, const std::string& what) {
  if (aborted_) fail(what, "this rank's process group was aborted after a failure");
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = start();
  } catch (const std::exception& e) {
    abort();  // peers would otherwise wait for a collective this rank never joins
    throw CollectiveError("rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) +
                          ": could not start " + what + ": " + first_line(e.what()));
  }
  if (stream_ordered_) {
    std::lock_guard<std::mutex> lock(last_mutex_);
    last_work_ = work;
    last_what_ = what;
  }
  return Pending(std::move(work), what);
}

Communicator::Pending Communicator::allreduce_sum_async(torch::Tensor tensor,
                                                        const std::string& what) {
  if (!group_) return Pending();
  std::vector<torch::Tensor> tensors{std::move(tensor)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.timeout = collective_timeout_;
  return launch([&] { return group_->group->allreduce(tensors, options); }, what);
}

void Communicator::wait(Pending& pending) {
  if (!pending.active()) return;
  auto work = std::move(pending.work_);
  std::string reason;
  try {
    if (stream_ordered_) {
      work->wait();  // the current stream waits; throws if the watchdog has seen a failure
    } else {
      // Gloo fails the operation itself after the timeout given at creation; the wait bound is
      // the second line of defence against a stall that Gloo does not notice.
      wait_in_slices(work, pending.what_);
    }
    return;
  } catch (const StopEndedTheWait&) {
    throw;
  } catch (const std::exception& e) {
    reason = e.what();
  }
  fail(pending.what_, reason);
}

// Note [A stop request ends a wait on a collective]
// A stop request is answered at the next step boundary, where the ranks agree on it (rank.cpp).
// A rank whose peer stalled (SIGSTOP, a hung file system, a lost host) never gets there: it
// waits in a collective for the whole timeout (300 s by default), past the grace a scheduler
// gives between SIGTERM and SIGKILL (30 s for Kubernetes and Slurm), and is killed with no
// word. So every wait on a collective looks at the stop request (WorldOptions::stop_signal):
// Gloo's in slices of kWaitSlice (Work::wait(timeout) returns the moment the work finishes,
// so slicing costs a finished collective nothing), NCCL's host-side poll on every turn. Once
// the request is kStopGrace old and the collective has still not finished, the rank fails
// with StopEndedTheWait, a CollectiveError that says so; peers that are alive reach any
// collective well within the grace (they are at most a step apart), so a stop among healthy
// ranks still ends at the step boundary with a checkpoint. The peers are not diagnosed (Note
// [Naming the missing rank]): its budget would be spent on ranks that stopped waiting too.
namespace {
constexpr std::chrono::milliseconds kWaitSlice{100};
}  // namespace

void Communicator::wait_in_slices(const c10::intrusive_ptr<c10d::Work>& work,
                                  const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + collective_timeout_;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      work->wait(std::max(std::chrono::milliseconds(1), std::min(kWaitSlice, left)));
      return;
    } catch (const std::exception&) {
      // The slice ran out ("Operation timed out!"), or the work failed. A work that completed
      // after its slice ran out is asked again: wait() then returns at once for a success and
      // throws the work's own failure otherwise (taking completion alone for a failure turned a
      // collective that finished at a slice's end into a timeout).
      if (work->isCompleted()) {
        work->wait(std::chrono::milliseconds(1));
        return;
      }
      if (std::chrono::steady_clock::now() >= deadline) throw;  // the caller reports it
    }
    fail_if_stopped(what);
  }
}

void Communicator::fail_if_stopped(const std::string& what) {
  const int signal_number = stop_signal_ ? stop_signal_->load() : 0;
  if (signal_number == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (stop_seen_ == std::chrono::steady_clock::time_point{}) stop_seen_ = now;
  if (now - stop_seen_ < kStopGrace) return;
  stopped_in_flight_ = true;
  abort();  // peers waiting for this rank fail fast too
  std::ostringstream message;
  message << "rank " << rank_ << " of " << world_size_ << ": the stop request (signal "
          << signal_number << ") ended the wait for " << what << ", which had not finished "
          << kStopGrace.count() / 1000.0
          << " s after it (a peer stalled or died); no checkpoint was written for this stop";
  throw StopEndedTheWait(message.str());
}

void Communicator::wait_host(const std::string& what) {
  if (!stream_ordered_) return;
  if (aborted_) fail(what, "this rank's process group was aborted after a failure");
  c10::intrusive_ptr<c10d::Work> work;
  std::string last;
  {
    std::lock_guard<std::mutex> lock(last_mutex_);
    work = last_work_;
    last = last_what_;
  }
  if (work) wait_host_for(work, last + " (awaited before " + what + ")");
}

void Communicator::wait_host_for(const c10::intrusive_ptr<c10d::Work>& work,
                                 const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + collective_timeout_;
  std::string reason;
  try {
    while (!work->isCompleted() && !aborted_) {
      if (std::chrono::steady_clock::now() >= deadline) {
        reason = "did not finish within the timeout";
        break;
      }
      fail_if_stopped(what);  // Note [A stop request ends a wait on a collective]
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (reason.empty() && work->exception()) std::rethrow_exception(work->exception());
  } catch (const StopEndedTheWait&) {
    throw;
  } catch (const std::exception& e) {
    reason = e.what();
  }
  if (reason.empty() && aborted_) reason = "this rank's process group was aborted after a failure";
  if (!reason.empty()) fail(what, reason);
}

void Communicator::fail(const std::string& what, std::string reason) {
  abort();  // NCCL: kernels waiting for a peer end, and peers waiting for us fail fast
  std::ostringstream message;
  message << "rank " << rank_ << " of " << world_size_ << ": " << what << " failed (timeout "
          << timeout_.count() / 1000.0 << " s): " << first_line(std::move(reason))
          << diagnose_peers();
  throw CollectiveError(message.str());
}

// Note [Naming the missing rank]
// Gloo reports a failed collective as a closed connection or a timeout, naming at best a peer's
// address. To name the rank, every rank that sees a collective fail checks in under a key of
// the rendezvous store and waits a little for the others: a rank that died, stalls or is cut
// off never checks in. Only the first failure is diagnosed; the store may be gone as well (it
// lives in rank 0's process, or in torchrun's agent on rank 0's host), which is then what the
// message says. The store can also go while the check-ins are polled: rank 0 (or the agent,
// seeing rank 0 fail) ends on the same failure a little sooner. The last full round then still
// names who had not checked in, and the message gives both (poll_check_ins). All of it fits in
// --timeout: collectives get the timeout less diagnosis_budget(), and the diagnosis gets that
// budget. A store behind a network partition does not fail, it blocks for its own timeout (its
// socket's, which cannot be shortened), so the check-in runs on a thread of its own that is
// abandoned, still blocked, when the budget is spent: the process is on its way out with an
// error.
std::chrono::milliseconds diagnosis_budget(std::chrono::milliseconds timeout) {
  return std::min<std::chrono::milliseconds>(timeout / 5, std::chrono::seconds(3));
}

std::string Communicator::diagnose_peers() {
  if (!store_ || world_size_ == 1 || diagnosed_) return "";
  diagnosed_ = true;
  const auto budget = diagnosis_budget(timeout_);
  const auto hosts_of = [&](const std::vector<int>& ranks) {
    std::vector<std::string> hosts;
    for (int r : ranks) {
      if (r < static_cast<int>(rank_hosts_.size()) &&
          std::find(hosts.begin(), hosts.end(), rank_hosts_[r]) == hosts.end()) {
        hosts.push_back(rank_hosts_[r]);
      }
    }
    std::string text;
    for (const auto& h : hosts) text += (text.empty() ? "" : ", ") + h;
    return text.empty() ? text : " (on " + text + ")";
  };
  const std::string store_host = hosts_of({0});
  auto answer = std::make_shared<std::promise<CheckIns>>();
  auto silent_ranks = answer->get_future();
  std::thread([store = store_, rank = rank_, world = world_size_, poll = budget * 4 / 5, answer] {
    // Abandoned, this thread may write to the store's socket after its peer closed it: with
    // SIGPIPE blocked here that write fails with EPIPE instead of ending the process (a
    // thread's own write raises the signal on that thread).
    sigset_t pipe_signal;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
    try {
      const std::string prefix = "dptrain/failure/";
      store->set(prefix + std::to_string(rank), std::vector<uint8_t>{'1'});
      answer->set_value(poll_check_ins(*store, prefix, world, poll));
    } catch (...) {
      answer->set_exception(std::current_exception());
    }
  }).detach();
  if (silent_ranks.wait_for(budget) != std::future_status::ready) {
    std::ostringstream text;
    text << "; the rendezvous store" << store_host << " did not answer within "
         << budget.count() / 1000.0 << " s either: that host died or is unreachable from here";
    return text.str();
  }
  try {
    const auto check_ins = silent_ranks.get();
    const auto& silent = check_ins.missing;
    if (silent.empty()) return "; every rank is still alive";
    if (!check_ins.store_error.empty()) {
      std::ostringstream text;
      text << "; rank(s) " << rank_list(silent) << " did not answer" << hosts_of(silent)
           << " within " << check_ins.polled.count() / 1000.0 << " s, then the rendezvous store"
           << store_host << " went away too (rank 0 or the launcher ended)";
      return text.str();
    }
    return "; rank(s) " + rank_list(silent) + " did not answer" + hosts_of(silent) +
           ": died, stalled or unreachable";
  } catch (const std::exception&) {
    return "; the rendezvous store" + store_host +
           " is unreachable too (rank 0 or the launcher may have died)";
  }
}

// Start and wait: allreduce_sum and broadcast feed device work, allreduce_max and barrier the
// host (complete()).
void Communicator::allreduce_sum(torch::Tensor tensor, const std::string& what) {
  auto pending = allreduce_sum_async(std::move(tensor), what);
  wait(pending);
}

void Communicator::allreduce_max(torch::Tensor tensor, const std::string& what) {
  if (!group_) return;
  std::vector<torch::Tensor> tensors{std::move(tensor)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  options.timeout = collective_timeout_;
  auto pending = launch([&] { return group_->group->allreduce(tensors, options); }, what);
  complete(pending);
}

void Communicator::broadcast(torch::Tensor tensor, int root, const std::string& what) {
  if (!group_) return;
  std::vector<torch::Tensor> tensors{std::move(tensor)};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.timeout = collective_timeout_;
  auto pending = launch([&] { return group_->group->broadcast(tensors, options); }, what);
  wait(pending);
}

void Communicator::barrier(const std::string& what) {
  if (!group_) return;
  c10d::BarrierOptions options;
  options.timeout = collective_timeout_;
  auto pending = launch([&] { return group_->group->barrier(options); }, what);
  complete(pending);
}

void Communicator::complete(Pending& pending) {
  if (!pending.active()) return;
  if (stream_ordered_) wait_host_for(pending.work_, pending.what_);
  wait(pending);
}

}  // namespace dptrain
