#include "worker/data/dataset.h"

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/random.h"
#include "core/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/temp_dir.h"
#include "worker/data/collate.h"

namespace trainstep::data {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

v1::JobSpec Resolve(const std::string& json) {
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(json);
  EXPECT_TRUE(spec.ok()) << spec.status() << "\n" << json;
  return spec.ok() ? *spec : v1::JobSpec();
}

std::string Quoted(const std::string& s) { return absl::StrCat("\"", s, "\""); }

v1::JobSpec TextSpec(const std::vector<std::string>& paths, int seq_len) {
  std::vector<std::string> quoted;
  for (const std::string& p : paths) quoted.push_back(Quoted(p));
  return Resolve(absl::StrCat(R"({"model":{"tiny_gpt":{}},"data":{"text":{"paths":[)",
                              absl::StrJoin(quoted, ","), R"(],"seq_len":)", seq_len, "}}}"));
}

// `model` is the JSON of the model member, e.g. {"tiny_gpt":{"seq_len":8}}.
v1::JobSpec JsonlSpec(const std::string& path,
                      const std::string& model = R"({"tiny_gpt":{"seq_len":8}})") {
  return Resolve(
      absl::StrCat(R"({"model":)", model, R"(,"data":{"jsonl":{"path":)", Quoted(path), "}}}"));
}

v1::JobSpec SyntheticSpec(int64_t samples, int in_features, int out_features, uint64_t seed) {
  return Resolve(absl::StrCat(R"({"seed":")", seed, R"(","model":{"mlp":{"out_features":)",
                              out_features, R"(}},"data":{"synthetic_regression":{"samples":)",
                              samples, R"(,"in_features":)", in_features, "}}}"));
}

Sample Tokens(std::vector<int32_t> ids, std::vector<int32_t> labels) {
  Sample s;
  s.input_ids = std::move(ids);
  s.labels = std::move(labels);
  return s;
}

// The byte stream a text dataset holds, samples joined in order.
std::string Joined(const Dataset& d) {
  std::string out;
  for (int64_t i = 0; i < d.size(); ++i) {
    for (int32_t t : d.at(i).input_ids) out.push_back(static_cast<char>(t));
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Random numbers

// Catches a wrong constant or shift in SplitMix64 (Vigna's reference outputs).
TEST(RandomTest, SplitMix64MatchesReferenceOutputs) {
  SplitMix64 zero(0);
  EXPECT_EQ(zero.Next(), 0xe220a8397b1dcdafULL);
  SplitMix64 rng(1234567);
  EXPECT_EQ(rng.Next(), 6457827717110365317ULL);
  EXPECT_EQ(rng.Next(), 3203168211198807973ULL);
  EXPECT_EQ(rng.Next(), 9817491932198370423ULL);
  EXPECT_EQ(rng.Next(), 4593380528125082431ULL);
  EXPECT_EQ(rng.Next(), 16408922859458223821ULL);
}

// Catches an off-by-one in Below (bound never drawn, or out of range).
TEST(RandomTest, BelowCoversEveryValueInRange) {
  SplitMix64 rng(7);
  std::vector<int> seen(5, 0);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = rng.Below(5);
    ASSERT_LT(x, 5u);
    ++seen[x];
  }
  for (int count : seen) EXPECT_GT(count, 150);
  EXPECT_EQ(rng.Below(1), 0u);
}

// Catches a broken Box–Muller (missing -2, sqrt, or 2π): the moments of N(0, 1).
TEST(RandomTest, GaussianHasUnitMoments) {
  Gaussian g(3);
  double sum = 0, sum_sq = 0, sum_4 = 0;
  constexpr int kN = 200000;
  for (int i = 0; i < kN; ++i) {
    const double x = g.Next();
    sum += x;
    sum_sq += x * x;
    sum_4 += x * x * x * x;
  }
  EXPECT_NEAR(sum / kN, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / kN, 1.0, 0.02);
  EXPECT_NEAR(sum_4 / kN, 3.0, 0.1);  // kurtosis of a normal, not of a uniform (1.8)
}

// Catches seeds that collide across streams or indices (e.g. epoch 1 of stream A == epoch 0
// of stream B).
TEST(RandomTest, DerivedSeedsAreDistinct) {
  EXPECT_NE(DeriveSeed(1, kShuffleStream, 0), DeriveSeed(1, kShuffleStream, 1));
  EXPECT_NE(DeriveSeed(1, kShuffleStream, 0), DeriveSeed(2, kShuffleStream, 0));
  EXPECT_NE(DeriveSeed(1, kShuffleStream, 1), DeriveSeed(1, kSyntheticWeightsStream, 0));
  EXPECT_NE(DeriveSeed(0, kShuffleStream, 1), DeriveSeed(1, kShuffleStream, 0));
}

// ---------------------------------------------------------------------------------------
// ValidTokens

// Catches counting labels[0] (no position predicts it), counting -100, or counting padding.
// Catches: the coordinator naming other dropped samples than the workers' order holds (the
// sparse tail diverging from the full Fisher–Yates).
TEST(RandomTest, PermutationTailEqualsTheEndOfPermutation) {
  for (int64_t n : {0, 1, 2, 7, 100, 1001}) {
    for (uint64_t seed : {0ull, 1ull, 0xdeadbeefull}) {
      const std::vector<int64_t> full = Permutation(n, seed);
      for (int64_t count : {int64_t{0}, int64_t{1}, n / 3, n - 1, n, n + 5}) {
        const int64_t c = std::clamp<int64_t>(count, 0, n);
        EXPECT_EQ(PermutationTail(n, seed, count), std::vector<int64_t>(full.end() - c, full.end()))
            << "n " << n << " seed " << seed << " count " << count;
      }
    }
  }
}

TEST(ValidTokensTest, CountsShiftedUnmaskedLabels) {
  EXPECT_EQ(ValidTokens(Tokens({1, 2, 3, 4}, {1, 2, 3, 4})), 3);  // the shift drops labels[0]
  EXPECT_EQ(ValidTokens(Tokens({1, 2, 3, 4}, {1, -100, 3, -100})), 1);
  EXPECT_EQ(ValidTokens(Tokens({1, 2, 3}, {-100, 2, 3})), 2);  // a masked labels[0] costs none
  EXPECT_EQ(ValidTokens(Tokens({7}, {7})), 0);                 // one token: nothing to predict
  EXPECT_EQ(ValidTokens(Tokens({1, 2, 3}, {-100, -100, -100})), 0);  // fully masked
  EXPECT_EQ(ValidTokens(Sample{}), 0);
}

// ---------------------------------------------------------------------------------------
// text

// Catches OS directory order leaking into the data (files must be read sorted by full path,
// recursively) and a file listed twice being read twice.
TEST(TextDatasetTest, ReadsDirectoryTreeSortedByPath) {
  TempDir dir;
  dir.Write("corpus/b/z.txt", "56");
  dir.Write("corpus/a.txt", "12");
  dir.Write("corpus/b/a.txt", "34");
  dir.Write("corpus/c/d/e.txt", "78");
  const std::string single = dir.Write("extra.txt", "90");
  fs::create_directories(fs::path(dir.path()) / "corpus/empty_dir");

  absl::StatusOr<Dataset> d =
      Dataset::Load(TextSpec({single, dir.path() + "/corpus", dir.path() + "/corpus/b/a.txt"}, 4));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->token_level());
  EXPECT_EQ(Joined(*d), "1234567890");  // corpus/a, corpus/b/a, corpus/b/z, corpus/c/d/e, extra
}

// Catches a wrong cut: samples of seq_len, a partial last sample kept with ≥ 2 tokens and
// dropped with 1, labels equal to input_ids.
TEST(TextDatasetTest, CutsStreamIntoSamplesWithPartialLast) {
  TempDir dir;
  const std::string ten = dir.Write("ten.txt", "abcdefghij");
  absl::StatusOr<Dataset> d = Dataset::Load(TextSpec({ten}, 4));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 3);
  EXPECT_THAT(d->at(0).input_ids, ElementsAre('a', 'b', 'c', 'd'));
  EXPECT_THAT(d->at(1).input_ids, ElementsAre('e', 'f', 'g', 'h'));
  EXPECT_THAT(d->at(2).input_ids, ElementsAre('i', 'j'));
  for (int64_t i = 0; i < d->size(); ++i) EXPECT_EQ(d->at(i).labels, d->at(i).input_ids);

  const std::string nine = dir.Write("nine.txt", "abcdefghi");
  absl::StatusOr<Dataset> d9 = Dataset::Load(TextSpec({nine}, 4));
  ASSERT_TRUE(d9.ok()) << d9.status();
  EXPECT_EQ(d9->size(), 2);  // "i" alone has no target
}

// Catches bytes ≥ 128 read as negative tokens (signed char).
TEST(TextDatasetTest, BytesAreUnsignedTokens) {
  TempDir dir;
  const std::string f = dir.Write("bin", std::string("\x00\x7f\x80\xff", 4));
  absl::StatusOr<Dataset> d = Dataset::Load(TextSpec({f}, 8));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->at(0).input_ids, ElementsAre(0, 127, 128, 255));
}

// Catches bytes beyond a small TorchScript vocabulary reaching the embedding (out of range).
TEST(TextDatasetTest, BytesOutsideTorchScriptVocabularyAreNamed) {
  TempDir dir;
  const std::string f = dir.Write("t.txt", "ab\x7f");
  const v1::JobSpec spec = Resolve(absl::StrCat(
      R"({"model":{"torchscript":{"path":"/m.pt","vocab_size":100}},"data":{"text":{"paths":[)",
      Quoted(f), "]}}}"));
  absl::StatusOr<Dataset> d = Dataset::Load(spec);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.status().message(),
            absl::StrCat(f,
                         ": byte 2 is 127, not a token id in 0..99 "
                         "(the model /m.pt's vocab_size); text data needs a vocabulary of 256"));
}

// Catches a missing path silently skipped instead of named.
TEST(TextDatasetTest, MissingPathIsNotFoundWithIndex) {
  TempDir dir;
  const std::string ok = dir.Write("a.txt", "hello");
  const std::string missing = dir.path() + "/x/y";
  absl::StatusOr<Dataset> d = Dataset::Load(TextSpec({ok, missing}, 4));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(d.status().message(), absl::StrCat("data.text.paths[1]: ", missing, " does not exist"));
}

// Catches an empty corpus producing an empty dataset that fails later, far from the cause.
TEST(TextDatasetTest, NoBytesIsInvalidArgument) {
  TempDir dir;
  dir.Write("d/empty.txt", "");
  absl::StatusOr<Dataset> d = Dataset::Load(TextSpec({dir.path() + "/d"}, 4));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("data.text.paths"));
}

// Catches a data directory inside --allowed-roots smuggling in a file outside through a
// symlink (the directory itself passes the spec check; each file it holds must too).
TEST(TextDatasetTest, SymlinkInADataDirectoryToOutsideTheRootsIsRefused) {
  TempDir dir;
  dir.Write("root/d/a.txt", "abcdefgh");
  dir.Write("outside/shadow", "secret!!");
  absl::StatusOr<AllowedRoots> roots = AllowedRoots::Parse(dir.path() + "/root");
  ASSERT_TRUE(roots.ok()) << roots.status();
  ASSERT_TRUE(Dataset::Load(TextSpec({dir.path() + "/root/d"}, 4), *roots).ok());
  std::filesystem::create_symlink(dir.path() + "/outside/shadow", dir.path() + "/root/d/b.txt");
  absl::StatusOr<Dataset> d = Dataset::Load(TextSpec({dir.path() + "/root/d"}, 4), *roots);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(d.status().message(),
              HasSubstr(absl::StrCat("data.text.paths[0]: ", dir.path(), "/root/d/b.txt")));
  EXPECT_TRUE(Dataset::Load(TextSpec({dir.path() + "/root/d"}, 4)).ok());  // no roots: any
}

// Catches nondeterministic loading: two loads of the same files are equal, sample by sample.
TEST(TextDatasetTest, TwoLoadsAreIdentical) {
  TempDir dir;
  for (int i = 0; i < 20; ++i)
    dir.Write(absl::StrCat("t/", i % 3, "/f", i), std::string(i + 1, 'a' + i));
  const v1::JobSpec spec = TextSpec({dir.path() + "/t"}, 7);
  absl::StatusOr<Dataset> a = Dataset::Load(spec);
  absl::StatusOr<Dataset> b = Dataset::Load(spec);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  for (int64_t i = 0; i < a->size(); ++i) EXPECT_EQ(a->at(i).input_ids, b->at(i).input_ids);
  EXPECT_EQ(a->fingerprint(), b->fingerprint());
}

// ---------------------------------------------------------------------------------------
// jsonl

// Catches blank lines, CRLF, extra keys or a missing labels key rejected or misread.
TEST(JsonlDatasetTest, ParsesSamples) {
  TempDir dir;
  const std::string f =
      dir.Write("train.jsonl",
                "{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3], \"source\": \"wiki\"}\r\n"
                "\n"
                "   \n"
                "{\"input_ids\": [4, 5]}\n"
                "{\"labels\": [255], \"input_ids\": [255]}");  // no final newline
  absl::StatusOr<Dataset> d = Dataset::Load(JsonlSpec(f));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 3);
  EXPECT_TRUE(d->token_level());
  EXPECT_THAT(d->at(0).input_ids, ElementsAre(1, 2, 3));
  EXPECT_THAT(d->at(0).labels, ElementsAre(-100, 2, 3));
  EXPECT_THAT(d->at(1).labels, ElementsAre(4, 5));  // labels default to input_ids
  EXPECT_THAT(d->at(2).input_ids, ElementsAre(255));
}

// Catches the vocabulary of a TorchScript model ignored (tiny_gpt's 256 used) and a context
// limit invented for it.
TEST(JsonlDatasetTest, TorchScriptVocabularyAndNoLengthLimit) {
  TempDir dir;
  std::vector<std::string> ids(300, "999");
  const std::string f =
      dir.Write("t.jsonl", absl::StrCat("{\"input_ids\": [", absl::StrJoin(ids, ","), "]}\n"));
  const std::string model = R"({"torchscript":{"path":"/m.pt","vocab_size":1000}})";
  absl::StatusOr<Dataset> d = Dataset::Load(JsonlSpec(f, model));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->at(0).input_ids.size(), 300u);

  const std::string bad = dir.Write("bad.jsonl", "{\"input_ids\": [1000]}\n");
  EXPECT_EQ(Dataset::Load(JsonlSpec(bad, model)).status().message(),
            absl::StrCat(bad,
                         ":1: input_ids[0] is 1000, not a token id in 0..999 "
                         "(the model /m.pt's vocab_size)"));
}

// Catches the ids of a TorchScript model's data checked against a guess (256 by default)
// when its vocabulary was not recorded from the loaded model (RecordModelVocabulary).
TEST(JsonlDatasetTest, TorchScriptVocabularyUnknownIsRefused) {
  TempDir dir;
  const std::string f = dir.Write("t.jsonl", "{\"input_ids\": [1, 2]}\n");
  absl::StatusOr<Dataset> d = Dataset::Load(JsonlSpec(f, R"({"torchscript":{"path":"/m.pt"}})"));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.status().message(),
            "model.torchscript.vocab_size is unset: the data's ids are checked against the "
            "model's vocabulary, so load the model /m.pt first");
}

// Catches model.tiny_gpt.vocab_size ignored by the data check (bytes assumed), so a larger
// vocabulary could not train, or a smaller one let ids through that the model has no row for.
TEST(JsonlDatasetTest, TinyGptVocabularyIsTheLimit) {
  TempDir dir;
  const std::string f = dir.Write("t.jsonl", "{\"input_ids\": [999, 3]}\n");
  absl::StatusOr<Dataset> d = Dataset::Load(JsonlSpec(f, R"({"tiny_gpt":{"vocab_size":1000}})"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->at(0).input_ids, ElementsAre(999, 3));
  EXPECT_EQ(Dataset::Load(JsonlSpec(f, R"({"tiny_gpt":{"vocab_size":999}})")).status().message(),
            absl::StrCat(f,
                         ":1: input_ids[0] is 999, not a token id in 0..998 "
                         "(model.tiny_gpt.vocab_size)"));
}

// Catches a JSONL error that does not name the file and line, or a bad sample accepted
// (each case puts the bad sample on line 3, after a good line and a blank one).
TEST(JsonlDatasetTest, EveryErrorNamesFileAndLine) {
  struct Case {
    std::string line;
    std::string message;  // after "<file>:3: "
  };
  const std::vector<Case> cases = {
      {R"({"input_ids": [1, 2)", "not valid JSON: "},
      {R"([1, 2, 3])", R"(expected a JSON object {"input_ids": [...], "labels": [...]})"},
      {R"({"labels": [1, 2]})", "input_ids is missing"},
      {R"({"input_ids": "abc"})", R"(input_ids must be a list of token ids, got the string "abc")"},
      {R"({"input_ids": [1, 4.5]})", "input_ids[1] must be an integer, got 4.5"},
      {R"({"input_ids": [1, "2"]})", R"(input_ids[1] must be an integer, got the string "2")"},
      {R"({"input_ids": [1, null]})", "input_ids[1] must be an integer, got null"},
      {R"({"input_ids": [1, 256]})",
       "input_ids[1] is 256, not a token id in 0..255 (model.tiny_gpt.vocab_size)"},
      {R"({"input_ids": [-1, 2]})",
       "input_ids[0] is -1, not a token id in 0..255 (model.tiny_gpt.vocab_size)"},
      {R"({"input_ids": [-100, 2]})",
       "input_ids[0] is -100, not a token id in 0..255 (model.tiny_gpt.vocab_size)"},
      {R"({"input_ids": [1, 2], "labels": [1, -5]})",
       "labels[1] is -5: must be -100 (not trained) or a token id in 0..255 "
       "(model.tiny_gpt.vocab_size)"},
      {R"({"input_ids": [1, 2], "labels": [256, 2]})",
       "labels[0] is 256: must be -100 (not trained) or a token id in 0..255 "
       "(model.tiny_gpt.vocab_size)"},
      {R"({"input_ids": [1, 2], "labels": [1, 2.5]})", "labels[1] must be an integer, got 2.5"},
      {R"({"input_ids": [1, 2], "labels": 3})", "labels must be a list of token ids, got 3"},
      {R"({"input_ids": [1, 2, 3], "labels": [1, 2]})", "labels has 2 entries, input_ids 3"},
      {R"({"input_ids": []})", "input_ids is empty: a sample needs at least one token"},
      {R"({"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9]})",
       "input_ids has 9 tokens, more than model.tiny_gpt.seq_len 8"},
  };
  TempDir dir;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string f = dir.Write(
        absl::StrCat("c", i, ".jsonl"),
        absl::StrCat("{\"input_ids\": [1, 2]}\n\n", cases[i].line, "\n{\"input_ids\": [3]}\n"));
    absl::StatusOr<Dataset> d = Dataset::Load(JsonlSpec(f));
    ASSERT_FALSE(d.ok()) << cases[i].line;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << cases[i].line;
    const std::string prefix = absl::StrCat(f, ":3: ", cases[i].message);
    if (cases[i].message == "not valid JSON: ") {
      EXPECT_THAT(d.status().message(), HasSubstr(prefix)) << cases[i].line;
      EXPECT_GT(d.status().message().size(), prefix.size());  // the parser's reason follows
    } else {
      EXPECT_EQ(d.status().message(), prefix) << cases[i].line;
    }
  }
}

// Catches a missing or empty JSONL file turning into an empty dataset.
TEST(JsonlDatasetTest, MissingAndEmptyFiles) {
  TempDir dir;
  const std::string missing = dir.path() + "/nope.jsonl";
  absl::StatusOr<Dataset> d = Dataset::Load(JsonlSpec(missing));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(d.status().message(), absl::StrCat("data.jsonl.path: ", missing, " does not exist"));

  const std::string blank = dir.Write("blank.jsonl", "\n  \n");
  d = Dataset::Load(JsonlSpec(blank));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("holds no samples"));
}

// ---------------------------------------------------------------------------------------
// synthetic_regression

// Catches a platform-dependent generator (std::normal_distribution) or a changed stream:
// the first numbers are pinned.
TEST(SyntheticDatasetTest, GoldenValues) {
  absl::StatusOr<Dataset> d = Dataset::Load(SyntheticSpec(4, 3, 2, 42));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->token_level());
  ASSERT_EQ(d->size(), 4);
  const Sample& s = d->at(0);
  ASSERT_EQ(s.features.size(), 3u);
  ASSERT_EQ(s.targets.size(), 2u);
  EXPECT_TRUE(s.input_ids.empty());
  // Recorded on x86-64 glibc and checked against an independent Python re-implementation
  // (SplitMix64 → DeriveSeed → Box–Muller). Tolerances cover libm's last-ulp differences.
  EXPECT_THAT(s.features, ElementsAre(::testing::FloatNear(0.260399878f, 1e-6),
                                      ::testing::FloatNear(-1.40167511f, 1e-6),
                                      ::testing::FloatNear(1.41562319f, 1e-6)));
  EXPECT_THAT(s.targets, ElementsAre(::testing::FloatNear(-1.61952364f, 1e-6),
                                     ::testing::FloatNear(-0.111252815f, 1e-6)));
  // Exact bits: where libm rounds sin/log differently the data differs, and the coordinator
  // would (rightly) refuse to mix such workers. This line says so first.
  EXPECT_EQ(d->fingerprint(), "4ed5fefd18fbb63f");
}

// Catches a wrong target formula: with one feature, (y - 0.1·sin x) / x is the same w for
// every sample.
TEST(SyntheticDatasetTest, TargetsAreLinearPlusSine) {
  absl::StatusOr<Dataset> d = Dataset::Load(SyntheticSpec(50, 1, 1, 5));
  ASSERT_TRUE(d.ok()) << d.status();
  const auto w_of = [&](int64_t i) {
    const double x = d->at(i).features[0];
    return (d->at(i).targets[0] - 0.1 * std::sin(x)) / x;
  };
  const double w = w_of(0);
  for (int64_t i = 1; i < d->size(); ++i) {
    if (std::fabs(d->at(i).features[0]) > 0.05) {
      EXPECT_NEAR(w_of(i), w, 1e-4) << i;
    }
  }
}

// Catches sample i depending on the sample count, or the seed being ignored.
TEST(SyntheticDatasetTest, SamplesDependOnSeedNotOnCount) {
  absl::StatusOr<Dataset> small = Dataset::Load(SyntheticSpec(3, 4, 1, 9));
  absl::StatusOr<Dataset> large = Dataset::Load(SyntheticSpec(100, 4, 1, 9));
  absl::StatusOr<Dataset> other = Dataset::Load(SyntheticSpec(3, 4, 1, 10));
  ASSERT_TRUE(small.ok() && large.ok() && other.ok());
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(small->at(i).features, large->at(i).features);
    EXPECT_EQ(small->at(i).targets, large->at(i).targets);
  }
  EXPECT_NE(small->at(0).features, other->at(0).features);
  EXPECT_NE(small->fingerprint(), other->fingerprint());
}

// Catches features that are not ~N(0, 1) or targets of the wrong scale (W not 1/in).
TEST(SyntheticDatasetTest, Moments) {
  absl::StatusOr<Dataset> d = Dataset::Load(SyntheticSpec(5000, 16, 1, 1));
  ASSERT_TRUE(d.ok()) << d.status();
  double sum = 0, sum_sq = 0, y_sq = 0;
  for (int64_t i = 0; i < d->size(); ++i) {
    for (float x : d->at(i).features) {
      sum += x;
      sum_sq += x * x;
    }
    y_sq += d->at(i).targets[0] * d->at(i).targets[0];
  }
  const double n = 5000.0 * 16;
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.03);
  EXPECT_GT(y_sq / 5000, 0.2);  // Σ_j W_j² ~ 1 (give or take a chi-square), not ~16 or ~1/16
  EXPECT_LT(y_sq / 5000, 3.0);
}

// ---------------------------------------------------------------------------------------
// Fingerprint

// Catches a changed fingerprint format (workers of two builds would refuse each other): FNV-1a
// 64 over little-endian u64 counts and u32 values, checked against a Python re-implementation.
TEST(FingerprintTest, GoldenValue) {
  EXPECT_EQ(Dataset::FromSamples({Tokens({1, 2, 3}, {-100, 2, 3})}).fingerprint(),
            "c8676dcc93fcde72");
}

// Catches a fingerprint blind to a token change, or to where samples start and end.
TEST(FingerprintTest, ChangesWithContentAndBoundaries) {
  TempDir dir;
  const std::string a = dir.Write("a.jsonl", "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [4]}\n");
  const std::string a2 =
      dir.Write("a2.jsonl", "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [4]}\n");
  const std::string b = dir.Write("b.jsonl", "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [5]}\n");
  const std::string c = dir.Write("c.jsonl", "{\"input_ids\": [1, 2]}\n{\"input_ids\": [3, 4]}\n");
  const std::string l = dir.Write(
      "l.jsonl", "{\"input_ids\": [1, 2, 3], \"labels\": [1, -100, 3]}\n{\"input_ids\": [4]}\n");
  std::vector<std::string> fps;
  for (const std::string& f : {a, a2, b, c, l}) {
    absl::StatusOr<Dataset> d = Dataset::Load(JsonlSpec(f));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->fingerprint().size(), 16u);
    EXPECT_EQ(d->fingerprint().find_first_not_of("0123456789abcdef"), std::string::npos);
    fps.push_back(d->fingerprint());
  }
  EXPECT_EQ(fps[0], fps[1]);  // same data, different file name
  EXPECT_NE(fps[0], fps[2]);  // one token changed
  EXPECT_NE(fps[0], fps[3]);  // same tokens, other sample boundaries
  EXPECT_NE(fps[0], fps[4]);  // one label masked
}

// ---------------------------------------------------------------------------------------
// Collate

// Catches left padding, padding with a trainable label, a global (not per-micro-batch)
// length, and padding counted as valid tokens.
TEST(CollateTest, PadsRightToLongestInMicroBatch) {
  const Dataset d = Dataset::FromSamples({Tokens({1, 2, 3}, {1, 2, 3}), Tokens({4, 5}, {-100, 5}),
                                          Tokens({6, 7, 8, 9, 10, 11}, {6, 7, 8, 9, 10, 11})});
  const MicroBatch mb = Collate(d, {1, 0});
  EXPECT_EQ(mb.rows, 2);
  EXPECT_EQ(mb.samples, 2);
  EXPECT_EQ(mb.length, 3);  // not 6: sample 2 is not in this micro-batch
  EXPECT_THAT(mb.input_ids, ElementsAre(4, 5, 0, 1, 2, 3));
  EXPECT_THAT(mb.labels, ElementsAre(-100, 5, -100, 1, 2, 3));
  EXPECT_EQ(mb.valid_tokens, 1 + 2);
  EXPECT_EQ(mb.valid_tokens, ValidTokens(d, {1, 0}));
  // The shifted, unmasked labels of the padded rows are exactly the valid tokens.
  int64_t counted = 0;
  for (int64_t r = 0; r < mb.rows; ++r) {
    for (int64_t t = 1; t < mb.length; ++t) counted += mb.labels[r * mb.length + t] != -100;
  }
  EXPECT_EQ(counted, mb.valid_tokens);
}

// Catches a feature/target layout that is not row-major rows × dim.
TEST(CollateTest, SampleLevelRowsAreRowMajor) {
  Sample a, b;
  a.features = {1, 2};
  a.targets = {10};
  b.features = {3, 4};
  b.targets = {20};
  const Dataset d = Dataset::FromSamples({a, b});
  EXPECT_FALSE(d.token_level());
  const MicroBatch mb = Collate(d, {1, 0});
  EXPECT_EQ(mb.rows, 2);
  EXPECT_EQ(mb.feature_dim, 2);
  EXPECT_EQ(mb.target_dim, 1);
  EXPECT_THAT(mb.features, ElementsAre(3, 4, 1, 2));
  EXPECT_THAT(mb.targets, ElementsAre(20, 10));
  EXPECT_EQ(mb.valid_tokens, 0);
  EXPECT_TRUE(mb.input_ids.empty());
}

// Catches an empty micro-batch (a rank with no samples) crashing instead of being empty.
TEST(CollateTest, EmptyIndicesGiveEmptyBatch) {
  const Dataset d = Dataset::FromSamples({Tokens({1, 2}, {1, 2})});
  const MicroBatch mb = Collate(d, {});
  EXPECT_EQ(mb.rows, 0);
  EXPECT_EQ(mb.length, 0);
  EXPECT_EQ(mb.valid_tokens, 0);
  EXPECT_TRUE(mb.input_ids.empty());
}

}  // namespace
}  // namespace trainstep::data
