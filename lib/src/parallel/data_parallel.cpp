// DataParallel: the checks, the buffer broadcast and the guards around the reducer that make it
// a wrapper for any module. See data_parallel.h.
// Not here: the buckets, hooks and all-reduces themselves (reducer.cpp).
#include "dptrain/parallel/data_parallel.h"

#include <torch/nn/module.h>
#include <torch/types.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/parallel/bucket_sgd.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/reducer.h"
#include "dptrain/parallel/replicas.h"
#include "dptrain/parallel/world.h"

namespace dptrain {

namespace {

// "float [10, 512]", and ", frozen" for a parameter that takes no gradient.
std::string describe(const torch::Tensor& p) {
  std::string dtype = c10::toString(p.scalar_type());
  std::transform(dtype.begin(), dtype.end(), dtype.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::ostringstream text;
  text << dtype << ' ' << p.sizes() << (p.requires_grad() ? "" : ", frozen");
  return text.str();
}

// FNV-1a, 63 bits so that negating it cannot overflow: the same on every rank and build.
int64_t hash63(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ULL;
  return static_cast<int64_t>(hash >> 1);
}

// Element-wise max over the ranks of `values` and of their negations: returns, per value, the
// largest and the smallest over the ranks. On `device` (NCCL takes CUDA tensors only).
std::vector<std::pair<int64_t, int64_t>> extremes(const std::vector<int64_t>& values,
                                                  const torch::Device& device,
                                                  Communicator& communicator,
                                                  const std::string& what) {
  const auto n = static_cast<int64_t>(values.size());
  auto both = torch::empty({2 * n}, torch::kInt64);
  for (int64_t i = 0; i < n; ++i) {
    both[i] = values[static_cast<size_t>(i)];
    both[n + i] = -values[static_cast<size_t>(i)];
  }
  auto reduced = both.to(device);
  communicator.allreduce_max(reduced, what);
  const auto host = reduced.to(torch::kCPU);
  const auto* data = host.data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> result;
  for (int64_t i = 0; i < n; ++i) result.emplace_back(data[i], -data[n + i]);
  return result;
}

// The device of the wrapper's collectives: the module's (NCCL takes CUDA tensors only).
torch::Device collective_device(const torch::nn::Module& module) {
  const auto named = module.named_parameters();
  return named.is_empty() ? torch::Device(torch::kCPU) : named[0].value().device();
}

// Every option that shapes the buckets, the collectives or the step, exactly (doubles to 17
// digits), for comparing across ranks.
std::string describe_options(const DataParallelOptions& o) {
  std::ostringstream text;
  text.precision(17);
  text << "bucket_bytes " << o.bucket_bytes << ", average " << o.average
       << ", find_unused_parameters " << o.find_unused_parameters << ", buffers "
       << (o.buffers == BufferSync::kBroadcast ? "broadcast" : "none") << ", sync_batch_norm "
       << o.sync_batch_norm << ", momentum " << o.sgd.momentum << ", nesterov " << o.sgd.nesterov
       << ", weight_decay " << o.sgd.weight_decay << ", weight_decay_skip_vectors "
       << o.sgd.weight_decay_skip_vectors;
  return text.str();
}

// Every rank must wrap with the same valid options. A rank whose options are out of range
// refuses them after one collective that tells its peers, which refuse too, naming it: without
// it they would wait for that rank in the parameter check until the timeout. Ranks with
// different options would bucket, reduce or step differently: each learns it here.
void check_same_options(const DataParallelOptions& options, const torch::Device& device,
                        Communicator& communicator) {
  std::string fault;
  try {
    check_sgd_options(options.sgd);
  } catch (const UsageError& e) {
    fault = e.what();
  }
  if (communicator.world_size() > 1) {
    const auto rank = communicator.rank();
    const auto text = describe_options(options);
    const auto ranges =
        extremes({fault.empty() ? 0 : int64_t{rank} + 1, hash63(text)}, device, communicator,
                 "the check that every rank wraps with the same options");
    if (fault.empty() && ranges[0].first > 0) {
      throw UsageError("DataParallel: rank " + std::to_string(ranges[0].first - 1) +
                       " refused its options (out of range; that rank names the option): every "
                       "rank must wrap with the same valid options");
    }
    if (fault.empty() && ranges[1].first != ranges[1].second) {
      throw UsageError("rank " + std::to_string(rank) +
                       "'s DataParallelOptions differ from another rank's (here: " + text +
                       "): every rank must wrap with the same options");
    }
  }
  if (!fault.empty()) throw UsageError(fault);
}

// Every rank must wrap the same parameters (names, dtypes, shapes, which ones train): else the
// broadcast and the buckets would pair different tensors. Each rank learns the first difference.
void check_same_parameters(const torch::nn::Module& module, const torch::Device& device,
                           Communicator& communicator) {
  if (communicator.world_size() == 1) return;
  const auto named = module.named_parameters();
  const std::string what = "the check that every rank wraps the same parameters";
  const std::string rank = "rank " + std::to_string(communicator.rank());
  const auto count = static_cast<int64_t>(named.size());
  const auto counts = extremes({count}, device, communicator, what).front();
  if (counts.first != counts.second) {
    throw UsageError(rank + "'s module has " + std::to_string(count) +
                     " parameters, another rank's has " +
                     std::to_string(count == counts.first ? counts.second : counts.first) +
                     ": every rank must wrap the same model");
  }
  std::vector<int64_t> hashes;
  for (const auto& item : named)
    hashes.push_back(hash63(item.key() + ' ' + describe(item.value())));
  const auto ranges = extremes(hashes, device, communicator, what);
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].first == ranges[i].second) continue;
    throw UsageError(rank + "'s module differs from another rank's at parameter '" +
                     named[i].key() + "' (" + describe(named[i].value()) +
                     " here): every rank must wrap the same model");
  }
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module, Communicator& communicator,
                           const DataParallelOptions& options)
    : module_(std::move(module)), communicator_(communicator), options_(options) {
  if (!module_) throw UsageError("DataParallel: no module to wrap");
  const auto device = collective_device(*module_);
  check_same_options(options_, device, communicator_);
  check_same_parameters(*module_, device, communicator_);
  broadcast_from_rank0(*module_, communicator_);
  ReducerOptions reducer_options;
  reducer_options.bucket_bytes = options_.bucket_bytes;
  reducer_options.average = options_.average;
  reducer_options.find_unused = options_.find_unused_parameters;
  for (const auto& item : module_->named_parameters()) {
    all_names_.push_back(item.key());
    all_parameters_.push_back(item.value());
    if (!item.value().requires_grad()) continue;
    names_.push_back(item.key());
    parameters_.push_back(item.value());
  }
  if (parameters_.empty()) {
    throw UsageError("DataParallel: the module has no parameter that requires a gradient");
  }
  reducer_options.names = names_;
  reducer_ = std::make_unique<Reducer>(parameters_, communicator_, reducer_options);
  sgd_ = std::make_unique<BucketSgd>(*reducer_, options_.sgd);
  for (const auto& p : parameters_) {
    data_.push_back(p.data_ptr());
    grad_data_.push_back(p.grad().data_ptr());
  }
  record_versions();
  if (options_.sync_batch_norm) set_replica_sync(&communicator_);
}

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module, World& world,
                           const DataParallelOptions& options)
    : DataParallel(std::move(module), world.communicator(), options) {}

DataParallel::~DataParallel() {
  if (options_.sync_batch_norm) set_replica_sync(nullptr);
}

void DataParallel::set_replica_sync(Communicator* communicator) {
  for (const auto& child : module_->modules(/*include_self=*/true)) {
    if (auto* synchronised = dynamic_cast<SynchronisedAcrossReplicas*>(child.get())) {
      synchronised->set_sync(communicator);
    }
  }
}

void DataParallel::check_module_unchanged() const {
  const auto named = module_->named_parameters();
  const size_t common = std::min(named.size(), all_parameters_.size());
  for (size_t i = 0; i < common; ++i) {
    if (named[i].key() == all_names_[i] && named[i].value().is_same(all_parameters_[i])) continue;
    throw UsageError("DataParallel: the module's parameter '" + all_names_[i] +
                     "' was replaced after wrapping (the module now has '" + named[i].key() +
                     "' there): wrap the module once its parameters are final");
  }
  if (named.size() != all_parameters_.size()) {
    const bool added = named.size() > all_parameters_.size();
    throw UsageError("DataParallel: the module's parameter '" +
                     (added ? named[common].key() : all_names_[common]) + "' was " +
                     (added ? "added" : "removed") +
                     " after wrapping: wrap the module once its parameters are final");
  }
  for (size_t k = 0; k < parameters_.size(); ++k) {
    if (parameters_[k].data_ptr() == data_[k]) continue;
    throw UsageError("DataParallel: parameter '" + names_[k] +
                     "' was replaced or moved after wrapping (set_data, to()), so it no longer "
                     "lives in its gradient bucket: move or convert the module before wrapping it");
  }
}

bool DataParallel::stepped_since_backward() const {
  for (size_t k = 0; k < parameters_.size(); ++k) {
    const auto& p = parameters_[k];
    if (p._version() != versions_after_backward_[k]) return true;  // an optimizer's step
    const auto& grad = p.grad();
    if (!grad.defined() || grad.data_ptr() != grad_data_[k]) return true;  // set to none
    if (grad._version() != grad_versions_after_backward_[k]) return true;  // zeroed in place
  }
  return false;
}

void DataParallel::record_versions() {
  versions_after_backward_.clear();
  grad_versions_after_backward_.clear();
  for (const auto& p : parameters_) {
    versions_after_backward_.push_back(p._version());
    grad_versions_after_backward_.push_back(p.grad()._version());
  }
}

void DataParallel::broadcast_buffers() {
  if (options_.buffers != BufferSync::kBroadcast || communicator_.world_size() == 1) return;
  torch::NoGradGuard no_grad;
  for (auto& item : module_->named_buffers()) {
    communicator_.broadcast(item.value(), /*root=*/0, "broadcast of buffer " + item.key());
  }
}

void DataParallel::backward(const torch::Tensor& loss) {
  check_module_unchanged();
  if (reduced_since_step_ && stepped_since_backward()) reduced_since_step_ = false;
  if (no_sync_depth_ > 0) {
    reducer_->restore_gradient_views();
    loss.backward();
    record_versions();
    return;
  }
  if (reduced_since_step_) {
    throw UsageError(
        "DataParallel: a second backward() with neither an optimizer step nor zero_grad since "
        "the last one would reduce the gradients twice; to accumulate gradients over several "
        "backward passes, run all but the last inside no_sync()");
  }
  broadcast_buffers();
  reducer_->restore_gradient_views();
  reducer_->prepare_for_backward();
  loss.backward();
  reducer_->finalize_backward();
  reduced_since_step_ = true;
  record_versions();
}

DataParallel::NoSync::NoSync(DataParallel& owner) : owner_(owner) { ++owner_.no_sync_depth_; }

DataParallel::NoSync::~NoSync() { --owner_.no_sync_depth_; }

void DataParallel::zero_grad() {
  reducer_->restore_gradient_views();
  reducer_->zero_grad();
  reduced_since_step_ = false;
}

void DataParallel::sgd_step(double lr) {
  check_module_unchanged();
  reducer_->restore_gradient_views();  // a gradient set to none moves its parameter by nothing
  sgd_->step(lr);
  reduced_since_step_ = false;
}

torch::Tensor DataParallel::clip_grad_norm(double max_norm) {
  if (!std::isfinite(max_norm) || max_norm <= 0) {
    std::ostringstream message;
    message << "DataParallel::clip_grad_norm: max_norm " << max_norm
            << " is out of range; expected a finite number > 0";
    throw UsageError(message.str());
  }
  check_module_unchanged();
  reducer_->restore_gradient_views();
  return clip_gradient_norm(*reducer_, max_norm);
}

void DataParallel::average_buffers() { dptrain::average_buffers(*module_, communicator_); }

void DataParallel::check_replicas_identical(int64_t when) {
  dptrain::check_replicas_identical(*module_, communicator_, when);
}

}  // namespace dptrain
