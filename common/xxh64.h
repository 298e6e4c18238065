// XXH64 (xxHash, 64 bits; https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md):
// a non-cryptographic hash at memory speed, for fingerprinting large files (token datasets)
// and checkpoint files, where byte-wise FNV-1a costs 15× more (BENCHMARKS.md). Same values as
// `xxhsum -H1`.
#ifndef TRAINSTEP_COMMON_XXH64_H_
#define TRAINSTEP_COMMON_XXH64_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace trainstep {

// Streaming: Update() any number of times, then Digest(). Equal to Xxh64 of the
// concatenated input however it is split. Not thread-safe.
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void Update(std::string_view data);
  uint64_t Digest() const;

 private:
  uint64_t seed_;
  uint64_t acc_[4];
  unsigned char buffer_[32];  // input not yet consumed as a whole 32-byte stripe
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

inline uint64_t Xxh64Of(std::string_view data, uint64_t seed = 0) {
  Xxh64 h(seed);
  h.Update(data);
  return h.Digest();
}

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_XXH64_H_
