// SplitMix64, Box-Muller normals and Fisher-Yates permutations; see random.h for why our own.
#include "dptrain/core/random.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

namespace dptrain {

uint64_t Rng::next_u64() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Rng::next_unit() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

uint64_t Rng::next_below(uint64_t bound) {
  if (bound == 0) throw std::invalid_argument("Rng::next_below: the bound must be positive");
  // Rejection sampling: draws below `threshold` = 2^64 mod bound would make the low residues
  // more likely, so they are drawn again (at most half the draws, usually almost none).
  const uint64_t threshold = (0 - bound) % bound;
  while (true) {
    const uint64_t draw = next_u64();
    if (draw >= threshold) return draw % bound;
  }
}

uint64_t derive_seed(uint64_t seed, uint64_t stream) {
  Rng mixer(seed ^ (stream * 0xd1b54a32d192ed03ULL));
  mixer.next_u64();
  return mixer.next_u64();
}

void fill_normal(Rng& rng, float* out, size_t count, double mean, double stddev) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (size_t i = 0; i < count; i += 2) {
    // 1 - u lies in (0, 1], so the logarithm is finite.
    const double radius = std::sqrt(-2.0 * std::log(1.0 - rng.next_unit()));
    const double angle = kTwoPi * rng.next_unit();
    out[i] = static_cast<float>(mean + stddev * radius * std::cos(angle));
    if (i + 1 < count) out[i + 1] = static_cast<float>(mean + stddev * radius * std::sin(angle));
  }
}

std::vector<int64_t> random_permutation(int64_t n, Rng& rng) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

}  // namespace dptrain
