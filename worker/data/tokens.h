// Token files (data.tokens): a flat array of little-endian token ids, nanoGPT's train.bin.
// The core is pure functions over the file's bytes (no I/O, fuzzable); TokenFile adds a
// read-only memory map, so a file larger than memory trains without being copied.
//
// Samples: sample i is the seq_len + 1 ids from id i·seq_len on, so consecutive samples
// share one id (the last input of one is the first of the next) and every pair of
// neighbouring ids in the file is a training target exactly once per epoch; a stride of
// seq_len + 1 would never train the pair across each boundary. nanoGPT draws random offsets
// instead, but here a window must be a pure function of (seed, epoch, window), so the
// offsets are fixed and shuffling permutes whole samples. The ids after the last whole
// sample (fewer than seq_len) are not trained.
#ifndef TRAINSTEP_WORKER_DATA_TOKENS_H_
#define TRAINSTEP_WORKER_DATA_TOKENS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "trainstep/v1/spec.pb.h"
#include "worker/data/dataset.h"

namespace trainstep::data {

struct TokenFileFormat {
  int width = 2;          // bytes per id: 2 (uint16) or 4 (uint32)
  int64_t seq_len = 128;  // a sample is seq_len + 1 ids (seq_len targets), stride seq_len
  int64_t vocab = 256;    // every id must be < vocab
  std::string vocab_source = "model.tiny_gpt.vocab_size";  // names the limit in messages
};

// The format a resolved spec with data.tokens asks for.
TokenFileFormat TokenFormatOf(const v1::JobSpec& resolved);

// What a valid token file holds.
struct TokenFileSummary {
  int64_t tokens = 0;
  int64_t samples = 0;  // (tokens - 1) / seq_len
  int64_t max_id = 0;
  uint64_t content_hash = 0;  // XXH64 (seed 0) of every byte
};

// Checks `bytes`, the whole content of the file `name` (for messages), in one pass: a size
// that is a whole number of ids, at least one sample, every id < vocab; and hashes it.
// Errors are INVALID_ARGUMENT and name the file, e.g.
//   "/d/train.bin: its size, 1001 bytes, is not a multiple of 2 (data.tokens.dtype uint16):
//    the file is truncated, or its ids are not uint16"
//   "/d/train.bin: its size, 20 bytes, is 10 tokens; one sample needs data.tokens.seq_len + 1
//    = 129"
//   "/d/train.bin: token 17 (byte offset 34) is 300, not a token id in 0..255
//    (model.tiny_gpt.vocab_size 256)"
absl::StatusOr<TokenFileSummary> ScanTokenBytes(std::string_view name, std::string_view bytes,
                                                const TokenFileFormat& format);

// Sample i of bytes that passed ScanTokenBytes with `format` (0 ≤ i < samples): the ids
// [i·seq_len, i·seq_len + seq_len + 1) as input_ids, and the same as labels.
Sample TokenSampleAt(std::string_view bytes, const TokenFileFormat& format, int64_t i);

// A token file mapped read-only for the object's lifetime, checked once when opened.
// Immutable and thread-safe.
class TokenFile {
 public:
  // Errors name the field or the file: NOT_FOUND "data.tokens.path: /x does not exist",
  // INVALID_ARGUMENT for a directory, and ScanTokenBytes' errors.
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path,
                                                         const TokenFileFormat& format);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t samples() const { return summary_.samples; }
  Sample At(int64_t i) const { return TokenSampleAt(bytes(), format_, i); }
  const TokenFileSummary& summary() const { return summary_; }
  // 16 hex digits over every byte of the file and the sample layout (width, seq_len).
  std::string Fingerprint() const;

 private:
  TokenFile(std::string path, TokenFileFormat format, const char* data, size_t size);
  std::string_view bytes() const { return std::string_view(data_, size_); }

  std::string path_;
  TokenFileFormat format_;
  const char* data_;  // the mapping; null when the file is empty
  size_t size_;
  TokenFileSummary summary_;
};

}  // namespace trainstep::data

#endif  // TRAINSTEP_WORKER_DATA_TOKENS_H_
