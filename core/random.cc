#include "core/random.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"

namespace trainstep {

uint64_t SplitMix64::Below(uint64_t bound) {
  // Accept x only below the largest multiple of `bound` that fits in 2^64, so every residue
  // is equally likely. 2^64 mod bound == (2^64 - bound) mod bound, computed without overflow.
  const uint64_t excess = (0 - bound) % bound;
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - excess;  // accept x ≤ limit
  while (true) {
    const uint64_t x = Next();
    if (x <= limit) return x % bound;
  }
}

uint64_t DeriveSeed(uint64_t seed, uint64_t stream, uint64_t index) {
  // Chained finalizers: each input passes through a bijection before the next is mixed in.
  uint64_t h = SplitMix64::Mix(seed ^ 0x5472616e53746570ULL);  // "TranStep"
  h = SplitMix64::Mix(h ^ (stream * 0x9e3779b97f4a7c15ULL));
  h = SplitMix64::Mix(h ^ (index * 0xd1b54a32d192ed03ULL + 1));
  return h;
}

double Gaussian::Next() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double u1 = rng_.UniformOpenClosed();
  const double u2 = rng_.UniformOpenClosed();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = kTwoPi * u2;
  spare_ = r * std::sin(theta);
  has_spare_ = true;
  return r * std::cos(theta);
}

namespace {

// The first `steps` steps of Fisher–Yates over n items, from the back: step i (n-1 down to 1)
// swaps positions i and a uniform j ≤ i, after which position i holds its final value.
// Permutation and PermutationTail share it, so they cannot disagree on the order.
template <typename Swap>
void FisherYatesSteps(int64_t n, uint64_t seed, int64_t steps, Swap&& swap) {
  SplitMix64 rng(seed);
  for (int64_t i = n - 1; i > 0 && steps > 0; --i, --steps) {
    swap(i, static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1)));
  }
}

}  // namespace

std::vector<int64_t> Permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n > 0 ? n : 0));
  std::iota(order.begin(), order.end(), int64_t{0});
  FisherYatesSteps(n, seed, n, [&](int64_t i, int64_t j) {
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  });
  return order;
}

std::vector<int64_t> PermutationTail(int64_t n, uint64_t seed, int64_t count) {
  count = std::clamp<int64_t>(count, 0, std::max<int64_t>(n, 0));
  // Only the positions a step touched differ from the identity.
  absl::flat_hash_map<int64_t, int64_t> moved;
  auto value = [&](int64_t k) {
    auto it = moved.find(k);
    return it == moved.end() ? k : it->second;
  };
  FisherYatesSteps(n, seed, count, [&](int64_t i, int64_t j) {
    const int64_t vi = value(i), vj = value(j);
    moved[i] = vj;
    moved[j] = vi;
  });
  std::vector<int64_t> tail;
  tail.reserve(static_cast<size_t>(count));
  for (int64_t k = n - count; k < n; ++k) tail.push_back(value(k));
  return tail;
}

}  // namespace trainstep
