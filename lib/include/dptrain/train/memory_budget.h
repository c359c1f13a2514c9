// A cheap guard against absurd sizes: an estimate of what one replica needs for a given width
// and batch, checked against the host memory available before anything is allocated, so that
// --batch-size 10000000 is a clear usage error and not a crash deep in an allocator.
// Not here: the out-of-memory errors that still happen (train.cpp turns them into one line).
#pragma once

#include <cstdint>
#include <optional>

namespace dptrain {

// Bytes one replica of width `width` needs to train on `shard_batch` examples at once: weights,
// gradients, gradient buckets and saved activations of the book's ResNet-18 on 28x28 inputs,
// in float32. An estimate within a factor of two, used only to refuse impossible runs.
int64_t estimate_training_bytes(int64_t width, int64_t shard_batch);

// MemAvailable from /proc/meminfo, or nothing where it cannot be read.
std::optional<int64_t> available_host_bytes();

// Throws UsageError when `replicas_on_host` CPU replicas of this size cannot fit in
// `available_bytes`, naming --batch-size and --width and both amounts.
void check_host_memory(int64_t width, int64_t shard_batch, int replicas_on_host,
                       int64_t available_bytes);

}  // namespace dptrain
