// One rank's handle on the world of replicas: the c10d process group (Gloo or NCCL) behind a
// small interface of the collectives dptrain needs, each bounded by a timeout and named in its
// errors. A world of one needs no process group: every collective is then the identity.
// Not here: which gradients are reduced when (reducer.h), or how ranks find each other
// (rendezvous.h).
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "dptrain/errors.h"

namespace dptrain {

enum class Backend { kGloo, kNccl };

std::string backend_name(Backend backend);
// True where this build of dptrain (and its LibTorch) carries the backend.
bool backend_available(Backend backend);

struct WorldOptions {
  Backend backend = Backend::kGloo;
  // Bounds the rendezvous and every collective; a peer that is not there by then is an error.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // All ranks on this machine: Gloo then talks over 127.0.0.1. Otherwise it uses the interface
  // named by GLOO_SOCKET_IFNAME, else the one this host's name resolves to.
  bool loopback = true;
};

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
  Communicator(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
               const WorldOptions& options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Starts an in-place sum of `tensor` over all ranks; `what` names it in errors.
  Pending allreduce_sum_async(torch::Tensor tensor, const std::string& what);
  // Waits, bounded by the timeout; throws CollectiveError naming this rank and `what`.
  void wait(Pending& pending);

  // Blocking forms of the above, and the others dptrain needs.
  void allreduce_sum(torch::Tensor tensor, const std::string& what);
  void allreduce_max(torch::Tensor tensor, const std::string& what);
  void broadcast(torch::Tensor tensor, int root, const std::string& what);
  void barrier(const std::string& what);

 private:
  struct ProcessGroup;  // hides the c10d class, whose base differs between 1.13 and 2.x
  // After a failed collective: which ranks still answer through the store (Note [Naming the
  // missing rank] in distributed.cpp).
  std::string diagnose_peers();

  std::unique_ptr<ProcessGroup> group_;
  c10::intrusive_ptr<c10d::Store> store_;
  bool diagnosed_ = false;
  int rank_ = 0;
  int world_size_ = 1;
  std::chrono::milliseconds timeout_{0};
};

}  // namespace dptrain
