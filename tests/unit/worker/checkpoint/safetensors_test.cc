#include "worker/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "tests/unit/worker/checkpoint/fixtures.h"

namespace trainstep::ckpt {
namespace {

using ::testing::HasSubstr;

constexpr char kTestDir[] = TRAINSTEP_CHECKPOINT_TEST_DIR;

// A tensor of `type` and `shape` whose raw bytes are `values` (bits, for F16/BF16/BOOL).
template <typename T>
at::Tensor Make(const std::vector<T>& values, std::vector<int64_t> shape, at::ScalarType type) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  EXPECT_EQ(t.nbytes(), values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), t.nbytes());
  return t;
}

std::string RawBytes(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// Same dtype, same shape, same bytes: NaN payloads and -0.0 included.
void ExpectBitEqual(const at::Tensor& actual, const at::Tensor& expected, const std::string& name) {
  SCOPED_TRACE(name);
  ASSERT_TRUE(actual.defined());
  EXPECT_EQ(actual.scalar_type(), expected.scalar_type());
  EXPECT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(actual.is_cpu());
  EXPECT_TRUE(actual.is_contiguous());
  EXPECT_EQ(RawBytes(actual), RawBytes(expected));
}

void ExpectMapsBitEqual(const TensorMap& actual, const TensorMap& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << name;
    ExpectBitEqual(it->second, tensor, name);
  }
}

// The values of write_reference_safetensors.py's reference_tensors(), as literals.
TensorMap ReferenceTensors() {
  constexpr float kInfF = std::numeric_limits<float>::infinity();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  TensorMap m;
  m["weight_f32"] =
      Make<float>({-1.5f, -0.0f, 0.1f, 3.4028234663852886e38f, 1e-45f, kInfF}, {2, 3}, at::kFloat);
  m["ids_i64"] =
      Make<int64_t>({std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 42},
                    {3}, at::kLong);
  // 1.0, -2.5, 0.1 (rounded to 0x3DCD), 3e38 (rounded to 0x7F62).
  m["bf16"] = Make<uint16_t>({0x3F80, 0xC020, 0x3DCD, 0x7F62}, {2, 2}, at::kBFloat16);
  m["double_f64"] = Make<double>(
      {M_PI, -M_E, 5e-324, -kInf, std::numeric_limits<double>::quiet_NaN()}, {5}, at::kDouble);
  m["bytes_u8"] = Make<uint8_t>({0, 1, 127, 128, 255}, {5}, at::kByte);
  m["mask_bool"] = Make<uint8_t>({1, 0, 0, 1}, {2, 2}, at::kBool);
  // 1.0, -0.5, 65504 (max half), 0.1 (rounded to 0x2E66).
  m["half_f16"] = Make<uint16_t>({0x3C00, 0xB800, 0x7BFF, 0x2E66}, {4}, at::kHalf);
  m["i32"] = Make<int32_t>(
      {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}, {2}, at::kInt);
  m["i16"] = Make<int16_t>({-32768, 32767}, {2}, at::kShort);
  m["i8"] = Make<int8_t>({-128, 0, 127}, {3}, at::kChar);
  m["scalar"] = Make<float>({7.5f}, {}, at::kFloat);
  m["empty"] = Make<int64_t>({}, {0, 3}, at::kLong);
  return m;
}

const Metadata& ReferenceMetadata() {
  static const Metadata* m = new Metadata{
      {"format", "pt"},
      {"producer", "write_reference_safetensors.py"},
      {"note", "snowman \u2603, \"quotes\" and \\backslash"},
  };
  return *m;
}

using fixture::Raw;

uint64_t HeaderLength(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  return n;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "safetensors_test.XXXXXX";
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : "";
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// --- Round trips -------------------------------------------------------------------------------

// Catches a dtype mapped to the wrong ScalarType or item size, or values altered on the way.
TEST(SafetensorsTest, RoundTripsEveryDtypeBitExact) {
  const TensorMap tensors = ReferenceTensors();
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<TensorMap> parsed = ParseSafetensors(*bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectMapsBitEqual(*parsed, tensors);
}

// Catches F16/BF16 converted through float (NaN payloads and subnormals would change).
TEST(SafetensorsTest, EveryHalfAndBfloat16BitPatternSurvives) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  const TensorMap tensors = {{"f16", Make(all, {256, 256}, at::kHalf)},
                             {"bf16", Make(all, {65536}, at::kBFloat16)}};
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<TensorMap> parsed = ParseSafetensors(*bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectMapsBitEqual(*parsed, tensors);
}

// Catches random data of every dtype and rank being reordered or truncated.
TEST(SafetensorsTest, RoundTripsRandomTensorsOfEveryDtype) {
  at::manual_seed(7);
  TensorMap tensors;
  for (at::ScalarType type : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16}) {
    tensors[absl::StrCat("rand_", c10::toString(type))] = (at::randn({3, 5, 7}) * 100).to(type);
  }
  for (at::ScalarType type : {at::kLong, at::kInt, at::kShort, at::kChar}) {
    tensors[absl::StrCat("rand_", c10::toString(type))] =
        at::randint(-128, 128, {3, 5, 7}).to(type);
  }
  tensors["rand_u8"] = at::randint(0, 256, {2, 129}).to(at::kByte);
  tensors["rand_i64_wide"] = at::randint(std::numeric_limits<int64_t>::min(),
                                         std::numeric_limits<int64_t>::max(), {64}, at::kLong);
  tensors["rand_bool"] = at::rand({4, 9}) > 0.5;
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<TensorMap> parsed = ParseSafetensors(*bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectMapsBitEqual(*parsed, tensors);
}

// Catches 0-d scalars read back as shape [1] and empty tensors (a 0 dim) losing their shape.
TEST(SafetensorsTest, ScalarsAndEmptyTensorsKeepTheirShape) {
  const TensorMap tensors = {
      {"scalar", at::scalar_tensor(3.25, at::kDouble)},
      {"empty0", at::empty({0}, at::kFloat)},
      {"empty_mid", at::empty({2, 0, 3}, at::kBFloat16)},
      {"empty_huge_dims", at::empty({0, 1 << 20, 1 << 20}, at::kByte)},
  };
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_THAT(*bytes, HasSubstr("\"scalar\":{\"dtype\":\"F64\",\"shape\":[],"));
  absl::StatusOr<TensorMap> parsed = ParseSafetensors(*bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->at("scalar").dim(), 0);
  EXPECT_EQ(parsed->at("scalar").item<double>(), 3.25);
  EXPECT_EQ(parsed->at("empty_mid").sizes(), at::IntArrayRef({2, 0, 3}));
  ExpectMapsBitEqual(*parsed, tensors);
}

// Catches non-contiguous input written in storage order instead of logical order.
TEST(SafetensorsTest, NonContiguousInputIsWrittenInLogicalOrder) {
  at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  const TensorMap tensors = {
      {"transposed", base.t()},
      {"strided", base.slice(1, 1, 6, 2)},
      {"offset", base[2]},
      {"expanded", at::arange(3, at::kLong).expand({4, 3})},
      {"negated_view", at::_neg_view(base)},
  };
  ASSERT_FALSE(tensors.at("transposed").is_contiguous());
  absl::StatusOr<TensorMap> parsed = ParseSafetensors(*SerializeSafetensors(tensors));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(at::equal(parsed->at(name), tensor)) << parsed->at(name);
    EXPECT_TRUE(parsed->at(name).is_contiguous());
  }
}

// Catches parsed tensors aliasing the input buffer (they must own their memory).
TEST(SafetensorsTest, ParsedTensorsOwnTheirMemory) {
  std::string bytes = *SerializeSafetensors({{"x", at::ones({8}, at::kFloat)}});
  absl::StatusOr<TensorMap> parsed = ParseSafetensors(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  std::fill(bytes.begin(), bytes.end(), '\xff');
  bytes.clear();
  bytes.shrink_to_fit();
  EXPECT_TRUE(at::equal(parsed->at("x"), at::ones({8}, at::kFloat)));
}

// Catches metadata dropped, mis-escaped, or __metadata__ written when there is none.
TEST(SafetensorsTest, MetadataRoundTrips) {
  Metadata in = ReferenceMetadata();
  in["control"] = std::string("tab\tnewline\nnul\0end", 19);
  in["empty"] = "";
  Metadata out = {{"stale", "entry"}};
  absl::StatusOr<TensorMap> parsed =
      ParseSafetensors(*SerializeSafetensors({{"x", at::zeros({1})}}, in), &out);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(out, in);

  const std::string bare = *SerializeSafetensors({{"x", at::zeros({1})}});
  EXPECT_THAT(bare, ::testing::Not(HasSubstr("__metadata__")));
  ASSERT_TRUE(ParseSafetensors(bare, &out).ok());
  EXPECT_TRUE(out.empty());
}

// Catches an unpadded header (data not 8-byte aligned) and padding with anything but spaces.
TEST(SafetensorsTest, HeaderIsPaddedWithSpacesToEightBytes) {
  for (int len = 0; len < 17; ++len) {
    SCOPED_TRACE(len);
    const std::string file = *SerializeSafetensors({{std::string(len, 'n'), at::zeros({1})}});
    const uint64_t n = HeaderLength(file);
    EXPECT_EQ(n % 8, 0u);
    const std::string header = file.substr(8, n);
    const size_t close = header.rfind('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos);
    EXPECT_LT(n - close - 1, 8u);
    EXPECT_EQ(file.size(), 8 + n + 4);
  }
}

// Catches a reader that insists on padding or rejects padding (both are valid).
TEST(SafetensorsTest, AcceptsUnpaddedAndOverPaddedHeaders) {
  const std::string json = R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})";
  for (const std::string& file :
       {Raw(json, "abc", /*pad=*/false), Raw(json + std::string(21, ' '), "abc", /*pad=*/false),
        Raw(" \n" + json, "abc")}) {
    absl::StatusOr<TensorMap> parsed = ParseSafetensors(file);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(RawBytes(parsed->at("x")), "abc");
  }
}

// Catches any change to the bytes we write (key order, spacing, padding, offsets, endianness).
TEST(SafetensorsTest, ByteLayoutGolden) {
  const TensorMap tensors = {{"b", Make<uint8_t>({1}, {1, 1}, at::kBool)},
                             {"a", Make<float>({1.0f, -2.0f}, {2}, at::kFloat)}};
  const std::string expected = std::string("\x88\0\0\0\0\0\0\0", 8) +
                               R"({"__metadata__":{"k":"v"},)"
                               R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("b":{"dtype":"BOOL","shape":[1,1],"data_offsets":[8,9]}} )" +
                               std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x01", 9);
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors, {{"k", "v"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, expected);
}

// --- Writer errors -----------------------------------------------------------------------------

// Catches unsupported tensors silently written with a wrong dtype tag, or a crash.
TEST(SafetensorsTest, WriterRejectsWhatTheFormatCannotHold) {
  struct Case {
    std::string name;
    at::Tensor tensor;
    std::string problem;
  };
  const std::vector<Case> cases = {
      {"complex_w", at::zeros({2}, at::kComplexFloat), "dtype ComplexFloat is not supported"},
      {"undefined_w", at::Tensor(), "undefined tensor"},
      {"sparse_w", at::eye(3).to_sparse(), "only dense tensors"},
      {"__metadata__", at::zeros({1}), "reserved"},
      {"bad\xff utf8", at::zeros({1}), "not valid UTF-8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<std::string> bytes =
        SerializeSafetensors({{"ok", at::zeros({1})}, {c.name, c.tensor}});
    ASSERT_FALSE(bytes.ok());
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bytes.status().message(), HasSubstr(c.problem));
    EXPECT_THAT(bytes.status().message(), HasSubstr(absl::CHexEscape(c.name)));
  }
  absl::StatusOr<std::string> bad_meta = SerializeSafetensors({}, {{"k", "\xc3\x28"}});
  EXPECT_EQ(bad_meta.status().code(), absl::StatusCode::kInvalidArgument);
}

// --- Hostile input (the checks themselves: safetensors_format_test.cc) --------------------------

std::string OneTensor(const std::string& dtype, const std::string& shape,
                      const std::string& offsets, const std::string& data) {
  return Raw(absl::StrCat(R"({"w":{"dtype":)", dtype, R"(,"shape":)", shape, R"(,"data_offsets":)",
                          offsets, "}}"),
             data);
}

// Catches ParseSafetensors allocating before the header is validated, or reporting its own
// message instead of the validator's.
TEST(SafetensorsTest, ParseReportsTheValidatorsError) {
  const std::string file = OneTensor(R"("F32")", "[4]", "[0,16]", std::string(8, '\0'));
  absl::StatusOr<TensorMap> parsed = ParseSafetensors(file);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status(), ValidateSafetensors(file));
  EXPECT_THAT(parsed.status().message(), HasSubstr("tensor 'w': data_offsets [0,16] are out"));
}

// Catches the file variant dropping the path from a content error.
TEST(SafetensorsTest, FileErrorsNameTheFile) {
  TempDir dir;
  const std::string path = dir.path() + "/bad.safetensors";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  const std::string file = OneTensor(R"("X9")", "[1]", "[0,1]", std::string(1, '\0'));
  std::fwrite(file.data(), 1, file.size(), f);
  std::fclose(f);
  absl::StatusOr<TensorMap> read = ReadSafetensorsFile(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
  EXPECT_THAT(read.status().message(), HasSubstr("tensor 'w': unknown dtype 'X9'"));

  EXPECT_EQ(ReadSafetensorsFile(dir.path() + "/missing").status().code(),
            absl::StatusCode::kNotFound);
}

// Catches a parser that over-reads or crashes on a file cut short anywhere.
TEST(SafetensorsTest, TruncationAtEveryOffsetIsAnErrorNeverACrash) {
  const std::string full = *SerializeSafetensors(ReferenceTensors(), ReferenceMetadata());
  for (size_t len = 0; len < full.size(); ++len) {
    std::unique_ptr<char[]> copy(new char[len]);
    std::memcpy(copy.get(), full.data(), len);
    absl::StatusOr<TensorMap> parsed = ParseSafetensors(absl::string_view(copy.get(), len));
    ASSERT_FALSE(parsed.ok()) << "truncated to " << len << " of " << full.size();
    ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
  }
  EXPECT_TRUE(ParseSafetensors(full).ok());
}

// Catches crashes on corrupted bytes anywhere (header digits, quotes, lengths, data).
TEST(SafetensorsTest, CorruptingAnyByteNeverCrashes) {
  const std::string full = *SerializeSafetensors(ReferenceTensors(), ReferenceMetadata());
  const char replacements[] = {'\0', '\xff', '9', '"', '[', '}', ',', '-', ' ', '\x01'};
  int accepted = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    for (char r : replacements) {
      std::string corrupt = full;
      corrupt[i] = r;
      std::unique_ptr<char[]> copy(new char[corrupt.size()]);
      std::memcpy(copy.get(), corrupt.data(), corrupt.size());
      const absl::string_view bytes(copy.get(), corrupt.size());
      absl::StatusOr<TensorMap> parsed = ParseSafetensors(bytes);
      ASSERT_EQ(ValidateSafetensors(bytes).ok(), parsed.ok()) << i;
      if (parsed.ok()) {
        ++accepted;  // Data bytes or harmless header bytes changed; must still be well-formed.
        for (const auto& [name, t] : *parsed) ASSERT_TRUE(t.is_contiguous()) << name;
      } else {
        ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
      }
    }
  }
  EXPECT_GT(accepted, 0);
}

// --- Files and the independent implementation ---------------------------------------------------

class CountingEnv : public EnvWrapper {
 public:
  CountingEnv() : EnvWrapper(Env::Default()) {}
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = target()->NewWritableFile(path);
    if (!file.ok()) return file;
    return std::unique_ptr<WritableFile>(new File(this, *std::move(file)));
  }
  int syncs = 0;
  int closes = 0;

 private:
  class File : public WritableFile {
   public:
    File(CountingEnv* env, std::unique_ptr<WritableFile> f) : env_(env), f_(std::move(f)) {}
    absl::Status Append(std::string_view data) override { return f_->Append(data); }
    absl::Status Sync() override {
      ++env_->syncs;
      return f_->Sync();
    }
    absl::Status Close() override {
      ++env_->closes;
      return f_->Close();
    }

   private:
    CountingEnv* env_;
    std::unique_ptr<WritableFile> f_;
  };
};

// Catches a file written without fsync, or one the reader does not accept back.
TEST(SafetensorsTest, FileRoundTripIsSynced) {
  TempDir dir;
  CountingEnv env;
  const std::string path = dir.path() + "/x.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(path, ReferenceTensors(), ReferenceMetadata(), &env).ok());
  EXPECT_EQ(env.syncs, 1);
  EXPECT_EQ(env.closes, 1);
  Metadata metadata;
  absl::StatusOr<TensorMap> read = ReadSafetensorsFile(path, &metadata);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectMapsBitEqual(*read, ReferenceTensors());
  EXPECT_EQ(metadata, ReferenceMetadata());
  // Streaming writer and in-memory serializer agree byte for byte.
  EXPECT_EQ(*Env::Default()->ReadFile(path),
            *SerializeSafetensors(ReferenceTensors(), ReferenceMetadata()));
}

// Catches misreading files from another implementation (unsorted data order, unaligned tensors,
// \u escapes in metadata): reference.safetensors was written by write_reference_safetensors.py.
TEST(SafetensorsTest, ReadsFixtureWrittenByIndependentImplementation) {
  Metadata metadata;
  absl::StatusOr<TensorMap> read =
      ReadSafetensorsFile(absl::StrCat(kTestDir, "/reference.safetensors"), &metadata);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(metadata, ReferenceMetadata());
  ExpectMapsBitEqual(*read, ReferenceTensors());
  // A few values spelled out, independent of the literal table above.
  EXPECT_EQ(read->at("weight_f32")[0][0].item<float>(), -1.5f);
  EXPECT_TRUE(std::signbit(read->at("weight_f32")[0][1].item<float>()));
  EXPECT_EQ(read->at("bf16")[1][0].item<float>(), 0.10009765625f);
  EXPECT_EQ(read->at("half_f16")[2].item<float>(), 65504.0f);
  EXPECT_EQ(read->at("ids_i64")[0].item<int64_t>(), std::numeric_limits<int64_t>::min());
  EXPECT_TRUE(std::isnan(read->at("double_f64")[4].item<double>()));
  EXPECT_EQ(read->at("mask_bool").sum().item<int64_t>(), 2);
  EXPECT_EQ(read->at("scalar").dim(), 0);
  EXPECT_EQ(read->at("empty").sizes(), at::IntArrayRef({0, 3}));
}

// Runs `command`, returning its exit status and capturing stdout+stderr.
int RunCommand(const std::string& command, std::string* output) {
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) output->append(buf, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Catches files only our own reader accepts: the independent Python reader checks our output.
TEST(SafetensorsTest, IndependentReaderAcceptsOurFile) {
  const std::string python = "/usr/bin/python3";
  std::string ignored;
  if (::access(python.c_str(), X_OK) != 0 ||
      RunCommand(python + " -c 'import torch'", &ignored) != 0) {
    GTEST_SKIP() << python << " with torch is not available";
  }
  TempDir dir;
  const std::string path = dir.path() + "/ours.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(path, ReferenceTensors(), ReferenceMetadata()).ok());
  std::string output;
  const int rc = RunCommand(
      absl::StrCat(python, " ", kTestDir, "/write_reference_safetensors.py verify ", path),
      &output);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_THAT(output, HasSubstr("OK: 12 tensors and metadata match"));
}

}  // namespace
}  // namespace trainstep::ckpt
