// A cheap guard against absurd sizes: an estimate of what one replica needs for a given width
// and batch, checked against the host memory available before anything is allocated, so that
// --batch-size 10000000 is a clear usage error and not a crash deep in an allocator.
// Not here: the out-of-memory errors that still happen (train.cpp turns them into one line).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dptrain {

// Bytes one replica of width `width` needs to train on `shard_batch` examples at once: weights,
// gradients, gradient buckets and saved activations of the book's ResNet-18 on 28x28 inputs,
// in float32. An estimate within a factor of two, used only to refuse impossible runs.
int64_t estimate_training_bytes(int64_t width, int64_t shard_batch);

// What the process may still allocate: MemAvailable from /proc/meminfo, or what
// address_space_room leaves where that is less (then `address_space_limit`).
struct AvailableMemory {
  int64_t bytes = 0;
  bool address_space_limit = false;
};
std::optional<AvailableMemory> available_host_memory();  // nothing where neither can be read
std::optional<int64_t> available_host_bytes();           // its bytes

// What RLIMIT_AS (`ulimit -v`) still lets this process map: the limit less the address space
// in use; nothing without a limit.
std::optional<int64_t> address_space_room();

// Throws UsageError when `replicas_on_host` CPU replicas of this size cannot fit in
// `available_bytes`: "<sizes> too large for this machine: ... need about X GiB, and Y GiB of
// memory is available; lower ...". `sizes` names where the width and batch came from, e.g.
// "--batch-size and --width", or a checkpoint's width for eval.
void check_host_memory(int64_t width, int64_t shard_batch, int replicas_on_host,
                       const AvailableMemory& available, const std::string& sizes);
void check_host_memory(int64_t width, int64_t shard_batch, int replicas_on_host,
                       int64_t available_bytes,
                       const std::string& sizes = "--batch-size and --width");

}  // namespace dptrain
