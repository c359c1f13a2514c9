// Our own random numbers: a small, fully specified generator (SplitMix64) for weight
// initialisation and data order, so that a seed means the same bits on every LibTorch version,
// compiler and device. Not for anything that needs cryptographic quality.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dptrain {

// SplitMix64 (Steele, Lea, Flood 2014): a 64-bit state, one add and three xor-shift-multiplies.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double next_unit();
  // Uniform in [0, bound), bound > 0, without modulo bias (rejection sampling).
  uint64_t next_below(uint64_t bound);

 private:
  uint64_t state_;
};

// A seed for the stream named by (seed, stream): distinct streams for, say, each epoch.
uint64_t derive_seed(uint64_t seed, uint64_t stream);

// Fills `out[0..count)` with Normal(mean, stddev) samples (Box-Muller in double precision).
void fill_normal(Rng& rng, float* out, size_t count, double mean, double stddev);

// A uniformly random permutation of 0..n-1 (Fisher-Yates).
std::vector<int64_t> random_permutation(int64_t n, Rng& rng);

}  // namespace dptrain
