// Deterministic random numbers for data: the same bits on every machine, compiler and
// standard library. std::mt19937 is portable but std::*_distribution and std::shuffle are
// not (their algorithms are implementation-defined), so the few we need are written here.
// Everything is a pure function of its seed; no global state.
#ifndef TRAINSTEP_CORE_RANDOM_H_
#define TRAINSTEP_CORE_RANDOM_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace trainstep {

// SplitMix64 (Steele, Lea, Flood 2014; Vigna's reference code). Not thread-safe: one owner.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return Mix(state_);
  }

  // SplitMix64's output function: a bijective 64-bit finalizer.
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Uniform on [0, bound), without modulo bias (rejection). bound must be ≥ 1.
  uint64_t Below(uint64_t bound);

  // Uniform on (0, 1]: never 0, so log(u) is finite.
  double UniformOpenClosed() { return static_cast<double>((Next() >> 11) + 1) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// The seed of stream `stream`, item `index` under the job seed: distinct (stream, index) pairs
// give unrelated generators, so e.g. the epoch-3 shuffle does not depend on how many
// synthetic samples were drawn before it.
uint64_t DeriveSeed(uint64_t seed, uint64_t stream, uint64_t index);

// Streams of DeriveSeed. Never renumber: the numbers are part of every job's data order.
inline constexpr uint64_t kShuffleStream = 1;           // index: epoch
inline constexpr uint64_t kSyntheticWeightsStream = 2;  // index: 0
inline constexpr uint64_t kSyntheticSampleStream = 3;   // index: sample

// Standard normal numbers by the Box–Muller transform, two per pair of uniforms.
class Gaussian {
 public:
  explicit Gaussian(uint64_t seed) : rng_(seed) {}
  double Next();

 private:
  SplitMix64 rng_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// A permutation of 0..n-1 by Fisher–Yates driven by SplitMix64(seed).
std::vector<int64_t> Permutation(int64_t n, uint64_t seed);

// The last `count` entries of Permutation(n, seed), in order, in O(count) time and memory:
// Fisher–Yates runs from the back, so they are final after its first `count` steps. The
// coordinator names the samples a dropped tail leaves out without building the whole order.
std::vector<int64_t> PermutationTail(int64_t n, uint64_t seed, int64_t count);

}  // namespace trainstep

#endif  // TRAINSTEP_CORE_RANDOM_H_
