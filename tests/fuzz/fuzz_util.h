// Shared by the fuzz targets: reading typed values from the fuzzer's bytes, and invariant
// checks that abort (libFuzzer and the replay driver both report an abort as a crash).
#ifndef TRAINSTEP_TESTS_FUZZ_FUZZ_UTIL_H_
#define TRAINSTEP_TESTS_FUZZ_FUZZ_UTIL_H_

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/message_lite.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

// Aborts with the condition, the place and a message when an invariant does not hold.
#define FUZZ_CHECK(cond, ...)                                                           \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      ::trainstep::fuzz::PrintDetail(__VA_ARGS__);                                      \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

namespace trainstep::fuzz {

inline void PrintDetail() {}
inline void PrintDetail(std::string_view detail) {
  std::fprintf(stderr, "  %.*s\n", static_cast<int>(detail.size()), detail.data());
}

// The fuzzer's bytes as a stream of values. Reading past the end yields zeros, so every input
// is a valid (if short) program; the fuzzer learns which bytes matter.
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  size_t remaining() const { return empty() ? 0 : size_ - pos_; }

  uint8_t Byte() { return empty() ? 0 : data_[pos_++]; }
  bool Bool() { return (Byte() & 1) != 0; }

  template <typename T>
  T Raw() {
    T value{};
    const size_t n = remaining() < sizeof(T) ? remaining() : sizeof(T);
    if (n > 0) std::memcpy(&value, data_ + pos_, n);
    pos_ += n;
    return value;
  }

  // Uniform enough in [lo, hi] (lo <= hi) for steering, from one or two bytes.
  int64_t Range(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
    const uint64_t r = span <= 256 ? Byte() : Raw<uint16_t>();
    return static_cast<int64_t>(static_cast<uint64_t>(lo) + (span == 0 ? r : r % span));
  }

  // A length (one byte, or two little-endian bytes if `wide`), then that many bytes (fewer at
  // the end of the input).
  std::string String(size_t max_len = 255, bool wide = false) {
    size_t n = wide ? Raw<uint16_t>() : Byte();
    if (n > max_len) n = max_len;
    if (n > remaining()) n = remaining();
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

  std::string Rest() {
    std::string s(reinterpret_cast<const char*>(data_ + pos_), remaining());
    pos_ = size_;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A message's bytes with map entries in a fixed order: equal messages give equal bytes (NaN
// included, unlike MessageDifferencer).
inline std::string DeterministicBytes(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializePartialToCodedStream(&coded);
  }
  return out;
}

}  // namespace trainstep::fuzz

#endif  // TRAINSTEP_TESTS_FUZZ_FUZZ_UTIL_H_
