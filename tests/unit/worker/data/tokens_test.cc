#include "worker/data/tokens.h"

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/temp_dir.h"
#include "worker/data/collate.h"
#include "worker/data/dataset.h"

namespace trainstep::data {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// `ids` as little-endian integers `width` bytes wide: the file nanoGPT's prepare.py writes
// with numpy (np.uint16 / np.uint32 .tofile()).
std::string Encode(const std::vector<uint32_t>& ids, int width) {
  std::string out;
  for (uint32_t id : ids) {
    for (int b = 0; b < width; ++b) out.push_back(static_cast<char>((id >> (8 * b)) & 0xff));
  }
  return out;
}

std::vector<uint32_t> Iota(uint32_t n, uint32_t first = 0) {
  std::vector<uint32_t> v(n);
  for (uint32_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

v1::JobSpec Spec(const std::string& path, const std::string& dtype, int seq_len,
                 const std::string& model = R"({"tiny_gpt":{"vocab_size":100000}})") {
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(
      absl::StrCat(R"({"model":)", model, R"(,"data":{"tokens":{"path":")", path, R"(","dtype":")",
                   dtype, R"(","seq_len":)", seq_len, "}}}"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

std::string ErrorOf(const v1::JobSpec& spec) {
  absl::StatusOr<Dataset> d = Dataset::Load(spec);
  return d.ok() ? "OK" : std::string(d.status().message());
}

// Catches: a stride of seq_len + 1 (the pair across each boundary never trained) or of 1,
// samples of seq_len ids instead of seq_len + 1, a wrong sample count, ids read big-endian
// (258 = bytes 02 01 would read as 513), or labels that differ from the inputs.
TEST(TokensDatasetTest, Uint16SamplesOverlapByOneToken) {
  TempDir dir;
  std::vector<uint32_t> ids = Iota(11);
  ids[4] = 258;
  ids[10] = 65535;  // the largest uint16, in the tail after the last whole sample
  const std::string f = dir.Write("train.bin", Encode(ids, 2));
  absl::StatusOr<Dataset> d = Dataset::Load(Spec(f, "uint16", 3));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->token_level());
  ASSERT_EQ(d->size(), 3);  // (11 - 1) / 3: ids 0..9 are in samples, id 10 is not
  EXPECT_THAT(d->at(0).input_ids, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(d->at(1).input_ids, ElementsAre(3, 258, 5, 6));
  EXPECT_THAT(d->at(2).input_ids, ElementsAre(6, 7, 8, 9));
  for (int64_t i = 0; i < d->size(); ++i) {
    EXPECT_EQ(d->at(i).labels, d->at(i).input_ids);
    EXPECT_EQ(ValidTokens(d->at(i)), 3);  // seq_len targets a sample
  }
  // One more id completes a fourth sample.
  ids.push_back(11);
  const std::string g = dir.Write("train12.bin", Encode(ids, 2));
  absl::StatusOr<Dataset> d12 = Dataset::Load(Spec(g, "uint16", 3));
  ASSERT_TRUE(d12.ok()) << d12.status();
  EXPECT_EQ(d12->size(), 3);  // 11 / 3
  ids.push_back(12);
  const std::string h = dir.Write("train13.bin", Encode(ids, 2));
  absl::StatusOr<Dataset> d13 = Dataset::Load(Spec(h, "uint16", 3));
  ASSERT_TRUE(d13.ok()) << d13.status();
  ASSERT_EQ(d13->size(), 4);  // 12 / 3
  EXPECT_THAT(d13->at(3).input_ids, ElementsAre(9, 65535, 11, 12));
}

// Catches uint32 ids truncated to 16 bits or read with the wrong width.
TEST(TokensDatasetTest, Uint32IdsBeyondSixteenBits) {
  TempDir dir;
  const std::vector<uint32_t> ids = {70000, 1, 99999, 65536, 2, 3, 4};
  const std::string f = dir.Write("train.bin", Encode(ids, 4));
  absl::StatusOr<Dataset> d = Dataset::Load(Spec(f, "uint32", 2));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 3);
  EXPECT_THAT(d->at(0).input_ids, ElementsAre(70000, 1, 99999));
  EXPECT_THAT(d->at(1).input_ids, ElementsAre(99999, 65536, 2));
  EXPECT_THAT(d->at(2).input_ids, ElementsAre(2, 3, 4));
}

// Catches a micro-batch built from the wrong samples, or a token file's samples padded.
TEST(TokensDatasetTest, CollatesWithoutPadding) {
  TempDir dir;
  const std::string f = dir.Write("train.bin", Encode(Iota(9, 100), 2));
  absl::StatusOr<Dataset> d = Dataset::Load(Spec(f, "uint16", 4));
  ASSERT_TRUE(d.ok()) << d.status();
  const MicroBatch mb = Collate(*d, {1, 0});
  EXPECT_EQ(mb.rows, 2);
  EXPECT_EQ(mb.length, 5);
  EXPECT_THAT(mb.input_ids, ElementsAre(104, 105, 106, 107, 108, 100, 101, 102, 103, 104));
  EXPECT_EQ(mb.labels, mb.input_ids);
  EXPECT_EQ(mb.valid_tokens, 8);
  EXPECT_EQ(ValidTokens(*d, {0, 1}), 8);
}

// Catches a truncated file read as if whole (its last id cut in half), an empty or too
// short file accepted (a dataset of no samples), and messages that do not name the file
// and its size.
TEST(TokensDatasetTest, TruncatedShortAndEmptyFilesNameTheFileAndSize) {
  TempDir dir;
  const std::string odd = dir.Write("odd.bin", Encode(Iota(10), 2) + "x");
  EXPECT_EQ(ErrorOf(Spec(odd, "uint16", 3)),
            absl::StrCat(odd,
                         ": its size, 21 bytes, is not a multiple of 2 (data.tokens.dtype "
                         "uint16): the file is truncated, or its ids are not uint16"));
  const std::string six = dir.Write("six.bin", std::string(6, '\0'));
  EXPECT_EQ(ErrorOf(Spec(six, "uint32", 1)),
            absl::StrCat(six,
                         ": its size, 6 bytes, is not a multiple of 4 (data.tokens.dtype "
                         "uint32): the file is truncated, or its ids are not uint32"));
  const std::string short_file = dir.Write("short.bin", Encode(Iota(4), 2));
  EXPECT_EQ(ErrorOf(Spec(short_file, "uint16", 4)),
            absl::StrCat(short_file,
                         ": its size, 8 bytes, is 4 tokens; one sample needs "
                         "data.tokens.seq_len + 1 = 5"));
  const std::string empty = dir.Write("empty.bin", "");
  EXPECT_EQ(ErrorOf(Spec(empty, "uint16", 1)),
            absl::StrCat(empty,
                         ": its size, 0 bytes, is 0 tokens; one sample needs "
                         "data.tokens.seq_len + 1 = 2"));
}

// Catches an id the model has no embedding row for (an index error deep inside the
// forward pass, or silent garbage on a GPU), a message without the offset to look at, and
// the check stopping after the first block (the bad id here is in the second).
TEST(TokensDatasetTest, IdOutsideTheVocabularyNamesFileAndOffset) {
  TempDir dir;
  std::vector<uint32_t> ids(300000, 7);
  ids[270001] = 300;
  ids[280000] = 999;  // later and larger: the first one is reported
  const std::string f = dir.Write("train.bin", Encode(ids, 2));
  EXPECT_EQ(ErrorOf(Spec(f, "uint16", 8, R"({"tiny_gpt":{}})")),
            absl::StrCat(f,
                         ": token 270001 (byte offset 540002) is 300, not a token id in 0..255 "
                         "(model.tiny_gpt.vocab_size 256)"));
  // The same ids fit a larger vocabulary; a TorchScript model's own vocabulary is the limit.
  EXPECT_EQ(ErrorOf(Spec(f, "uint16", 8, R"({"tiny_gpt":{"vocab_size":1000}})")), "OK");
  EXPECT_EQ(ErrorOf(Spec(f, "uint16", 8, R"({"torchscript":{"path":"/m.pt","vocab_size":500}})")),
            absl::StrCat(f,
                         ": token 280000 (byte offset 560000) is 999, not a token id in 0..499 "
                         "(the model /m.pt's vocab_size 500)"));
  // An id equal to the vocabulary size is one too many.
  EXPECT_EQ(ErrorOf(Spec(f, "uint16", 8, R"({"tiny_gpt":{"vocab_size":999}})")),
            absl::StrCat(f,
                         ": token 280000 (byte offset 560000) is 999, not a token id in 0..998 "
                         "(model.tiny_gpt.vocab_size 999)"));
}

// Catches a missing file or a directory reported without the field, or crashing the mapper.
TEST(TokensDatasetTest, MissingFileAndDirectory) {
  TempDir dir;
  absl::StatusOr<Dataset> missing = Dataset::Load(Spec(dir.path() + "/nope.bin", "uint16", 4));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            absl::StrCat("data.tokens.path: ", dir.path(), "/nope.bin does not exist"));
  absl::StatusOr<Dataset> directory = Dataset::Load(Spec(dir.path(), "uint16", 4));
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(directory.status().message(), absl::StrCat("data.tokens.path: ", dir.path(),
                                                       " is a directory, not a file of token ids"));
}

// Catches a fingerprint that misses part of the file (here the tail after the last sample,
// and a byte in the middle) or the layout, so workers that read different data would be
// accepted together.
TEST(TokensDatasetTest, FingerprintCoversEveryByteAndTheLayout) {
  TempDir dir;
  std::vector<uint32_t> ids = Iota(1000);
  const std::string a = dir.Write("a.bin", Encode(ids, 2));
  const std::string a_copy = dir.Write("a_copy.bin", Encode(ids, 2));
  ids[999] = 5;  // the tail: not in any sample of seq_len 7
  const std::string tail = dir.Write("tail.bin", Encode(ids, 2));
  ids[999] = 999;
  ids[500] = 1;
  const std::string middle = dir.Write("middle.bin", Encode(ids, 2));
  auto fp = [](const v1::JobSpec& spec) {
    absl::StatusOr<Dataset> d = Dataset::Load(spec);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? d->fingerprint() : "";
  };
  const std::string base = fp(Spec(a, "uint16", 7));
  EXPECT_EQ(base.size(), 16u);
  EXPECT_EQ(fp(Spec(a_copy, "uint16", 7)), base);  // the content, not the path
  EXPECT_NE(fp(Spec(tail, "uint16", 7)), base);
  EXPECT_NE(fp(Spec(middle, "uint16", 7)), base);
  EXPECT_NE(fp(Spec(a, "uint16", 8)), base);
}

// The pure core (what the fuzzers drive): the same answers on bytes in memory, and no
// layout that would divide by zero or read out of bounds is accepted.
TEST(TokensScanTest, PureFunctionOverBytes) {
  TokenFileFormat f;
  f.width = 2;
  f.seq_len = 2;
  f.vocab = 1000;
  const std::string bytes = Encode({1, 2, 3, 4, 999}, 2);
  absl::StatusOr<TokenFileSummary> s = ScanTokenBytes("mem", bytes, f);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->tokens, 5);
  EXPECT_EQ(s->samples, 2);
  EXPECT_EQ(s->max_id, 999);
  EXPECT_THAT(TokenSampleAt(bytes, f, 1).input_ids, ElementsAre(3, 4, 999));

  for (const auto& [width, seq_len, vocab] : std::vector<std::tuple<int, int64_t, int64_t>>{
           {3, 2, 10}, {2, 0, 10}, {4, -1, 10}, {2, 2, 0}}) {
    TokenFileFormat bad;
    bad.width = width;
    bad.seq_len = seq_len;
    bad.vocab = vocab;
    EXPECT_FALSE(ScanTokenBytes("mem", bytes, bad).ok()) << width << " " << seq_len;
  }
}

}  // namespace
}  // namespace trainstep::data
