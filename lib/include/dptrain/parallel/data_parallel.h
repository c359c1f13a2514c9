// Data parallelism for any torch::nn::Module, in the shape of PyTorch's DistributedDataParallel:
// wrap the model once, and every backward() leaves in each parameter's .grad the mean of the
// ranks' gradients, all-reduced in buckets while backward still runs, ready for any torch::optim
// optimizer. Not here: joining the world (world.h), the buckets themselves (reducer.h), sharding
// the data (LibTorch's torch::data::samplers::DistributedRandomSampler; docs/library.md).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dptrain/parallel/bucket_sgd.h"
#include "dptrain/parallel/bucket_size.h"
#include "dptrain/parallel/distributed.h"

namespace dptrain {

class Reducer;
class World;

// What happens to the module's buffers (BatchNorm's running statistics) at each synchronised
// backward, before the gradients are reduced.
enum class BufferSync {
  kBroadcast,  // rank 0's buffers copied to every rank, as DDP's broadcast_buffers=True
  kNone,       // each rank keeps its own; average_buffers() before evaluating
};

struct DataParallelOptions {
  // Gradient bucket size, as DDP's bucket_cap_mb.
  int64_t bucket_bytes = kDefaultBucketBytes;
  // True: each .grad is the mean over the ranks (each rank's loss a mean over its own shard, as
  // in DDP). False: the sum; the caller weights each rank's loss (the dptrain driver divides its
  // shard's summed loss by the global batch, exact for shards of unequal size).
  bool average = true;
  // A parameter that got no gradient in a synchronised backward (an unused branch): true takes
  // it as a zero gradient on this rank, as DDP's find_unused_parameters=True; false makes it a
  // UsageError naming the parameter, raised on the rank that lacked it.
  bool find_unused_parameters = false;
  BufferSync buffers = BufferSync::kBroadcast;
  // Hands the world's communicator to every module inside that implements
  // SynchronisedAcrossReplicas (dptrain::BatchNorm: statistics over the global batch).
  bool sync_batch_norm = false;
  // What sgd_step applies: momentum, Nesterov, weight decay (bucket_sgd.h). The defaults are
  // plain SGD; a value out of range is a UsageError when wrapping, on every rank.
  SgdOptions sgd;
};

// A module whose forward needs the other replicas (sync BatchNorm): DataParallel with
// sync_batch_norm gives it the communicator; nullptr returns it to per-replica work.
class SynchronisedAcrossReplicas {
 public:
  virtual ~SynchronisedAcrossReplicas() = default;
  virtual void set_sync(Communicator* communicator) = 0;
};

class DataParallel {
 public:
  // Checks that every rank wraps with the same valid options (a UsageError on every rank, the
  // refusing rank's naming the option, the others that rank) and that every rank's module has
  // the same parameters (names, dtypes, shapes; a difference is a UsageError naming the first
  // parameter that differs), then copies rank 0's parameters and buffers to every rank and
  // puts the parameters that require a gradient into the reducer's buckets (one dtype and
  // device per bucket; values unchanged). The module and the communicator must outlive the
  // wrapper; the module's parameters must not be replaced or moved afterwards (a later backward
  // names the one that was).
  DataParallel(std::shared_ptr<torch::nn::Module> module, Communicator& communicator,
               const DataParallelOptions& options = {});
  DataParallel(std::shared_ptr<torch::nn::Module> module, World& world,
               const DataParallelOptions& options = {});
  template <typename ModuleType>
  DataParallel(const torch::nn::ModuleHolder<ModuleType>& module, World& world,
               const DataParallelOptions& options = {})
      : DataParallel(std::static_pointer_cast<torch::nn::Module>(module.ptr()), world, options) {}
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // loss.backward(), with the gradients reduced over the ranks as their buckets fill; when it
  // returns, every .grad holds the ranks' mean (or sum, DataParallelOptions::average). Inside a
  // no_sync() scope: a plain local backward whose gradients accumulate into the next
  // synchronised one. Throws UsageError for a wrong use (a second synchronised backward with
  // neither an optimizer step nor zero_grad between; a parameter replaced after wrapping; an
  // unused parameter without find_unused_parameters), CollectiveError when a peer fails.
  void backward(const torch::Tensor& loss);

  // While one is alive, backward() reduces nothing (gradient accumulation, as DDP's no_sync()).
  class NoSync {
   public:
    explicit NoSync(DataParallel& owner);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DataParallel& owner_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // Zeroes every gradient in place. Optimizers' own zero_grad (which in LibTorch 2.x sets .grad
  // undefined) works too: the next backward puts the bucket views back.
  void zero_grad();
  // SGD with options().sgd (by default plain: p -= lr * p.grad), one fused update per bucket:
  // bit-identical to torch::optim::SGD with the same lr, momentum, Nesterov and weight decay
  // (tests show it). The rate may change from step to step (a schedule).
  void sgd_step(double lr);
  // torch::nn::utils::clip_grad_norm_(parameters, max_norm) on the reduced gradients, between
  // backward and sgd_step; returns the norm before clipping, a () tensor on the device.
  torch::Tensor clip_grad_norm(double max_norm);
  // The fused SGD's state: its momentum buffers, to checkpoint and load_momentum on a resume.
  BucketSgd& sgd() { return *sgd_; }
  // Every floating-point buffer replaced by its mean over the ranks (before evaluating).
  void average_buffers();
  // A CollectiveError naming `when` unless every rank's parameters are bit-identical.
  void check_replicas_identical(int64_t when);

  torch::nn::Module& module() { return *module_; }
  Communicator& communicator() { return communicator_; }
  const DataParallelOptions& options() const { return options_; }

 private:
  void check_module_unchanged() const;  // UsageError naming a parameter replaced since wrapping
  // Whether a step or a zero_grad touched the parameters or their gradients since the latest
  // backward (the version counters say so).
  bool stepped_since_backward() const;
  void broadcast_buffers();
  void record_versions();  // what stepped_since_backward compares against
  void set_replica_sync(Communicator* communicator);

  std::shared_ptr<torch::nn::Module> module_;
  Communicator& communicator_;
  DataParallelOptions options_;
  // Every parameter of the module as wrapped, by name: a later list that differs is a change.
  std::vector<std::string> all_names_;
  std::vector<torch::Tensor> all_parameters_;
  std::vector<std::string> names_;         // the reduced parameters' names
  std::vector<torch::Tensor> parameters_;  // the reduced parameters, as wrapped
  std::vector<const void*> data_;          // where each one's data lives in its bucket
  std::vector<const void*> grad_data_;     // where each one's .grad lives in its bucket
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<BucketSgd> sgd_;  // steps the reducer's buckets
  int no_sync_depth_ = 0;
  // Set by a synchronised backward; a second one before a step or zero_grad is refused.
  bool reduced_since_step_ = false;
  // Each parameter's version counter and its gradient's, after the latest backward: an
  // optimizer's step bumps the first, its in-place zero_grad (LibTorch 1.13) the second.
  std::vector<int64_t> versions_after_backward_;
  std::vector<int64_t> grad_versions_after_backward_;
};

}  // namespace dptrain
