// Epoch orders, global batches and replica shards; see batching.h.
#include "dptrain/data/batching.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/random.h"

namespace dptrain {

std::vector<int64_t> epoch_order(int64_t num_examples, uint64_t seed, int64_t epoch) {
  if (num_examples < 0) throw std::invalid_argument("epoch_order: negative number of examples");
  Rng rng(derive_seed(seed, static_cast<uint64_t>(epoch)));
  return random_permutation(num_examples, rng);
}

int64_t num_batches(int64_t num_examples, int64_t batch_size) {
  if (batch_size <= 0) throw std::invalid_argument("num_batches: batch size must be positive");
  return (num_examples + batch_size - 1) / batch_size;
}

std::pair<int64_t, int64_t> batch_range(int64_t num_examples, int64_t batch_size, int64_t index) {
  if (index < 0 || index >= num_batches(num_examples, batch_size)) {
    throw std::out_of_range("batch_range: batch " + std::to_string(index) + " does not exist");
  }
  const int64_t begin = index * batch_size;
  return {begin, std::min(begin + batch_size, num_examples)};
}

std::pair<int64_t, int64_t> shard_range(int64_t global_size, int world_size, int rank) {
  if (world_size <= 0 || rank < 0 || rank >= world_size || global_size < 0) {
    throw std::invalid_argument("shard_range: rank " + std::to_string(rank) +
                                " outside a world of " + std::to_string(world_size));
  }
  const int64_t base = global_size / world_size;
  const int64_t extra = global_size % world_size;  // the first `extra` shards get one more
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  const int64_t size = base + (rank < extra ? 1 : 0);
  return {begin, begin + size};
}

}  // namespace dptrain
