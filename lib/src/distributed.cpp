// The Communicator: c10d process groups behind dptrain's few collectives, with timeouts and
// errors that name the rank. LibTorch 1.13 derives its process groups from c10d::ProcessGroup,
// 2.x from c10d::Backend; the difference stays inside this file.
#include "dptrain/distributed.h"

#include <torch/version.h>

#include <cstdlib>
#include <sstream>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>

#include "dptrain/rendezvous.h"

// DPTRAIN_WITH_GLOO: third_party/dependencies.cmake found Gloo headers that compile against this
// LibTorch's ProcessGroupGloo.hpp (option DPTRAIN_GLOO).
#if defined(DPTRAIN_WITH_GLOO) && defined(USE_C10D_GLOO)
#define DPTRAIN_HAVE_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if defined(DPTRAIN_WITH_CUDA) && defined(USE_C10D_NCCL) && TORCH_VERSION_MAJOR >= 2
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
#if defined(DPTRAIN_HAVE_NCCL)
  if (backend == Backend::kNccl) return true;
#endif
#if defined(DPTRAIN_HAVE_GLOO)
  if (backend == Backend::kGloo) return true;
#endif
  return false;
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

}  // namespace

Communicator::Communicator() = default;
Communicator::~Communicator() = default;

Communicator::Communicator(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                           const WorldOptions& options)
    : group_(std::make_unique<ProcessGroup>()),
      store_(store),
      rank_(rank),
      world_size_(world_size),
      timeout_(options.timeout) {
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
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = options.timeout;
      group_->group =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, nccl_options);
      return;
    }
#endif
#if defined(DPTRAIN_HAVE_GLOO)
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo_options->devices.push_back(make_gloo_device(options.loopback));
    gloo_options->threads = 2;  // two in-flight collectives per rank: buckets overlap each other
    group_->group =
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo_options);
#endif
  } catch (const std::exception& e) {
    std::ostringstream message;
    message << "rank " << rank << " of " << world_size << ": could not connect the "
            << backend_name(options.backend) << " process group within "
            << options.timeout.count() / 1000.0 << " s: " << e.what();
    throw CollectiveError(message.str());
  }
}

// ---- Collectives ------------------------------------------------------------

Communicator::Pending Communicator::allreduce_sum_async(torch::Tensor tensor,
                                                        const std::string& what) {
  if (world_size_ == 1) return Pending();
  std::vector<torch::Tensor> tensors{std::move(tensor)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.timeout = timeout_;
  try {
    return Pending(group_->group->allreduce(tensors, options), what);
  } catch (const std::exception& e) {
    throw CollectiveError("rank " + std::to_string(rank_) + ": could not start " + what + ": " +
                          e.what());
  }
}

void Communicator::wait(Pending& pending) {
  if (!pending.active()) return;
  auto work = std::move(pending.work_);
  try {
    // Gloo fails the operation itself after the timeout given at creation; the wait bound is the
    // second line of defence against a stall that Gloo does not notice.
    work->wait(timeout_);
  } catch (const std::exception& e) {
    std::string reason = e.what();
    // c10d appends a C++ stack trace to some messages; the first line says what happened.
    if (const auto newline = reason.find('\n'); newline != std::string::npos) {
      reason.resize(newline);
    }
    std::ostringstream message;
    message << "rank " << rank_ << " of " << world_size_ << ": " << pending.what_
            << " failed (timeout " << timeout_.count() / 1000.0 << " s): " << reason
            << diagnose_peers();
    throw CollectiveError(message.str());
  }
}

// Note [Naming the missing rank]
// Gloo reports a failed collective as a closed connection or a timeout, naming at best a peer's
// address. To name the rank, every rank that sees a collective fail checks in under a key of
// the rendezvous store and waits a few seconds for the others: a rank that died or stalls
// never checks in. Only the first failure is diagnosed; the store may be gone as well (it lives
// in rank 0's process, or in torchrun's agent), which is then what the message says.
std::string Communicator::diagnose_peers() {
  if (!store_ || world_size_ == 1 || diagnosed_) return "";
  diagnosed_ = true;
  constexpr auto kGrace = std::chrono::seconds(3);
  try {
    const std::string prefix = "dptrain/failure/";
    store_->set(prefix + std::to_string(rank_), std::vector<uint8_t>{'1'});
    const auto silent = ranks_missing_after(*store_, prefix, world_size_, kGrace);
    if (silent.empty()) return "; every rank is still alive";
    return "; rank(s) " + rank_list(silent) + " did not answer: died or stalled";
  } catch (const std::exception&) {
    return "; the rendezvous store is unreachable too (rank 0 or the launcher may have died)";
  }
}

void Communicator::allreduce_sum(torch::Tensor tensor, const std::string& what) {
  auto pending = allreduce_sum_async(std::move(tensor), what);
  wait(pending);
}

void Communicator::allreduce_max(torch::Tensor tensor, const std::string& what) {
  if (world_size_ == 1) return;
  std::vector<torch::Tensor> tensors{std::move(tensor)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  options.timeout = timeout_;
  Pending pending(group_->group->allreduce(tensors, options), what);
  wait(pending);
}

void Communicator::broadcast(torch::Tensor tensor, int root, const std::string& what) {
  if (world_size_ == 1) return;
  std::vector<torch::Tensor> tensors{std::move(tensor)};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.timeout = timeout_;
  Pending pending(group_->group->broadcast(tensors, options), what);
  wait(pending);
}

void Communicator::barrier(const std::string& what) {
  if (world_size_ == 1) return;
  c10d::BarrierOptions options;
  options.timeout = timeout_;
  Pending pending(group_->group->barrier(options), what);
  wait(pending);
}

}  // namespace dptrain
