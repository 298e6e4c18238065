// `trainstep checkpoint export`: the dtype conversions against an independent formula, sizes,
// the single-file and sharded layouts, exact round trips, and every way the input or --out can
// be wrong, each leaving nothing behind.
#include "client/export.h"

#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/args.h"
#include "client/cli.h"
#include "common/env.h"
#include "common/safetensors_format.h"
#include "core/llama_config.h"

namespace trainstep::client {
namespace {

namespace fs = std::filesystem;
using ckpt::SafetensorsDtype;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- The conversions ----

// IEEE binary16 decoded by its definition, independently of the encoder.
double DecodeF16(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  double v;
  if (exponent == 0x1F) {
    v = mantissa == 0 ? std::numeric_limits<double>::infinity()
                      : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    v = std::ldexp(mantissa, -24);
  } else {
    v = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign ? -v : v;
}

double DecodeBf16(uint16_t b) { return FromBits(uint32_t{b} << 16); }

// Round `x` to a binary format with `precision` significand bits and exponents emin..emax, ties
// to even, in double arithmetic (exact here: x has 24 significant bits, quotients are powers of
// two). A result past the largest finite value is inf.
double RoundReference(float x, int precision, int emin, int emax) {
  const double a = std::fabs(static_cast<double>(x));
  if (a == 0 || std::isinf(a)) return x;
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  const double quantum = std::ldexp(1.0, std::max(e - 1, emin) - (precision - 1));
  double r = std::nearbyint(a / quantum) * quantum;
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, 1 - precision), emax);
  if (r > max_finite) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, static_cast<double>(x));
}

// Checks one value both ways; returns "" or what is wrong.
std::string CheckConversions(float x) {
  const uint16_t h = F16FromF32(x), b = Bf16FromF32(x);
  if (std::isnan(x)) {
    const bool sign = std::signbit(x);
    if ((h & 0x7C00) != 0x7C00 || (h & 0x0200) == 0 || ((h >> 15) != 0) != sign) {
      return absl::StrCat("f16 of NaN ", absl::Hex(Bits(x)), " is ", absl::Hex(h));
    }
    if ((b & 0x7F80) != 0x7F80 || (b & 0x0040) == 0 || ((b >> 15) != 0) != sign) {
      return absl::StrCat("bf16 of NaN ", absl::Hex(Bits(x)), " is ", absl::Hex(b));
    }
    return "";
  }
  const double want_h = RoundReference(x, 11, -14, 15);
  const double want_b = RoundReference(x, 8, -126, 127);
  if (DecodeF16(h) != want_h || std::signbit(DecodeF16(h)) != std::signbit(want_h)) {
    return absl::StrCat("f16 of ", absl::Hex(Bits(x)), " is ", absl::Hex(h), " = ", DecodeF16(h),
                        ", want ", want_h);
  }
  if (DecodeBf16(b) != want_b || std::signbit(DecodeBf16(b)) != std::signbit(want_b)) {
    return absl::StrCat("bf16 of ", absl::Hex(Bits(x)), " is ", absl::Hex(b), " = ", DecodeBf16(b),
                        ", want ", want_b);
  }
  return "";
}

// Catches truncation instead of rounding, ties rounded away from zero, a carry that does not
// reach the exponent, NaN turned into inf (or losing its sign), and overflow that wraps.
TEST(ConversionTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(Bf16FromF32(1.0f), 0x3F80);
  EXPECT_EQ(Bf16FromF32(-2.0f), 0xC000);
  EXPECT_EQ(Bf16FromF32(-0.0f), 0x8000);
  EXPECT_EQ(Bf16FromF32(FromBits(0x3F808000)), 0x3F80);  // tie, even below: down
  EXPECT_EQ(Bf16FromF32(FromBits(0x3F818000)), 0x3F82);  // tie, odd below: up
  EXPECT_EQ(Bf16FromF32(FromBits(0x3F808001)), 0x3F81);  // just above the tie
  EXPECT_EQ(Bf16FromF32(FromBits(0x3F807FFF)), 0x3F80);  // just below the tie
  EXPECT_EQ(Bf16FromF32(FromBits(0x3FFFFFFF)), 0x4000);  // carry into the exponent
  EXPECT_EQ(Bf16FromF32(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(Bf16FromF32(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(Bf16FromF32(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the max
  EXPECT_EQ(Bf16FromF32(FromBits(0x7F7F7FFF)), 0x7F7F);               // the max bf16 stays
  EXPECT_EQ(Bf16FromF32(FromBits(0x7FC00000)), 0x7FC0);
  EXPECT_EQ(Bf16FromF32(FromBits(0xFF800001)), 0xFFC0);  // signalling, payload only below
  EXPECT_EQ(Bf16FromF32(FromBits(0x7FA00000)), 0x7FE0);  // signalling: quieted, payload kept
  EXPECT_EQ(Bf16FromF32(FromBits(0x00000001)), 0x0000);  // tiny subnormal
  EXPECT_EQ(Bf16FromF32(FromBits(0x00018000)), 0x0002);  // subnormal tie, odd below: up
  EXPECT_EQ(Bf16FromF32(FromBits(0x00008000)), 0x0000);  // subnormal tie, even below: down
}

// Catches overflow that saturates or wraps instead of giving inf, subnormals flushed to zero or
// rounded wrongly, ties away from zero, and a NaN that becomes inf.
TEST(ConversionTest, F16RoundsToNearestEvenWithSubnormals) {
  EXPECT_EQ(F16FromF32(1.0f), 0x3C00);
  EXPECT_EQ(F16FromF32(-2.0f), 0xC000);
  EXPECT_EQ(F16FromF32(-0.0f), 0x8000);
  EXPECT_EQ(F16FromF32(0.1f), 0x2E66);
  EXPECT_EQ(F16FromF32(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie, even below
  EXPECT_EQ(F16FromF32(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie, odd below
  EXPECT_EQ(F16FromF32(65504.0f), 0x7BFF);
  EXPECT_EQ(F16FromF32(FromBits(0x477FEFFF)), 0x7BFF);  // just under 65520
  EXPECT_EQ(F16FromF32(65520.0f), 0x7C00);              // the tie rounds to even: inf
  EXPECT_EQ(F16FromF32(-1e6f), 0xFC00);
  EXPECT_EQ(F16FromF32(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(F16FromF32(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(F16FromF32(std::ldexp(1.0f, -14)), 0x0400);  // the smallest normal
  EXPECT_EQ(F16FromF32(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(F16FromF32(std::ldexp(1.0f, -25)), 0x0000);  // tie with zero: even
  EXPECT_EQ(F16FromF32(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(F16FromF32(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie between 1 and 2 units
  EXPECT_EQ(F16FromF32(5 * std::ldexp(1.0f, -25)), 0x0002);  // tie between 2 and 3 units
  // Halfway between the largest subnormal and the smallest normal: up, to the even normal.
  EXPECT_EQ(F16FromF32(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);
  EXPECT_EQ(F16FromF32(-std::ldexp(1.0f, -20)), 0x8010);
  EXPECT_EQ(F16FromF32(FromBits(0x00000001)), 0x0000);  // fp32 subnormal
  EXPECT_EQ(F16FromF32(FromBits(0x7FC00000)), 0x7E00);
  EXPECT_EQ(F16FromF32(FromBits(0xFF800001)), 0xFE00);  // signalling: quiet, sign kept
}

// Catches any value the hand-picked cases miss: an evenly spread 4 million fp32 values and the
// neighbourhood of every tie of both formats, compared with a double-precision formula.
TEST(ConversionTest, SweepAgreesWithIndependentFormula) {
  int failures = 0;
  const auto check = [&failures](float x) {
    const std::string problem = CheckConversions(x);
    if (!problem.empty() && ++failures <= 10) ADD_FAILURE() << problem;
  };
  for (uint64_t u = 0; u <= 0xFFFFFFFFu; u += 1021) check(FromBits(static_cast<uint32_t>(u)));
  for (uint32_t b = 0; b < 0x7F80; ++b) {  // every positive finite bf16 and its next tie
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t tie = sign | b << 16 | 0x8000;
      for (uint32_t u : {tie - 1, tie, tie + 1, sign | b << 16}) check(FromBits(u));
    }
  }
  for (uint16_t h = 0; h < 0x7C00; ++h) {  // every positive finite half and its next tie
    const float tie = static_cast<float>((DecodeF16(h) + DecodeF16(h + 1)) / 2);
    for (float t : {tie, -tie}) {
      check(std::nextafter(t, 0.0f));
      check(t);
      check(std::nextafter(t, 2 * t));
    }
  }
  EXPECT_EQ(failures, 0);
}

// ---- ParseByteSize ----

// Catches 1024-based GB (transformers' "5GB" is 5e9), a unit that is ignored, 0 or a negative
// size accepted, and a multiplication that overflows silently.
TEST(ParseByteSizeTest, UnitsAndErrors) {
  const std::vector<std::pair<std::string, uint64_t>> good = {
      {"123", 123},
      {"123B", 123},
      {"1KB", 1000},
      {"500MB", 500'000'000},
      {"5GB", 5'000'000'000},
      {"5gb", 5'000'000'000},
      {"1KiB", 1024},
      {"64MiB", 64ull << 20},
      {"2GiB", 2ull << 30},
      {"1TB", 1'000'000'000'000},
      {"18446744073709551615", std::numeric_limits<uint64_t>::max()},
  };
  for (const auto& [text, want] : good) {
    absl::StatusOr<uint64_t> got = ParseByteSize(text);
    ASSERT_TRUE(got.ok()) << text << ": " << got.status();
    EXPECT_EQ(*got, want) << text;
  }
  for (const char* bad : {"", "0", "0GB", "-1", "-5GB", "abc", "GB", "5 GB", "5.5GB", "5XB", "+5",
                          "18446744073709551616", "20000000000GB", "99999999999999999999"}) {
    absl::StatusOr<uint64_t> got = ParseByteSize(bad);
    EXPECT_FALSE(got.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << bad;
    EXPECT_THAT(got.status().message(), HasSubstr(absl::StrCat("\"", bad, "\""))) << bad;
  }
}

// ---- Checkpoint fixtures ----

struct Tensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  std::string bytes;  // little-endian
};

Tensor F32Tensor(const std::string& name, std::vector<int64_t> shape,
                 const std::vector<float>& values) {
  Tensor t{name, SafetensorsDtype::kF32, std::move(shape), std::string(values.size() * 4, '\0')};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<uint16_t> Halves(const std::string& bytes) {
  std::vector<uint16_t> out(bytes.size() / 2);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// A whole safetensors file, tensors in name order as the worker writes them.
std::string SafetensorsFile(std::vector<Tensor> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const Tensor& a, const Tensor& b) { return a.name < b.name; });
  std::vector<ckpt::SafetensorsTensorInfo> infos;
  for (const Tensor& t : tensors) infos.push_back({t.name, t.dtype, t.shape});
  absl::StatusOr<std::string> file = ckpt::SafetensorsFilePrefix(infos, {{"format", "pt"}});
  EXPECT_TRUE(file.ok()) << file.status();
  for (const Tensor& t : tensors) *file += t.bytes;
  return *file;
}

// The shapes of a 1-layer llama with hidden 8, 2 heads of 4, 1 KV head, MLP 16, vocab 16.
const std::vector<std::pair<std::string, std::vector<int64_t>>>& LlamaShapes() {
  static const auto* shapes = new std::vector<std::pair<std::string, std::vector<int64_t>>>{
      {"lm_head.weight", {16, 8}},
      {"model.embed_tokens.weight", {16, 8}},
      {"model.layers.0.input_layernorm.weight", {8}},
      {"model.layers.0.mlp.down_proj.weight", {8, 16}},
      {"model.layers.0.mlp.gate_proj.weight", {16, 8}},
      {"model.layers.0.mlp.up_proj.weight", {16, 8}},
      {"model.layers.0.post_attention_layernorm.weight", {8}},
      {"model.layers.0.self_attn.k_proj.weight", {4, 8}},
      {"model.layers.0.self_attn.o_proj.weight", {8, 8}},
      {"model.layers.0.self_attn.q_proj.weight", {8, 8}},
      {"model.layers.0.self_attn.v_proj.weight", {4, 8}},
      {"model.norm.weight", {8}},
  };
  return *shapes;
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Random weights; the embeddings begin with values that exercise rounding: ties of both
// formats, overflow in f16, subnormals, ±0, ±inf.
std::vector<Tensor> RandomLlamaTensors(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<Tensor> tensors;
  for (const auto& [name, shape] : LlamaShapes()) {
    std::vector<float> values(Elements(shape));
    for (float& v : values) v = normal(rng);
    if (name == "model.embed_tokens.weight") {
      const std::vector<float> special = {FromBits(0x3F808000),
                                          FromBits(0x3F818000),
                                          1.0f + std::ldexp(1.0f, -11),
                                          65520.0f,
                                          -70000.0f,
                                          65504.0f,
                                          std::ldexp(1.0f, -25),
                                          3 * std::ldexp(1.0f, -25),
                                          5 * std::ldexp(1.0f, -25),
                                          std::ldexp(1.0f, -130),
                                          -0.0f,
                                          0.0f,
                                          std::numeric_limits<float>::infinity(),
                                          -std::numeric_limits<float>::infinity(),
                                          std::numeric_limits<float>::max(),
                                          1e-3f,
                                          -123.456f};
      std::copy(special.begin(), special.end(), values.begin());
    }
    tensors.push_back(F32Tensor(name, shape, values));
  }
  return tensors;
}

std::string ConfigJson(const std::string& source_dtype) {
  std::string s = R"({
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_act": "silu",
  "hidden_size": 8,
  "intermediate_size": 16,
  "num_hidden_layers": 1,
  "num_attention_heads": 2,
  "num_key_value_heads": 1,
  "vocab_size": 16,
  "max_position_embeddings": 64,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "float32")";
  if (!source_dtype.empty()) {
    absl::StrAppend(&s, ",\n  \"trainstep_source_dtype\": \"", source_dtype, "\"");
  }
  return s + "\n}\n";
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
  ASSERT_TRUE(f.good()) << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// A fresh directory under the test's temporary directory, removed at the end.
class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = absl::StrCat(::testing::TempDir(), "/export-test-XXXXXX");
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    ckpt_ = root_ + "/ckpt-7";
    out_ = root_ + "/hf";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // A checkpoint directory as the worker writes it.
  void WriteCheckpoint(const std::vector<Tensor>& tensors, const std::string& source_dtype) {
    fs::create_directories(ckpt_);
    WriteFile(ckpt_ + "/config.json", ConfigJson(source_dtype));
    WriteFile(ckpt_ + "/model.safetensors", SafetensorsFile(tensors));
    WriteFile(ckpt_ + "/optimizer.safetensors", SafetensorsFile({}));
    WriteFile(ckpt_ + "/meta.json", "{}\n");
  }

  absl::Status Export(const std::string& dtype = "", uint64_t max_shard = kDefaultMaxShardBytes,
                      Env* env = Env::Default()) {
    ExportOptions options;
    options.checkpoint_dir = ckpt_;
    options.out_dir = out_;
    options.dtype = dtype;
    options.max_shard_bytes = max_shard;
    progress_.str("");
    return ExportCheckpoint(options, progress_, env);
  }

  // Fails unless the root holds exactly the checkpoint (and `also`): no --out, no temporary.
  void ExpectNothingLeftBehind(const std::set<std::string>& also = {}) {
    std::set<std::string> want = {"ckpt-7"};
    want.insert(also.begin(), also.end());
    EXPECT_EQ(Entries(root_), want);
  }

  std::string root_, ckpt_, out_;
  std::ostringstream progress_;
};

// Every tensor of an exported directory, read back through the index when there is one.
struct Exported {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> file_of;  // tensor → file
  std::map<std::string, uint64_t> file_bytes;  // file → its tensors' bytes
};

Exported ReadExport(const std::string& dir, const std::vector<std::string>& files) {
  Exported out;
  for (const std::string& file : files) {
    const std::string bytes = ReadFile(dir + "/" + file);
    absl::StatusOr<ckpt::SafetensorsHeader> header = ckpt::ParseSafetensorsHeader(bytes);
    EXPECT_TRUE(header.ok()) << file << ": " << header.status();
    if (!header.ok()) continue;
    EXPECT_EQ(header->metadata, (ckpt::Metadata{{"format", "pt"}})) << file;
    for (const ckpt::SafetensorsEntry& e : header->entries) {
      EXPECT_EQ(out.tensors.count(e.name), 0u) << e.name << " in two files";
      out.tensors[e.name] = Tensor{e.name, e.dtype, e.shape,
                                   std::string(header->data.substr(e.begin, e.end - e.begin))};
      out.file_of[e.name] = file;
      out.file_bytes[file] += e.end - e.begin;
    }
  }
  return out;
}

google::protobuf::Struct ParseJson(const std::string& json) {
  google::protobuf::Struct s;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &s).ok()) << json;
  return s;
}

LlamaConfig ExportedConfig(const std::string& dir) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfigJson(ReadFile(dir + "/config.json"), "out", {});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.value_or(LlamaConfig());
}

// Catches a wrong rounding in the file (not just in the function), a dtype or shape not
// updated in the header, missing {"format": "pt"}, and a config.json still saying float32 or
// carrying trainstep_source_dtype.
TEST_F(ExportTest, SingleFileBf16) {
  const std::vector<Tensor> in = RandomLlamaTensors(1);
  WriteCheckpoint(in, "float32");
  ASSERT_TRUE(Export("bfloat16").ok()) << progress_.str();
  EXPECT_EQ(Entries(out_), (std::set<std::string>{"config.json", "model.safetensors"}));
  ExpectNothingLeftBehind({"hf"});
  const Exported got = ReadExport(out_, {"model.safetensors"});
  ASSERT_EQ(got.tensors.size(), in.size());
  for (const Tensor& t : in) {
    const Tensor& e = got.tensors.at(t.name);
    EXPECT_EQ(e.dtype, SafetensorsDtype::kBF16) << t.name;
    EXPECT_EQ(e.shape, t.shape) << t.name;
    const std::vector<float> f = Floats(t.bytes);
    const std::vector<uint16_t> h = Halves(e.bytes);
    ASSERT_EQ(h.size(), f.size()) << t.name;
    for (size_t i = 0; i < f.size(); ++i) {
      ASSERT_EQ(h[i], Bf16FromF32(f[i])) << t.name << "[" << i << "]";
    }
  }
  const LlamaConfig config = ExportedConfig(out_);
  EXPECT_EQ(config.torch_dtype, "bfloat16");
  EXPECT_EQ(config.source_dtype, "");
  EXPECT_EQ(config.hidden_size, 8);
  EXPECT_EQ(config.num_key_value_heads, 1);
  EXPECT_THAT(ReadFile(out_ + "/config.json"), Not(HasSubstr("trainstep_source_dtype")));
  EXPECT_THAT(progress_.str(), HasSubstr(absl::StrCat("wrote ", out_,
                                                      "/model.safetensors (12 "
                                                      "tensors, 1.7 KB)\n")));
  EXPECT_THAT(progress_.str(), HasSubstr(absl::StrCat("wrote ", out_, "/config.json\n")));
  EXPECT_THAT(progress_.str(), HasSubstr("exported 12 tensors (1.7 KB, bfloat16)"));
}

// Catches a sharded checkpoint (a model above the shard size) that cannot be exported: its
// shards and index read as one set of tensors, and export the same bytes as a single file does.
TEST_F(ExportTest, ShardedCheckpointExportsLikeASingleFile) {
  WriteCheckpoint(RandomLlamaTensors(4), "bfloat16");
  ASSERT_TRUE(Export("float32", 200).ok()) << progress_.str();  // fp32 shards, as a checkpoint
  ASSERT_TRUE(fs::exists(out_ + "/model.safetensors.index.json"));
  const std::string single = root_ + "/single";
  const std::string from_shards = root_ + "/from-shards";
  for (const auto& [in, to] : {std::pair{ckpt_, single}, std::pair{out_, from_shards}}) {
    ExportOptions options;
    options.checkpoint_dir = in;
    options.out_dir = to;
    options.dtype = "bfloat16";
    std::ostringstream progress;
    ASSERT_TRUE(ExportCheckpoint(options, progress).ok()) << in;
  }
  EXPECT_EQ(ReadFile(from_shards + "/model.safetensors"), ReadFile(single + "/model.safetensors"));
}

// Catches a wrong index (total_size counting headers, a tensor mapped to the wrong file,
// unsorted keys), shards that exceed the limit or are not filled greedily in name order, a
// tensor over the limit that is split or shares a file, and tensors lost between shards.
TEST_F(ExportTest, ShardedFloat16WithIndex) {
  const std::vector<Tensor> in = RandomLlamaTensors(2);
  WriteCheckpoint(in, "float32");
  // f16 sizes: 256 B for the [16, 8] tensors, more than the limit, 16 B for the norms.
  const uint64_t limit = 200;
  ASSERT_TRUE(Export("float16", limit).ok()) << progress_.str();

  const std::set<std::string> files = Entries(out_);
  std::vector<std::string> shards;
  for (const std::string& f : files) {
    if (absl::StartsWith(f, "model-")) shards.push_back(f);
  }
  const size_t n = shards.size();
  ASSERT_GT(n, 2u);
  std::set<std::string> want = {"config.json", "model.safetensors.index.json"};
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, n);
    EXPECT_EQ(shards[i], name);
    want.insert(name);
  }
  EXPECT_EQ(files, want);
  ExpectNothingLeftBehind({"hf"});

  const Exported got = ReadExport(out_, shards);
  ASSERT_EQ(got.tensors.size(), in.size());
  std::set<std::string> used;
  for (const auto& [name, file] : got.file_of) used.insert(file);
  EXPECT_EQ(used, std::set<std::string>(shards.begin(), shards.end())) << "an empty shard";
  uint64_t total = 0;
  for (const Tensor& t : in) {
    const Tensor& e = got.tensors.at(t.name);
    EXPECT_EQ(e.dtype, SafetensorsDtype::kF16);
    EXPECT_EQ(e.shape, t.shape);
    const std::vector<float> f = Floats(t.bytes);
    const std::vector<uint16_t> h = Halves(e.bytes);
    for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(h[i], F16FromF32(f[i])) << t.name << i;
    total += e.bytes.size();
  }

  // Greedy in name order: a shard's tensors follow the previous shard's, and the first tensor
  // of the next shard did not fit.
  std::vector<std::string> names;
  for (const auto& [name, t] : got.tensors) names.push_back(name);
  for (size_t i = 0; i + 1 < names.size(); ++i) {
    const std::string& a = got.file_of.at(names[i]);
    const std::string& b = got.file_of.at(names[i + 1]);
    EXPECT_LE(a, b) << names[i] << " and " << names[i + 1];
    if (a != b) {
      EXPECT_GT(got.file_bytes.at(a) + got.tensors.at(names[i + 1]).bytes.size(), limit);
    }
  }
  for (const auto& [shard, bytes] : got.file_bytes) {
    const std::string file = shard;  // clang 14 cannot capture a structured binding
    if (bytes > limit) {
      EXPECT_EQ(std::count_if(got.file_of.begin(), got.file_of.end(),
                              [&](const auto& p) { return p.second == file; }),
                1)
          << file << " holds a tensor over the limit and others";
    }
  }

  const std::string index_text = ReadFile(out_ + "/model.safetensors.index.json");
  const google::protobuf::Struct index = ParseJson(index_text);
  EXPECT_EQ(index.fields().at("metadata").struct_value().fields().at("total_size").number_value(),
            static_cast<double>(total));
  const auto& map = index.fields().at("weight_map").struct_value().fields();
  ASSERT_EQ(map.size(), in.size());
  for (const auto& [name, file] : got.file_of) EXPECT_EQ(map.at(name).string_value(), file);
  size_t last = 0;
  for (const std::string& name : names) {  // sorted keys, as transformers writes them
    const size_t at = index_text.find(absl::StrCat("\"", name, "\""));
    ASSERT_NE(at, std::string::npos);
    EXPECT_GT(at, last) << name;
    last = at;
  }
  EXPECT_EQ(ExportedConfig(out_).torch_dtype, "float16");
  EXPECT_THAT(progress_.str(), HasSubstr(absl::StrCat("wrote ", out_, "/model-00001-of-")));
}

// Catches float32 output that is converted at all (e.g. through a lossy path), and tensors
// of other dtypes converted or reinterpreted instead of copied.
TEST_F(ExportTest, Float32IsByteIdenticalAndOtherDtypesAreCopied) {
  std::vector<Tensor> in = RandomLlamaTensors(3);
  Tensor bf16{
      "model.extra_bf16", SafetensorsDtype::kBF16, {3}, std::string("\x80\x3f\x01\x00\xc0\x7f", 6)};
  Tensor ids{"model.extra_i64",
             SafetensorsDtype::kI64,
             {1},
             std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8)};
  in.push_back(bf16);
  in.push_back(ids);
  WriteCheckpoint(in, "");
  for (const std::string dtype : {"float32", "float16"}) {
    fs::remove_all(out_);
    ASSERT_TRUE(Export(dtype).ok()) << dtype;
    const Exported got = ReadExport(out_, {"model.safetensors"});
    ASSERT_EQ(got.tensors.size(), in.size());
    for (const Tensor& t : in) {
      const Tensor& e = got.tensors.at(t.name);
      if (t.dtype != SafetensorsDtype::kF32 || dtype == "float32") {
        EXPECT_EQ(e.dtype, t.dtype) << t.name;
        EXPECT_EQ(e.bytes, t.bytes) << t.name;
      }
    }
  }
}

// Catches a bf16 export of a model that came in as bf16 that does not give its bytes back:
// every bf16 value (NaN, inf, subnormals included) survives fp32 widening and the rounding.
TEST_F(ExportTest, Bf16RoundTripIsExact) {
  std::mt19937 rng(4);
  std::vector<Tensor> in;
  std::map<std::string, std::vector<uint16_t>> original;
  for (const auto& [name, shape] : LlamaShapes()) {
    std::vector<uint16_t> bits(Elements(shape));
    for (uint16_t& b : bits) {
      b = static_cast<uint16_t>(rng());
      if ((b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0) b |= 0x40;  // NaNs are quiet
    }
    if (name == "model.embed_tokens.weight") {
      const std::vector<uint16_t> special = {0x0000, 0x8000, 0x0001, 0x807F, 0x7F7F, 0xFF7F,
                                             0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x3F80, 0x3F81};
      std::copy(special.begin(), special.end(), bits.begin());
    }
    std::vector<float> widened;
    for (uint16_t b : bits) widened.push_back(FromBits(uint32_t{b} << 16));
    in.push_back(F32Tensor(name, shape, widened));
    original[name] = bits;
  }
  WriteCheckpoint(in, "bfloat16");
  ASSERT_TRUE(Export().ok());  // the default: the source dtype
  const Exported got = ReadExport(out_, {"model.safetensors"});
  for (const auto& [name, bits] : original) {
    EXPECT_EQ(got.tensors.at(name).dtype, SafetensorsDtype::kBF16);
    EXPECT_EQ(Halves(got.tensors.at(name).bytes), bits) << name;
  }
  EXPECT_EQ(ExportedConfig(out_).torch_dtype, "bfloat16");
}

// Catches the default taken from torch_dtype (always float32 in a checkpoint) instead of
// trainstep_source_dtype, a missing key not defaulting to float32, and --dtype not winning.
TEST_F(ExportTest, DefaultDtypeIsTheSourceDtype) {
  const std::vector<std::tuple<std::string, std::string, SafetensorsDtype>> cases = {
      {"float16", "", SafetensorsDtype::kF16},
      {"bfloat16", "", SafetensorsDtype::kBF16},
      {"", "", SafetensorsDtype::kF32},
      {"float32", "", SafetensorsDtype::kF32},
      {"bfloat16", "float32", SafetensorsDtype::kF32},
      {"", "float16", SafetensorsDtype::kF16},
  };
  for (const auto& [source, flag, want] : cases) {
    fs::remove_all(ckpt_);
    fs::remove_all(out_);
    WriteCheckpoint(RandomLlamaTensors(5), source);
    ASSERT_TRUE(Export(flag).ok()) << source << " " << flag;
    const Exported got = ReadExport(out_, {"model.safetensors"});
    EXPECT_EQ(got.tensors.at("model.norm.weight").dtype, want) << source << " " << flag;
    const char* want_name = want == SafetensorsDtype::kF32   ? "float32"
                            : want == SafetensorsDtype::kF16 ? "float16"
                                                             : "bfloat16";
    EXPECT_EQ(ExportedConfig(out_).torch_dtype, want_name) << source << " " << flag;
  }
}

// Catches an existing empty --out refused (or a rename that cannot replace it), and a
// trailing slash on --out that would put the temporary directory inside it.
TEST_F(ExportTest, EmptyOutDirAndTrailingSlashes) {
  WriteCheckpoint(RandomLlamaTensors(6), "");
  fs::create_directories(out_);
  ExportOptions options;
  options.checkpoint_dir = ckpt_ + "/";
  options.out_dir = out_ + "//";
  std::ostringstream progress;
  ASSERT_TRUE(ExportCheckpoint(options, progress).ok()) << progress.str();
  EXPECT_EQ(Entries(out_), (std::set<std::string>{"config.json", "model.safetensors"}));
  ExpectNothingLeftBehind({"hf"});
}

// Catches errors that do not name the file at fault, a crash on hostile input, and a failed
// export that leaves --out or its temporary directory behind.
TEST_F(ExportTest, BadCheckpointsAreRefusedNamingTheFile) {
  struct Case {
    std::string what;
    std::function<void()> make;  // breaks the checkpoint written before
    std::string want;            // in the message
  };
  const std::string model = ckpt_ + "/model.safetensors";
  const std::string config = ckpt_ + "/config.json";
  std::vector<Tensor> no_embed = RandomLlamaTensors(7);
  no_embed.erase(no_embed.begin() + 1);
  std::vector<Tensor> with_f64 = RandomLlamaTensors(7);
  with_f64.push_back({"model.extra", SafetensorsDtype::kF64, {1}, std::string(8, '\0')});
  const std::string good = SafetensorsFile(RandomLlamaTensors(7));
  const std::vector<Case> cases = {
      {"no checkpoint", [&] { fs::remove_all(ckpt_); },
       absl::StrCat("checkpoint directory ", ckpt_, " does not exist")},
      {"a file",
       [&] {
         fs::remove_all(ckpt_);
         WriteFile(ckpt_, "x");
       },
       absl::StrCat(ckpt_, " is not a directory")},
      {"no config", [&] { fs::remove(config); },
       absl::StrCat(ckpt_, " is not a llama checkpoint: no config.json")},
      {"config not JSON", [&] { WriteFile(config, "{\"hidden_size\": "); }, config},
      {"config a list", [&] { WriteFile(config, "[1]"); }, config},
      {"config without hidden_size", [&] { WriteFile(config, "{\"vocab_size\": 16}"); },
       absl::StrCat(config, ": hidden_size")},
      {"bad source dtype", [&] { WriteFile(config, ConfigJson("int8")); },
       "trainstep_source_dtype"},
      {"no model", [&] { fs::remove(model); },
       absl::StrCat(ckpt_, " has neither model.safetensors nor model.safetensors.index.json")},
      {"model a directory",
       [&] {
         fs::remove(model);
         fs::create_directory(model);
       },
       absl::StrCat(model, " is not a regular file")},
      {"empty model", [&] { WriteFile(model, ""); }, absl::StrCat(model, " has 0 bytes")},
      {"truncated model", [&] { WriteFile(model, good.substr(0, good.size() - 1)); },
       absl::StrCat(model, ": ")},
      {"huge header length", [&] { WriteFile(model, std::string(8, '\xff') + "{}"); },
       absl::StrCat(model, ": ")},
      {"garbage header", [&] { WriteFile(model, std::string("\x04\0\0\0\0\0\0\0{{{{", 12)); },
       absl::StrCat(model, ": ")},
      {"no embeddings", [&] { WriteFile(model, SafetensorsFile(no_embed)); },
       absl::StrCat(ckpt_, " has no model.embed_tokens.weight")},
      {"F64 tensor", [&] { WriteFile(model, SafetensorsFile(with_f64)); },
       absl::StrCat(model, ": tensor 'model.extra' is F64")},
  };
  for (const Case& c : cases) {
    fs::remove_all(ckpt_);
    WriteCheckpoint(RandomLlamaTensors(7), "");
    c.make();
    const absl::Status s = Export("bfloat16");
    EXPECT_FALSE(s.ok()) << c.what;
    EXPECT_THAT(s.message(), HasSubstr(c.want)) << c.what;
    EXPECT_EQ(progress_.str(), "") << c.what;
    if (c.what == "a file") {
      EXPECT_EQ(Entries(root_), std::set<std::string>{"ckpt-7"}) << c.what;
    } else if (c.what != "no checkpoint") {
      ExpectNothingLeftBehind();
    } else {
      EXPECT_TRUE(Entries(root_).empty()) << c.what;
    }
  }
}

// Catches an export that overwrites or merges into an existing directory, a file taken for a
// directory, a missing parent created silently, and a stale temporary directory deleted.
TEST_F(ExportTest, OutMustBeNewOrEmpty) {
  WriteCheckpoint(RandomLlamaTensors(8), "");
  fs::create_directories(out_);
  WriteFile(out_ + "/keep.txt", "mine");
  absl::Status s = Export();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("--out ", out_, " exists and is not empty")));
  EXPECT_EQ(Entries(out_), std::set<std::string>{"keep.txt"});
  ExpectNothingLeftBehind({"hf"});

  fs::remove_all(out_);
  WriteFile(out_, "a file");
  s = Export();
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("--out ", out_, " exists and is not a dir")));
  EXPECT_EQ(ReadFile(out_), "a file");
  fs::remove(out_);

  const std::string nested = root_ + "/missing/hf";
  ExportOptions options{ckpt_, nested, "", kDefaultMaxShardBytes};
  std::ostringstream progress;
  s = ExportCheckpoint(options, progress);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("--out ", nested, ": its parent directory ",
                                                  root_, "/missing does not exist")));
  ExpectNothingLeftBehind();

  const std::string stale = absl::StrCat(out_, ".tmp-", ::getpid());
  fs::create_directories(stale);
  WriteFile(stale + "/x", "x");
  s = Export();
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(stale, " exists")));
  EXPECT_EQ(Entries(stale), std::set<std::string>{"x"});  // not ours to delete
}

// Fails the n-th Append of the whole export (n >= 1), or the final rename.
class FailingEnv : public EnvWrapper {
 public:
  FailingEnv(int fail_append, bool fail_rename)
      : EnvWrapper(Env::Default()), fail_append_(fail_append), fail_rename_(fail_rename) {}

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = target()->NewWritableFile(path);
    if (!file.ok()) return file;
    return std::unique_ptr<WritableFile>(new File(std::move(*file), this));
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (fail_rename_) return absl::InternalError("rename failed (injected)");
    return target()->RenameFile(from, to);
  }
  int appends() const { return appends_; }

 private:
  class File : public WritableFile {
   public:
    File(std::unique_ptr<WritableFile> f, FailingEnv* env) : f_(std::move(f)), env_(env) {}
    absl::Status Append(std::string_view data) override {
      if (++env_->appends_ == env_->fail_append_) {
        return absl::ResourceExhaustedError("no space left (injected)");
      }
      return f_->Append(data);
    }
    absl::Status Sync() override { return f_->Sync(); }
    absl::Status Close() override { return f_->Close(); }

   private:
    std::unique_ptr<WritableFile> f_;
    FailingEnv* env_;
  };

  const int fail_append_;
  const bool fail_rename_;
  int appends_ = 0;
};

// Catches a failed write or rename that leaves a half-written --out or the temporary
// directory behind, or that reports success.
TEST_F(ExportTest, WriteFailuresLeaveNothingBehind) {
  WriteCheckpoint(RandomLlamaTensors(9), "");
  FailingEnv count(0, false);
  ASSERT_TRUE(Export("bfloat16", 600, &count).ok());
  const int appends = count.appends();
  ASSERT_GT(appends, 5);
  fs::remove_all(out_);
  for (int n = 1; n <= appends; ++n) {
    FailingEnv env(n, false);
    const absl::Status s = Export("bfloat16", 600, &env);
    EXPECT_TRUE(absl::IsResourceExhausted(s)) << n << ": " << s;
    ExpectNothingLeftBehind();
  }
  FailingEnv env(0, true);
  const absl::Status s = Export("bfloat16", 600, &env);
  EXPECT_THAT(s.message(), HasSubstr("rename failed"));
  ExpectNothingLeftBehind();
}

// ---- Through the command line ----

struct CliResult {
  int rc;
  std::string out, err;
};

CliResult Cli(const std::vector<std::string>& args, const ProcessEnvironment& env = {}) {
  std::istringstream in;
  std::ostringstream out, err;
  const int rc = RunCli(args, env, in, out, err);
  return {rc, out.str(), err.str()};
}

// Catches the command wired to the wrong options, a file error reported as usage (or the
// reverse), and credentials checked for a command that never contacts the coordinator.
TEST_F(ExportTest, CommandLine) {
  WriteCheckpoint(RandomLlamaTensors(10), "bfloat16");
  ProcessEnvironment env;
  env.security_env = [](const char* name) {
    return std::string(name) == "TRAINSTEP_TOKEN" ? "token-without-tls" : "";
  };
  CliResult r = Cli(
      {"checkpoint", "export", ckpt_, "--out", out_, "--max-shard-size=1KB", "--dtype", "float16"},
      env);
  EXPECT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("wrote ", out_, "/model-00001-of-00002.safetensors")));
  EXPECT_THAT(r.out, HasSubstr("float16"));
  EXPECT_TRUE(fs::exists(out_ + "/model.safetensors.index.json"));

  r = Cli({"checkpoint", "export", ckpt_, "--out", out_});
  EXPECT_EQ(r.rc, kExitError);
  EXPECT_THAT(r.err, StartsWith("error: --out "));
  EXPECT_EQ(r.out, "");

  r = Cli({"checkpoint", "export", ckpt_, "--out", out_, "--dtype", "int8"});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--dtype must be float32, bfloat16 or float16, got \"int8\""));
}

// ---- An independent check ----

int RunShell(const std::string& command, std::string* output) {
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) output->append(buf, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Catches a conversion that agrees with our own formula but not with PyTorch: a Python script
// parses both files by hand and compares every tensor with torch's .to(dtype) of the input.
TEST_F(ExportTest, TorchAgreesWithEveryTensor) {
  const std::string python = "/usr/bin/python3";
  std::string ignored;
  if (::access(python.c_str(), X_OK) != 0 ||
      RunShell(python + " -c 'import torch'", &ignored) != 0) {
    GTEST_SKIP() << python << " with torch is not available";
  }
  WriteCheckpoint(RandomLlamaTensors(11), "");
  for (const std::string dtype : {"bfloat16", "float16"}) {
    fs::remove_all(out_);
    // Sharded, so that the script reads the index too.
    CliResult r = Cli({"checkpoint", "export", ckpt_, "--out", out_, "--dtype", dtype,
                       "--max-shard-size", "1000"});
    ASSERT_EQ(r.rc, kExitOk) << r.err;
    std::string output;
    const int rc = RunShell(absl::StrCat(python, " ", TRAINSTEP_CLIENT_TEST_DIR,
                                         "/verify_export.py ", ckpt_, " ", out_, " ", dtype),
                            &output);
    EXPECT_EQ(rc, 0) << output;
    EXPECT_THAT(output, HasSubstr("OK: 12 tensors match torch")) << output;
  }
}

}  // namespace
}  // namespace trainstep::client
