// The memory estimate and the host-memory check. See memory_budget.h.
#include "dptrain/train/memory_budget.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

#include "dptrain/core/errors.h"

namespace dptrain {
namespace {

constexpr double kFloatBytes = 4;
// Parameters at width w: 11,175,818 at w = 64, almost all in w^2 terms.
constexpr double kParametersPerWidthSquared = 11175818.0 / (64.0 * 64.0);
// Copies of the weights while training: the parameters, their gradients in the buckets, and
// autograd's and the optimizer's transient copies.
constexpr double kWeightCopies = 4;
// Float32 values saved for backward per example, per unit of width: each conv, BatchNorm and
// ReLU output at 28x28 (stage 1, w channels), 14x14 (2w), 7x7 (4w) and 4x4 (8w), about 25
// tensors of 784 w values all told, doubled for the backward pass's own temporaries.
constexpr double kActivationValuesPerExamplePerWidth = 2 * 25 * 784;

std::string gibibytes(double bytes, int digits) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f GiB", digits, bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

// What is needed and what is left, with as many digits as it takes to tell them apart: at one
// digit, 0.34 GiB needed of 0.31 left read "need 0.3 GiB, 0.3 GiB left".
std::pair<std::string, std::string> distinct_gibibytes(double needed, double left) {
  for (int digits = 1; digits <= 6; ++digits) {
    auto both = std::make_pair(gibibytes(needed, digits), gibibytes(left, digits));
    if (both.first != both.second) return both;
  }
  return {std::to_string(static_cast<int64_t>(needed)) + " bytes",
          std::to_string(static_cast<int64_t>(left)) + " bytes"};
}

// The estimate in a double, which holds it for any width and batch an int64_t can name (at most
// some 10^45 bytes): the figure a message shows is the estimate, never a saturated one.
double training_bytes(int64_t width, int64_t shard_batch) {
  const double w = static_cast<double>(width);
  const double weights = kParametersPerWidthSquared * w * w * kFloatBytes * kWeightCopies;
  const double activations =
      kActivationValuesPerExamplePerWidth * w * static_cast<double>(shard_batch) * kFloatBytes;
  return weights + activations;
}

}  // namespace

int64_t estimate_training_bytes(int64_t width, int64_t shard_batch) {
  const double total = training_bytes(width, shard_batch);
  return total > 9.0e18 ? INT64_MAX : static_cast<int64_t>(total);
}

std::optional<AvailableMemory> available_host_memory() {
  std::optional<AvailableMemory> available;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kilobytes = 0;
  std::string unit;
  while (meminfo >> key >> kilobytes >> unit) {
    if (key == "MemAvailable:") {
      available = AvailableMemory{kilobytes * 1024, false};
      break;
    }
  }
  // `ulimit -v` (RLIMIT_AS) caps the address space whatever the host has free: what is left of
  // it is what the process can still allocate.
  if (const auto room = address_space_room(); room && (!available || *room < available->bytes)) {
    return AvailableMemory{*room, true};
  }
  return available;
}

std::optional<int64_t> available_host_bytes() {
  const auto available = available_host_memory();
  return available ? std::optional<int64_t>(available->bytes) : std::nullopt;
}

std::optional<int64_t> address_space_room() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  std::ifstream statm("/proc/self/statm");  // the first field: the address space's size in pages
  int64_t pages = 0;
  if (!(statm >> pages)) return std::nullopt;
  const int64_t used = pages * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
  const auto cap = static_cast<int64_t>(std::min<rlim_t>(limit.rlim_cur, INT64_MAX));
  return std::max<int64_t>(cap - used, 0);
}

void check_host_memory(int64_t width, int64_t shard_batch, int replicas_on_host,
                       const AvailableMemory& available, const std::string& sizes) {
  const double needed = training_bytes(width, shard_batch) * replicas_on_host;
  if (needed <= static_cast<double>(available.bytes)) return;
  // A model too wide for the machine at one example per replica cannot be helped by the batch.
  const bool width_alone =
      training_bytes(width, 1) * replicas_on_host > static_cast<double>(available.bytes);
  const std::string advice =
      width_alone ? "even one example per replica does not fit: this machine cannot hold a width-" +
                        std::to_string(width) + " model"
      : sizes.find(" and ") != std::string::npos ? "lower one of them"
                                                 : "lower --batch-size";
  const auto [need_text, left_text] =
      distinct_gibibytes(needed, static_cast<double>(available.bytes));
  throw UsageError(
      sizes + " too large for this machine: " + std::to_string(replicas_on_host) +
      " replica(s) of width " + std::to_string(width) + " on " + std::to_string(shard_batch) +
      " examples each need about " + need_text + ", and " + left_text +
      (available.address_space_limit ? " of address space is left under its limit (ulimit -v)"
                                     : " of memory is available") +
      "; " + advice);
}

void check_host_memory(int64_t width, int64_t shard_batch, int replicas_on_host,
                       int64_t available_bytes, const std::string& sizes) {
  check_host_memory(width, shard_batch, replicas_on_host, AvailableMemory{available_bytes, false},
                    sizes);
}

}  // namespace dptrain
