// The bucketed, overlapping gradient all-reduce. See reducer.h.
#include "dptrain/parallel/reducer.h"
#include "dptrain/parallel/distributed.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dptrain {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<int64_t>& sizes_bytes,
                                                int64_t limit_bytes) {
  if (limit_bytes <= 0) throw std::invalid_argument("bucket size must be positive");
  std::vector<std::vector<size_t>> buckets;
  int64_t filled = 0;
  for (size_t k = sizes_bytes.size(); k-- > 0;) {
    if (buckets.empty() || (filled > 0 && filled + sizes_bytes[k] > limit_bytes)) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(k);
    filled += sizes_bytes[k];
  }
  return buckets;
}

// Note [Gradients as bucket views]
// Each parameter's .grad is a view into its bucket's flat tensor. Autograd's AccumulateGrad adds
// into an existing .grad in place, so after backward the bucket already holds this rank's
// gradients contiguously, the all-reduce works on it directly, and the optimizer reads the
// reduced values through the same views: no packing or unpacking copies. The price is that
// nobody may replace .grad: zero_grad() zeroes the buckets instead (LibTorch 2.x's
// Optimizer::zero_grad would set .grad undefined and break the views).
//
// Note [Parameters in bucket layout]
// The parameters are moved into flat tensors laid out exactly like the gradient buckets, each
// parameter's data a view (with its own strides, so channels-last stays channels-last). Plain
// SGD, p -= lr * grad, is then one add_ per bucket instead of one per parameter: the same
// element-wise arithmetic, so the same bits, with a tenth of the kernel launches.
//
// Note [Aligned offsets]
// Packed end to end, a bucket that begins with fc.bias (10 floats, the last parameter, so the
// first in bucket 0) leaves every later view only 8-byte aligned. cuDNN picks its algorithms
// partly by pointer alignment and vectorised kernels fall back to narrower loads, so every
// parameter (and its gradient) starts at a multiple of kBucketAlignmentBytes, from a base that
// is aligned too (the CPU allocator promises only 64 bytes, so the base is found inside a slightly
// larger allocation). The gaps are zeros in both flat tensors and stay zeros: no gradient is
// ever accumulated there, sums of zeros are zeros, and SGD moves them by lr * 0. Values and
// arithmetic are those of the packed layout, bit for bit.
//
// Note [Launch order]
// Autograd decides when each gradient is ready; that order can differ between ranks in
// principle, but the collectives must be issued in the same order everywhere. A bucket is
// therefore launched only when it is complete AND every bucket before it has been launched.
Reducer::Reducer(std::vector<torch::Tensor> parameters, Communicator& communicator,
                 int64_t bucket_bytes)
    : parameters_(std::move(parameters)), communicator_(communicator) {
  TORCH_CHECK(!parameters_.empty(), "the reducer needs at least one parameter");
  const auto options = parameters_.front().options();
  std::vector<int64_t> sizes_bytes;
  for (const auto& p : parameters_) {
    TORCH_CHECK(p.requires_grad(), "reducer: every parameter must require grad");
    TORCH_CHECK(p.dtype() == options.dtype() && p.device() == options.device(),
                "reducer: parameters must share dtype and device");
    sizes_bytes.push_back(p.numel() * static_cast<int64_t>(p.element_size()));
  }
  const auto assignment = assign_buckets(sizes_bytes, bucket_bytes);
  const int64_t element_size = static_cast<int64_t>(parameters_.front().element_size());
  TORCH_CHECK(kBucketAlignmentBytes % element_size == 0, "reducer: element size ", element_size,
              " does not divide the alignment");
  const int64_t align = kBucketAlignmentBytes / element_size;  // in elements
  const auto aligned = [align](int64_t n) { return (n + align - 1) / align * align; };
  // `numel` zeros whose first element sits at an aligned address.
  const auto aligned_zeros = [&](int64_t numel) {
    auto storage = torch::zeros({numel + align}, options.requires_grad(false));
    const auto address = reinterpret_cast<uintptr_t>(storage.data_ptr());
    const auto skip =
        static_cast<int64_t>((kBucketAlignmentBytes - address % kBucketAlignmentBytes) %
                             kBucketAlignmentBytes) /
        element_size;
    return storage.narrow(0, skip, numel);
  };

  torch::NoGradGuard no_grad;
  bucket_of_.resize(parameters_.size());
  ready_.assign(parameters_.size(), false);
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket bucket;
    bucket.parameters = assignment[b];
    int64_t numel = 0;
    for (size_t k : bucket.parameters) numel += aligned(parameters_[k].numel());
    bucket.flat = aligned_zeros(numel);
    bucket.parameter_flat = aligned_zeros(numel);
    int64_t offset = 0;
    for (size_t k : bucket.parameters) {
      auto& p = parameters_[k];
      TORCH_CHECK(p.is_non_overlapping_and_dense(), "reducer: parameter ", k,
                  " is not dense; it cannot live in a flat bucket");
      // View the slice with the parameter's own strides (contiguous or channels-last).
      auto data =
          bucket.parameter_flat.narrow(0, offset, p.numel()).as_strided(p.sizes(), p.strides());
      data.copy_(p.detach());
      p.set_data(data);
      p.mutable_grad() =
          bucket.flat.narrow(0, offset, p.numel()).as_strided(p.sizes(), p.strides());
      offset += aligned(p.numel());
      bucket_of_[k] = b;
    }
    buckets_.push_back(std::move(bucket));
  }

  for (size_t k = 0; k < parameters_.size(); ++k) {
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters_[k]);
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, k](const torch::autograd::variable_list& outputs,
                  const torch::autograd::variable_list& /*inputs*/) {
          mark_ready(k);
          return outputs;
        }));
    accumulators_.push_back(std::move(accumulator));
  }
}

Reducer::~Reducer() {
  // A pending all-reduce may still write into a bucket; let it finish before the memory goes.
  for (auto& bucket : buckets_) {
    try {
      communicator_.wait(bucket.work);
    } catch (const std::exception&) {
      // The error was, or will be, reported by finalize_backward; a destructor must not throw.
    }
  }
}

void Reducer::zero_grad() {
  torch::NoGradGuard no_grad;
  for (auto& bucket : buckets_) bucket.flat.zero_();
}

void Reducer::sgd_step(double lr) {
  torch::NoGradGuard no_grad;
  for (auto& bucket : buckets_) bucket.parameter_flat.add_(bucket.flat, -lr);
}

void Reducer::prepare_for_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& bucket : buckets_) bucket.pending = bucket.parameters.size();
  ready_.assign(parameters_.size(), false);
  next_to_launch_ = 0;
  armed_ = true;
}

void Reducer::mark_ready(size_t parameter) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;  // a backward outside training (say, a test's own) is not ours to reduce
  TORCH_CHECK(!ready_[parameter], "reducer: parameter ", parameter,
              " received its gradient twice in one backward pass");
  ready_[parameter] = true;
  auto& bucket = buckets_[bucket_of_[parameter]];
  if (--bucket.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    auto& bucket = buckets_[next_to_launch_];
    bucket.work = communicator_.allreduce_sum_async(
        bucket.flat, "gradient all-reduce of bucket " + std::to_string(next_to_launch_));
    ++next_to_launch_;
  }
}

void Reducer::finalize_backward() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(armed_, "reducer: finalize_backward without prepare_for_backward");
    armed_ = false;
    if (next_to_launch_ < buckets_.size()) {
      std::string missing;
      for (size_t k = 0; k < parameters_.size(); ++k) {
        if (!ready_[k]) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      }
      throw std::logic_error("reducer: parameters without a gradient after backward: " + missing +
                             " (every parameter must take part in the loss)");
    }
  }
  for (auto& bucket : buckets_) communicator_.wait(bucket.work);
}

}  // namespace dptrain
