// Which examples make up each global batch, and which part of it each replica takes.
// The order of an epoch depends on the seed and the epoch number alone; the split over replicas
// happens after, so the sequence of global batches never depends on the number of replicas.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace dptrain {

// The example indices of one epoch, in training order: a permutation of 0..num_examples-1 drawn
// from (seed, epoch) by our own generator (random.h).
std::vector<int64_t> epoch_order(int64_t num_examples, uint64_t seed, int64_t epoch);

// The number of global batches of an epoch; the last, smaller batch is kept.
int64_t num_batches(int64_t num_examples, int64_t batch_size);

// [begin, end) into the epoch order of global batch `index`.
std::pair<int64_t, int64_t> batch_range(int64_t num_examples, int64_t batch_size, int64_t index);

// A global batch of `global_size` examples split over `world_size` replicas as evenly as
// possible, like the book's split_batch: the first (global_size % world_size) shards get one
// example more. Returns [begin, end) of `rank`'s contiguous shard, relative to the batch.
std::pair<int64_t, int64_t> shard_range(int64_t global_size, int world_size, int rank);

}  // namespace dptrain
