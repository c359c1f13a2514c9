// Our gradient all-reduce: parameters are grouped into flat buckets, every .grad is a view into
// its bucket, and each bucket's asynchronous all-reduce starts as soon as autograd has
// accumulated all of its gradients, so communication overlaps the rest of backward.
// The parameters themselves move into the same flat layout, so that SGD is one update per bucket
// (bucket_sgd.h). Not here: wrapping a whole module, with its checks and buffers
// (data_parallel.h); the driver's loss weighting that makes the sum a mean (RankTraining::step in
// lib/src/train/rank.cpp).
#pragma once

#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/parallel/bucket_size.h"
#include "dptrain/parallel/distributed.h"

namespace dptrain {

// Bucket assignment, kept separate so that it can be tested without tensors: `sizes_bytes[i]`
// is the gradient size of parameter i. Parameters are taken in reverse order, roughly the order
// in which backward produces their gradients, and a bucket is closed once the next parameter
// would take it past `limit_bytes`. A parameter larger than the limit gets a bucket of its own.
// Returns, per bucket, the parameter indices it holds.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<int64_t>& sizes_bytes,
                                                int64_t limit_bytes);

// Every parameter and gradient in a bucket starts at a multiple of this many bytes (Note
// [Aligned offsets] in reducer.cpp): what cudaMalloc itself guarantees.
constexpr int64_t kBucketAlignmentBytes = 256;

// What a Reducer does beyond the driver's plain sum; the defaults are the driver's reducer.
struct ReducerOptions {
  int64_t bucket_bytes = kDefaultBucketBytes;
  // Each bucket divided by the world size just before its all-reduce, so that .grad holds the
  // ranks' mean (DDP's); exact for power-of-two world sizes. False: the sum.
  bool average = false;
  // At finalize_backward, a parameter without a gradient is taken as ready with what its slice
  // holds (zero, or what backwards outside prepare/finalize accumulated), as DDP's
  // find_unused_parameters. False: a UsageError naming it.
  bool find_unused = false;
  // The parameters' names, for errors; empty: "parameter <index>".
  std::vector<std::string> names;
};

class Reducer {
 public:
  // `parameters` must be dense (contiguous or channels-last); parameters of several dtypes or
  // devices go to separate buckets (Note [One dtype per bucket]). Their data moves into flat
  // per-bucket storage (values unchanged) and their .grad tensors become views into the gradient
  // buckets (zero-initialised), both with the parameter's strides and starting at a multiple of
  // kBucketAlignmentBytes. The communicator must outlive the reducer.
  Reducer(std::vector<torch::Tensor> parameters, Communicator& communicator,
          int64_t bucket_bytes = kDefaultBucketBytes);
  Reducer(std::vector<torch::Tensor> parameters, Communicator& communicator,
          ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Zeroes every gradient in place (the views must stay views, so never set .grad undefined).
  void zero_grad();
  // Puts back every .grad that is no longer its bucket view (Note [Gradients as bucket views]):
  // an undefined one (LibTorch 2.x's Optimizer::zero_grad) as a zeroed slice, a replaced one
  // with its values copied into the slice. Call before a backward when others may touch .grad.
  void restore_gradient_views();
  // Call before loss.backward(): arms the readiness counters for this step. A backward without
  // prepare/finalize around it (no_sync) reduces nothing: its gradients accumulate in the views.
  void prepare_for_backward();
  // Call after loss.backward(): waits for every bucket; each .grad then holds the sum over ranks
  // (the mean with ReducerOptions::average). Throws CollectiveError when a peer fails, and a
  // UsageError naming a parameter that got no gradient unless ReducerOptions::find_unused (this
  // rank's process group is aborted first, so that its peers fail at once instead of waiting).
  void finalize_backward();

  size_t num_buckets() const { return buckets_.size(); }
  // The flat gradient storage of bucket `i`, (numel) of the parameters' dtype: the gradients
  // in bucket order, each followed by zeros up to the next aligned offset.
  const torch::Tensor& bucket(size_t i) const { return buckets_[i].flat; }
  const std::vector<size_t>& bucket_parameters(size_t i) const { return buckets_[i].parameters; }
  // The flat parameter storage of bucket `i`, laid out exactly like bucket(i) (Note [Parameters
  // in bucket layout]): an update of it is an update of every parameter it holds.
  const torch::Tensor& parameter_bucket(size_t i) const { return buckets_[i].parameter_flat; }
  size_t num_parameters() const { return parameters_.size(); }
  const torch::Tensor& parameter(size_t k) const { return parameters_[k]; }
  size_t bucket_of(size_t k) const { return bucket_of_[k]; }
  // Parameter k's slice of `flat`, a tensor laid out like bucket(bucket_of(k)) (its momentum
  // buffer, say): the parameter's shape and strides, sharing `flat`'s memory.
  torch::Tensor slice_of(size_t k, const torch::Tensor& flat) const;

 private:
  struct Bucket {
    torch::Tensor flat;              // (sum of numel) gradient storage
    torch::Tensor parameter_flat;    // (sum of numel) parameter storage, the same layout
    std::vector<size_t> parameters;  // indices into parameters_
    size_t pending = 0;              // gradients still to come this step
    Communicator::Pending work;      // the all-reduce in flight
  };

  // Lays out the buckets of `assignment` (parameter indices, one dtype and device each).
  void build_buckets(const std::vector<std::vector<size_t>>& assignment);
  void hook_accumulators();
  void mark_ready(size_t parameter);  // called from the autograd post hook
  void mark_ready_locked(size_t parameter);
  void launch_ready_buckets();  // launches buckets strictly in index order
  std::string name_of(size_t parameter) const;

  std::vector<torch::Tensor> parameters_;
  ReducerOptions options_;
  std::vector<torch::Tensor> grad_views_;  // parameter -> its slice of its gradient bucket
  std::vector<size_t> bucket_of_;          // parameter -> bucket
  std::vector<int64_t> offset_of_;         // parameter -> its first element in its bucket
  std::vector<bool> ready_;                // parameter -> gradient accumulated this step
  std::vector<Bucket> buckets_;
  size_t next_to_launch_ = 0;
  bool armed_ = false;
  Communicator& communicator_;
  // The owning pointer autograd hands out for a gradient accumulator: std::shared_ptr<Node> in
  // LibTorch 1.13 and 2.11, c10::intrusive_ptr<Node> in 2.15. Taken from the API, not a version.
  using AccumulatorPtr =
      decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()));
  // The gradient accumulators our hooks hang on; autograd drops a hook whose accumulator dies.
  std::vector<AccumulatorPtr> accumulators_;
  std::mutex mutex_;  // hooks may run on autograd's device threads
};

}  // namespace dptrain
