// The bucketed, overlapping gradient all-reduce. See reducer.h.
#include "dptrain/parallel/reducer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/parallel/distributed.h"

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
// nobody may replace .grad: zero_grad() zeroes the buckets instead. Where others may (LibTorch
// 2.x's Optimizer::zero_grad sets .grad undefined), restore_gradient_views() puts the views back
// before the next backward. The views are detached (not autograd views of the bucket), because
// Optimizer::zero_grad first calls detach_() on each .grad, which autograd refuses for a view.
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
// Note [One dtype per bucket]
// A flat bucket has one dtype and lives on one device, so parameters of several (a float model
// with a double head, a model split over devices) are assigned to buckets group by group, each
// group (one dtype and device, in order of first appearance) by assign_buckets. The buckets of
// all groups are then ordered by their highest parameter index, highest first: roughly the order
// in which backward completes them, and the same on every rank since every rank has the same
// parameters (Note [Launch order]). With a single group this is assign_buckets' own order, so a
// model of one dtype gets exactly the buckets it always had.
namespace {

std::vector<std::vector<size_t>> assign_grouped_buckets(
    const std::vector<torch::Tensor>& parameters, int64_t limit_bytes) {
  std::vector<std::vector<size_t>> groups;  // parameter indices, one dtype and device each
  for (size_t k = 0; k < parameters.size(); ++k) {
    const auto& p = parameters[k];
    auto group = groups.begin();
    for (; group != groups.end(); ++group) {
      const auto& first = parameters[group->front()];
      if (first.dtype() == p.dtype() && first.device() == p.device()) break;
    }
    if (group == groups.end()) {
      groups.emplace_back(std::vector<size_t>{k});
    } else {
      group->push_back(k);
    }
  }
  std::vector<std::vector<size_t>> buckets;
  for (const auto& group : groups) {
    std::vector<int64_t> sizes_bytes;
    for (size_t k : group) {
      sizes_bytes.push_back(parameters[k].numel() *
                            static_cast<int64_t>(parameters[k].element_size()));
    }
    for (auto& local : assign_buckets(sizes_bytes, limit_bytes)) {
      for (auto& index : local) index = group[index];
      buckets.push_back(std::move(local));
    }
  }
  // Each bucket's first index is its highest (assign_buckets walks backwards); no two buckets
  // share one, so the order is total and std::sort is stable enough.
  std::sort(buckets.begin(), buckets.end(),
            [](const auto& a, const auto& b) { return a.front() > b.front(); });
  return buckets;
}

// `numel` zeros of `options` whose first element sits at a multiple of kBucketAlignmentBytes.
torch::Tensor aligned_zeros(int64_t numel, const torch::TensorOptions& options) {
  const int64_t element_size =
      static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
  const int64_t align = kBucketAlignmentBytes / element_size;
  auto storage = torch::zeros({numel + align}, options.requires_grad(false));
  const auto address = reinterpret_cast<uintptr_t>(storage.data_ptr());
  const auto skip = static_cast<int64_t>((kBucketAlignmentBytes - address % kBucketAlignmentBytes) %
                                         kBucketAlignmentBytes) /
                    element_size;
  return storage.narrow(0, skip, numel);
}

}  // namespace

Reducer::Reducer(std::vector<torch::Tensor> parameters, Communicator& communicator,
                 int64_t bucket_bytes)
    : Reducer(std::move(parameters), communicator, [bucket_bytes] {
        ReducerOptions options;
        options.bucket_bytes = bucket_bytes;
        return options;
      }()) {}

Reducer::Reducer(std::vector<torch::Tensor> parameters, Communicator& communicator,
                 ReducerOptions options)
    : parameters_(std::move(parameters)),
      options_(std::move(options)),
      communicator_(communicator) {
  TORCH_CHECK(!parameters_.empty(), "the reducer needs at least one parameter");
  TORCH_CHECK(options_.names.empty() || options_.names.size() == parameters_.size(),
              "reducer: ", options_.names.size(), " names for ", parameters_.size(), " parameters");
  for (const auto& p : parameters_) {
    TORCH_CHECK(p.requires_grad(), "reducer: every parameter must require grad");
    TORCH_CHECK(kBucketAlignmentBytes % static_cast<int64_t>(p.element_size()) == 0,
                "reducer: element size ", p.element_size(), " does not divide the alignment");
  }
  build_buckets(assign_grouped_buckets(parameters_, options_.bucket_bytes));
  hook_accumulators();
}

void Reducer::build_buckets(const std::vector<std::vector<size_t>>& assignment) {
  torch::NoGradGuard no_grad;
  bucket_of_.resize(parameters_.size());
  offset_of_.resize(parameters_.size());
  grad_views_.resize(parameters_.size());
  ready_.assign(parameters_.size(), false);
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket bucket;
    bucket.parameters = assignment[b];
    const auto& first = parameters_[bucket.parameters.front()];
    const int64_t align = kBucketAlignmentBytes / static_cast<int64_t>(first.element_size());
    const auto aligned = [align](int64_t n) { return (n + align - 1) / align * align; };
    int64_t numel = 0;
    for (size_t k : bucket.parameters) numel += aligned(parameters_[k].numel());
    bucket.flat = aligned_zeros(numel, first.options());
    bucket.parameter_flat = aligned_zeros(numel, first.options());
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
      // detach(): the same memory, but not a view in autograd's eyes, so that an optimizer's
      // zero_grad may detach_() it (autograd refuses detach_() on a view).
      grad_views_[k] =
          bucket.flat.narrow(0, offset, p.numel()).as_strided(p.sizes(), p.strides()).detach();
      p.mutable_grad() = grad_views_[k];
      offset_of_[k] = offset;
      offset += aligned(p.numel());
      bucket_of_[k] = b;
    }
    buckets_.push_back(std::move(bucket));
  }
}

void Reducer::hook_accumulators() {
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

torch::Tensor Reducer::slice_of(size_t k, const torch::Tensor& flat) const {
  const auto& p = parameters_[k];
  TORCH_CHECK(flat.dim() == 1 && flat.numel() == buckets_[bucket_of_[k]].flat.numel(),
              "reducer: a flat tensor of ", flat.numel(), " elements is not laid out like bucket ",
              bucket_of_[k]);
  return flat.narrow(0, offset_of_[k], p.numel()).as_strided(p.sizes(), p.strides());
}

void Reducer::restore_gradient_views() {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < parameters_.size(); ++k) {
    auto& grad = parameters_[k].mutable_grad();
    const auto& view = grad_views_[k];
    if (grad.defined() && grad.is_same(view)) continue;
    if (!grad.defined()) {
      view.zero_();
    } else if (grad.data_ptr() != view.data_ptr()) {
      view.copy_(grad);
    }
    grad = view;
  }
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
  if (!armed_)
    return;  // a backward outside prepare/finalize (no_sync, a test's own) reduces nothing
  mark_ready_locked(parameter);
}

void Reducer::mark_ready_locked(size_t parameter) {
  TORCH_CHECK(!ready_[parameter], "reducer: ", name_of(parameter),
              " received its gradient twice in one backward pass");
  ready_[parameter] = true;
  auto& bucket = buckets_[bucket_of_[parameter]];
  if (--bucket.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  const bool divide = options_.average && communicator_.world_size() > 1;
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    auto& bucket = buckets_[next_to_launch_];
    if (divide) {
      torch::NoGradGuard no_grad;
      bucket.flat.div_(communicator_.world_size());
    }
    bucket.work = communicator_.allreduce_sum_async(
        bucket.flat, "gradient all-reduce of bucket " + std::to_string(next_to_launch_));
    ++next_to_launch_;
  }
}

std::string Reducer::name_of(size_t parameter) const {
  if (options_.names.empty()) return "parameter " + std::to_string(parameter);
  return "parameter '" + options_.names[parameter] + "'";
}

void Reducer::finalize_backward() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(armed_, "reducer: finalize_backward without prepare_for_backward");
    armed_ = false;
    if (next_to_launch_ < buckets_.size()) {
      std::vector<size_t> missing;
      for (size_t k = 0; k < parameters_.size(); ++k) {
        if (!ready_[k]) missing.push_back(k);
      }
      if (!options_.find_unused) {
        // The peers wait for buckets this rank will never launch: end the group so that they
        // fail now with a CollectiveError, not at the timeout.
        communicator_.abort();
        throw UsageError(
            "rank " + std::to_string(communicator_.rank()) + ": " + name_of(missing.front()) +
            (missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : "") +
            " got no gradient in this backward pass; a parameter that takes no part in the "
            "loss needs find_unused_parameters = true (DataParallelOptions)");
      }
      // Their slices hold zeros or what backwards outside prepare/finalize accumulated: this
      // rank's gradient for them. The remaining buckets launch in the usual order.
      for (size_t k : missing) mark_ready_locked(k);
    }
  }
  for (auto& bucket : buckets_) communicator_.wait(bucket.work);
}

}  // namespace dptrain
