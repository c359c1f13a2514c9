// Our gradient all-reduce: parameters are grouped into flat buckets, every .grad is a view into
// its bucket, and each bucket's asynchronous all-reduce starts as soon as autograd has
// accumulated all of its gradients, so communication overlaps the rest of backward.
// The parameters themselves move into the same flat layout, so that plain SGD is one update per
// bucket. Not here: the loss weighting that makes the sum a mean (RankTraining::step in
// lib/src/train/rank.cpp).
#pragma once

#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
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

class Reducer {
 public:
  // `parameters` must all have the same dtype and device, and be dense (contiguous or
  // channels-last). Their data moves into flat per-bucket storage (values unchanged) and their
  // .grad tensors become views into the gradient buckets (zero-initialised), both with the
  // parameter's strides and starting at a multiple of kBucketAlignmentBytes. The communicator
  // must outlive the reducer.
  Reducer(std::vector<torch::Tensor> parameters, Communicator& communicator,
          int64_t bucket_bytes = kDefaultBucketBytes);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Zeroes every gradient in place (the views must stay views, so never set .grad undefined).
  void zero_grad();
  // Call before loss.backward(): arms the readiness counters for this step.
  void prepare_for_backward();
  // Call after loss.backward(): waits for every bucket; each .grad then holds the sum over ranks.
  // Throws CollectiveError when a peer fails, std::logic_error when a parameter got no gradient.
  void finalize_backward();

  // Plain SGD on every parameter: p -= lr * p.grad, one fused update per bucket. Bit-identical
  // to torch::optim::SGD without momentum or weight decay.
  void sgd_step(double lr);

  size_t num_buckets() const { return buckets_.size(); }
  // The flat gradient storage of bucket `i`, (numel) of the parameters' dtype: the gradients
  // in bucket order, each followed by zeros up to the next aligned offset.
  const torch::Tensor& bucket(size_t i) const { return buckets_[i].flat; }
  const std::vector<size_t>& bucket_parameters(size_t i) const { return buckets_[i].parameters; }

 private:
  struct Bucket {
    torch::Tensor flat;              // (sum of numel) gradient storage
    torch::Tensor parameter_flat;    // (sum of numel) parameter storage, the same layout
    std::vector<size_t> parameters;  // indices into parameters_
    size_t pending = 0;              // gradients still to come this step
    Communicator::Pending work;      // the all-reduce in flight
  };

  void mark_ready(size_t parameter);  // called from the autograd post hook
  void launch_ready_buckets();        // launches buckets strictly in index order

  std::vector<torch::Tensor> parameters_;
  std::vector<size_t> bucket_of_;  // parameter -> bucket
  std::vector<bool> ready_;        // parameter -> gradient accumulated this step
  std::vector<Bucket> buckets_;
  size_t next_to_launch_ = 0;
  bool armed_ = false;
  Communicator& communicator_;
  // The owning pointer autograd hands out for a gradient accumulator: std::shared_ptr<Node> in
  // LibTorch 1.13 and 2.11, c10::intrusive_ptr<Node> in 2.15. Taken from the API, not a version.
  using AccumulatorPtr = decltype(torch::autograd::impl::grad_accumulator(
      std::declval<const torch::Tensor&>()));
  // The gradient accumulators our hooks hang on; autograd drops a hook whose accumulator dies.
  std::vector<AccumulatorPtr> accumulators_;
  std::mutex mutex_;  // hooks may run on autograd's device threads
};

}  // namespace dptrain
