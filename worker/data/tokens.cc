#include "worker/data/tokens.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/xxh64.h"
#include "core/spec.h"

namespace trainstep::data {
namespace {

// Id k of little-endian ids `width` bytes wide, whatever the host's byte order.
inline uint32_t IdAt(const unsigned char* p, int width, int64_t k) {
  p += k * width;
  if (width == 2) return uint32_t{p[0]} | uint32_t{p[1]} << 8;
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// The largest of ids [from, to); a plain loop the compiler vectorizes.
uint32_t MaxId(const unsigned char* p, int width, int64_t from, int64_t to) {
  uint32_t m = 0;
  if (width == 2) {
    for (int64_t k = from; k < to; ++k) m = std::max(m, IdAt(p, 2, k));
  } else {
    for (int64_t k = from; k < to; ++k) m = std::max(m, IdAt(p, 4, k));
  }
  return m;
}

std::string DtypeName(int width) { return absl::StrCat("uint", 8 * width); }

}  // namespace

TokenFileFormat TokenFormatOf(const v1::JobSpec& resolved) {
  const v1::TokensData& tokens = resolved.data().tokens();
  TokenFileFormat f;
  f.width = tokens.dtype() == v1::TokensData::uint32 ? 4 : 2;
  f.seq_len = tokens.seq_len();
  f.vocab = ModelVocabSize(resolved);
  f.vocab_source = ModelVocabSource(resolved);
  return f;
}

absl::StatusOr<TokenFileSummary> ScanTokenBytes(std::string_view name, std::string_view bytes,
                                                const TokenFileFormat& format) {
  const absl::string_view file(name.data(), name.size());  // Debian's Abseil: its own type
  if ((format.width != 2 && format.width != 4) || format.seq_len < 1 || format.vocab < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": no such token layout: ", format.width, "-byte ids, seq_len ",
                     format.seq_len, ", vocabulary ", format.vocab, " (is the spec resolved?)"));
  }
  const size_t width = static_cast<size_t>(format.width);
  if (bytes.size() % width != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": its size, ", bytes.size(), " bytes, is not a multiple of ", width,
                     " (data.tokens.dtype ", DtypeName(format.width),
                     "): the file is truncated, or its ids are not ", DtypeName(format.width)));
  }
  TokenFileSummary s;
  s.tokens = static_cast<int64_t>(bytes.size() / width);
  if (s.tokens < format.seq_len + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": its size, ", bytes.size(), " bytes, is ", s.tokens,
                     " tokens; one sample needs data.tokens.seq_len + 1 = ", format.seq_len + 1));
  }
  s.samples = (s.tokens - 1) / format.seq_len;

  // One pass in blocks that stay in cache: the vocabulary check, then the hash.
  const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes.data());
  constexpr int64_t kBlockIds = 1 << 18;
  Xxh64 hash;
  uint32_t max_id = 0;
  for (int64_t from = 0; from < s.tokens; from += kBlockIds) {
    const int64_t to = std::min(s.tokens, from + kBlockIds);
    const uint32_t block_max = MaxId(p, format.width, from, to);
    if (block_max >= format.vocab) {
      for (int64_t k = from; k < to; ++k) {
        const uint32_t id = IdAt(p, format.width, k);
        if (id >= format.vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat(file, ": token ", k, " (byte offset ", k * format.width, ") is ", id,
                           ", not a token id in 0..", format.vocab - 1, " (", format.vocab_source,
                           " ", format.vocab, ")"));
        }
      }
    }
    max_id = std::max(max_id, block_max);
    hash.Update(
        bytes.substr(static_cast<size_t>(from) * width, static_cast<size_t>(to - from) * width));
  }
  s.max_id = max_id;
  s.content_hash = hash.Digest();
  return s;
}

Sample TokenSampleAt(std::string_view bytes, const TokenFileFormat& format, int64_t i) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes.data());
  Sample s;
  s.input_ids.resize(static_cast<size_t>(format.seq_len + 1));
  const int64_t first = i * format.seq_len;
  for (int64_t t = 0; t <= format.seq_len; ++t) {
    s.input_ids[static_cast<size_t>(t)] = static_cast<int32_t>(IdAt(p, format.width, first + t));
  }
  s.labels = s.input_ids;
  return s;
}

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path,
                                                           const TokenFileFormat& format) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat("data.tokens.path: ", path, " does not exist"));
    }
    return absl::Status(absl::ErrnoToStatusCode(e),
                        absl::StrCat("data.tokens.path: ", path, ": ", std::strerror(e)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return absl::Status(absl::ErrnoToStatusCode(e),
                        absl::StrCat("data.tokens.path: ", path, ": ", std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("data.tokens.path: ", path, " is ",
                                                   dir ? "a directory" : "not a regular file",
                                                   ", not a file of token ids"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const char* data = nullptr;
  if (size > 0) {  // mmap refuses an empty range; an empty file fails the scan below
    void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int e = errno;
      close(fd);
      return absl::Status(absl::ErrnoToStatusCode(e), absl::StrCat("data.tokens.path: cannot map ",
                                                                   path, ": ", std::strerror(e)));
    }
    data = static_cast<const char*>(m);
  }
  close(fd);  // the mapping stays valid
  std::unique_ptr<TokenFile> file(new TokenFile(path, format, data, size));
  absl::StatusOr<TokenFileSummary> summary = ScanTokenBytes(path, file->bytes(), format);
  if (!summary.ok()) return summary.status();
  file->summary_ = *summary;
  return file;
}

TokenFile::TokenFile(std::string path, TokenFileFormat format, const char* data, size_t size)
    : path_(std::move(path)), format_(std::move(format)), data_(data), size_(size) {}

TokenFile::~TokenFile() {
  if (data_ != nullptr) munmap(const_cast<char*>(data_), size_);
}

std::string TokenFile::Fingerprint() const {
  Xxh64 h(summary_.content_hash);
  const int64_t layout[] = {format_.width, format_.seq_len, static_cast<int64_t>(size_)};
  for (int64_t v : layout) {
    unsigned char b[8];
    for (int k = 0; k < 8; ++k)
      b[k] = static_cast<unsigned char>(static_cast<uint64_t>(v) >> 8 * k);
    h.Update(std::string_view(reinterpret_cast<const char*>(b), 8));
  }
  return absl::StrFormat("%016x", h.Digest());
}

}  // namespace trainstep::data
