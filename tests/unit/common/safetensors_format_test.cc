// The Torch-free safetensors checks: hostile headers are refused, naming the tensor and problem.
#include "common/safetensors_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/unit/worker/checkpoint/fixtures.h"

namespace trainstep::ckpt {
namespace {

using ::testing::HasSubstr;

using fixture::Raw;

struct HostileCase {
  std::string what;     // What is wrong.
  std::string file;     // The whole file.
  std::string problem;  // Must appear in the message (the tensor name, where there is one, too).
  std::string tensor;
};

std::string Entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return absl::StrCat(R"({"dtype":)", dtype, R"(,"shape":)", shape, R"(,"data_offsets":)", offsets,
                      "}");
}

// A file holding one tensor "w" with the given raw JSON values.
std::string OneTensor(const std::string& dtype, const std::string& shape,
                      const std::string& offsets, const std::string& data) {
  return Raw(absl::StrCat(R"({"w":)", Entry(dtype, shape, offsets), "}"), data);
}

std::vector<HostileCase> HostileCases() {
  const std::string f32x2 = Entry(R"("F32")", "[2]", "[0,8]");
  const std::string data8(8, '\0');
  std::string huge_length(8, '\xff');
  std::string over_limit = Raw("{}");
  for (int i = 0; i < 8; ++i) over_limit[i] = static_cast<char>((100'000'001ULL >> (8 * i)));
  std::string past_file = Raw("{}");
  past_file[0] = 100;
  return {
      {"empty file", "", "fewer than the 8-byte header length", ""},
      {"7 bytes", "abcdefg", "fewer than the 8-byte header length", ""},
      {"length 2^64-1", huge_length, "exceeds the limit", ""},
      {"header over 100 MB", over_limit, "exceeds the limit of 100000000", ""},
      {"header past the file", past_file, "exceeds the 8 bytes after the length field", ""},
      {"invalid JSON", Raw(R"({"w":)"), "not valid JSON", ""},
      {"top-level list", Raw("[1,2]"), "not valid JSON", ""},
      {"trailing garbage", Raw("{} x"), "not valid JSON", ""},
      {"invalid UTF-8", Raw("{\"w\xff\":1}"), "not valid JSON", ""},
      {"deep nesting", Raw("{\"w\":" + std::string(100000, '[') + std::string(100000, ']') + "}"),
       "nests deeper than 3", ""},
      {"deep nesting in quotes", Raw("{'w\"':" + std::string(100000, '[') + "}"),
       "nests deeper than 3", ""},
      {"entry not an object", Raw(R"({"w":5})"), "entry is not a JSON object", "w"},
      {"unknown dtype", OneTensor(R"("F8_E4M3")", "[8]", "[0,8]", data8), "unknown dtype 'F8_E4M3'",
       "w"},
      {"dtype not a string", OneTensor("7", "[2]", "[0,8]", data8), "\"dtype\" is not a string",
       "w"},
      {"missing dtype", Raw(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", data8),
       "missing \"dtype\"", "w"},
      {"missing shape", Raw(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", data8),
       "missing \"shape\"", "w"},
      {"missing offsets", Raw(R"({"w":{"dtype":"F32","shape":[2]}})", data8),
       "missing \"data_offsets\"", "w"},
      {"unknown field",
       Raw(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", data8),
       "unknown field 'x'", "w"},
      {"shape not a list", OneTensor(R"("F32")", "2", "[0,8]", data8), "\"shape\" is not a list",
       "w"},
      {"negative dim", OneTensor(R"("F32")", "[-2]", "[0,8]", data8),
       "shape[0] is -2, not a non-negative integer", "w"},
      {"fractional dim", OneTensor(R"("F32")", "[2,1.5]", "[0,8]", data8), "shape[1] is 1.5", "w"},
      {"dim as string", OneTensor(R"("F32")", R"(["2"])", "[0,8]", data8),
       "shape[0] is not a number", "w"},
      {"dim 2^53", OneTensor(R"("F32")", "[9007199254740992]", "[0,8]", data8), "below 2^53", "w"},
      {"element count overflows",
       OneTensor(R"("F32")", "[4294967296,4294967296,4294967296]", "[0,8]", data8),
       "too many elements", "w"},
      {"empty but strides overflow",
       OneTensor(R"("F32")", "[0,4294967296,4294967296]", "[0,0]", ""), "too many elements", "w"},
      {"offsets not a pair", OneTensor(R"("F32")", "[2]", "[0,4,8]", data8),
       "not a list of two numbers", "w"},
      {"negative offset", OneTensor(R"("F32")", "[2]", "[-8,0]", data8), "data_offsets[0] is -8",
       "w"},
      {"offsets reversed", OneTensor(R"("F32")", "[0]", "[8,0]", data8), "end before they begin",
       "w"},
      {"offsets past the data", OneTensor(R"("F32")", "[4]", "[0,16]", data8),
       "out of range: the data section has 8 bytes", "w"},
      {"offsets past the data, huge",
       OneTensor(R"("U8")", "[8]", "[9007199254740000,9007199254740008]", data8), "out of range",
       "w"},
      {"size mismatch", OneTensor(R"("F32")", "[3]", "[0,8]", data8),
       "hold 8 bytes but shape [3] of F32 needs 12", "w"},
      {"overlap",
       Raw(absl::StrCat(R"({"a":)", f32x2, R"(,"w":)", Entry(R"("F32")", "[2]", "[4,12]"), "}"),
           std::string(12, '\0')),
       "overlap tensor 'a'", "w"},
      {"empty tensor inside another",
       Raw(absl::StrCat(R"({"a":)", f32x2, R"(,"w":)", Entry(R"("F32")", "[0]", "[4,4]"), "}"),
           data8),
       "overlap tensor 'a'", "w"},
      {"gap",
       Raw(absl::StrCat(R"({"a":)", Entry(R"("F32")", "[1]", "[0,4]"), R"(,"w":)",
                        Entry(R"("F32")", "[1]", "[8,12]"), "}"),
           std::string(12, '\0')),
       "leave a gap: bytes [4,8)", "w"},
      {"trailing bytes",
       Raw(absl::StrCat(R"({"a":)", Entry(R"("F32")", "[1]", "[0,4]"), "}"), data8),
       "has 8 bytes but the tensors cover only 4", ""},
      {"duplicate name", Raw(absl::StrCat(R"({"w":)", f32x2, R"(,"w":)", f32x2, "}"), data8),
       "Repeated map key: 'w'", ""},
      {"metadata not an object", Raw(R"({"__metadata__":[1]})"),
       "\"__metadata__\" is not a JSON object", ""},
      {"metadata value not a string", Raw(R"({"__metadata__":{"k":1}})"),
       "value of 'k' is not a string", ""},
      {"bool byte 2", OneTensor(R"("BOOL")", "[2]", "[0,2]", "\x01\x02"),
       "BOOL element 1 is byte 2, not 0 or 1", "w"},
  };
}

// Catches each malformed header being accepted, crashing, or reported without saying what is wrong.
TEST(SafetensorsTest, RejectsHostileInputNamingTensorAndProblem) {
  for (const HostileCase& c : HostileCases()) {
    SCOPED_TRACE(c.what);
    // An exact-size heap copy: a sanitizer build reports any read past the end.
    std::unique_ptr<char[]> copy(new char[c.file.size()]);
    std::memcpy(copy.get(), c.file.data(), c.file.size());
    const absl::string_view bytes(copy.get(), c.file.size());
    absl::StatusOr<SafetensorsHeader> parsed = ParseSafetensorsHeader(bytes);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.problem));
    if (!c.tensor.empty()) {
      EXPECT_THAT(parsed.status().message(), HasSubstr("tensor '" + c.tensor + "'"));
    }
    EXPECT_EQ(ValidateSafetensors(bytes), parsed.status());
  }
}

// Catches the unknown-field error depending on protobuf's (per-instance random) map order: the
// same file gave "unknown field 'format'" once and "unknown field 'note'" the next time (found
// by safetensors_fuzz; the input is in tests/fuzz/corpus/safetensors/).
TEST(SafetensorsFormatTest, UnknownFieldErrorIsTheSameEveryTime) {
  const std::string file =
      Raw(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"note":1,"format":2,"zz":3}})",
          std::string(8, '\0'));
  for (int i = 0; i < 20; ++i) {
    EXPECT_THAT(ValidateSafetensors(file).message(),
                HasSubstr("tensor 'w': unknown field 'format'"));
  }
}

// Catches: the nesting bound skipped before parsing (hostile text takes the parser minutes), an
// error that does not name the file, or a parsed object that loses a field.
TEST(SafetensorsTest, ParseJsonObjectBoundsNestingAndNamesTheFile) {
  absl::StatusOr<google::protobuf::Struct> ok = internal::ParseJsonObject(R"({"a": 1})", 1, "x");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->fields().at("a").number_value(), 1);
  absl::StatusOr<google::protobuf::Struct> deep =
      internal::ParseJsonObject(R"({"a": [1]})", 1, "meta.json");
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(deep.status().message(),
              HasSubstr("meta.json is invalid: JSON nests deeper than 1 levels"));
  absl::StatusOr<google::protobuf::Struct> broken = internal::ParseJsonObject("{", 1, "header");
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(broken.status().message(), HasSubstr("header is not valid JSON: "));
}

// Catches a writer whose files the reader (and so the reference implementation's rules) refuses:
// wrong offsets, unpadded header, a lost dtype or shape, metadata dropped.
TEST(SafetensorsFilePrefixTest, WrittenHeaderParsesBack) {
  const std::vector<SafetensorsTensorInfo> tensors = {
      {"a", SafetensorsDtype::kBF16, {2, 3}},
      {"b", SafetensorsDtype::kF32, {}},
      {"c", SafetensorsDtype::kI64, {0, 4}},
  };
  uint64_t data_bytes = 0;
  absl::StatusOr<std::string> prefix =
      SafetensorsFilePrefix(tensors, {{"format", "pt"}}, &data_bytes);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_EQ(data_bytes, 2 * 3 * 2 + 4u);
  EXPECT_EQ(prefix->size() % 8, 0u);
  const std::string file = *prefix + std::string(data_bytes, '\x01');
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(file);
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->entries.size(), 3u);
  EXPECT_EQ(header->entries[0].dtype, SafetensorsDtype::kBF16);
  EXPECT_EQ(header->entries[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(header->entries[0].end - header->entries[0].begin, 12u);
  EXPECT_EQ(header->entries[1].begin, 12u);
  EXPECT_EQ(header->entries[2].begin, header->entries[2].end);
  EXPECT_EQ(header->metadata.at("format"), "pt");

  EXPECT_EQ(
      SafetensorsFilePrefix({{"__metadata__", SafetensorsDtype::kF32, {1}}}, {}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsFilePrefix({{"x", SafetensorsDtype::kF32, {-1}}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsFilePrefix({{"\xff", SafetensorsDtype::kF32, {1}}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainstep::ckpt
