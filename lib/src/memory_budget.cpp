// The memory estimate and the host-memory check. See memory_budget.h.
#include "dptrain/train/memory_budget.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "dptrain/errors.h"

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

std::string gibibytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

}  // namespace

int64_t estimate_training_bytes(int64_t width, int64_t shard_batch) {
  const double w = static_cast<double>(width);
  const double weights = kParametersPerWidthSquared * w * w * kFloatBytes * kWeightCopies;
  const double activations =
      kActivationValuesPerExamplePerWidth * w * static_cast<double>(shard_batch) * kFloatBytes;
  const double total = weights + activations;
  return total > 9.0e18 ? INT64_MAX : static_cast<int64_t>(total);
}

std::optional<int64_t> available_host_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kilobytes = 0;
  std::string unit;
  while (meminfo >> key >> kilobytes >> unit) {
    if (key == "MemAvailable:") return kilobytes * 1024;
  }
  return std::nullopt;
}

void check_host_memory(int64_t width, int64_t shard_batch, int replicas_on_host,
                       int64_t available_bytes) {
  const double needed =
      static_cast<double>(estimate_training_bytes(width, shard_batch)) * replicas_on_host;
  if (needed <= static_cast<double>(available_bytes)) return;
  throw UsageError(
      "--batch-size and --width too large for this machine: " + std::to_string(replicas_on_host) +
      " replica(s) of width " + std::to_string(width) + " on " + std::to_string(shard_batch) +
      " examples each need about " + gibibytes(needed) + ", and " +
      gibibytes(static_cast<double>(available_bytes)) +
      " of memory is available; lower --batch-size or --width");
}

}  // namespace dptrain
