#include "core/llama_config.h"

#include <google/protobuf/util/json_util.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace {

namespace pb = ::google::protobuf;

constexpr char kWhere[] = "/models/x/config.json";

// HuggingFaceTB/SmolLM-135M's config.json as published.
constexpr char kSmolLm135M[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "eos_token_id": 0,
  "hidden_act": "silu",
  "hidden_size": 576,
  "initializer_range": 0.02,
  "intermediate_size": 1536,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 9,
  "num_hidden_layers": 30,
  "num_key_value_heads": 3,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "float32",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "vocab_size": 49152
})";

// Qwen/Qwen2.5-0.5B's config.json (sliding_window shortened to show Qwen2 ignores it).
constexpr char kQwen2[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

pb::Struct ParseStruct(absl::string_view json) {
  pb::Struct s;
  const auto status = pb::util::JsonStringToMessage(pb::StringPiece(json.data(), json.size()), &s);
  EXPECT_TRUE(status.ok()) << status.message().as_string() << "\n" << json;
  return s;
}

// SmolLM-135M with `key` set to the JSON value `value_json`.
pb::Struct SmolWith(absl::string_view key, absl::string_view value_json) {
  pb::Struct config = ParseStruct(kSmolLm135M);
  (*config.mutable_fields())[std::string(key)] =
      ParseStruct(absl::StrCat(R"({"v": )", value_json, "}")).fields().at("v");
  return config;
}

pb::Struct SmolWithout(absl::string_view key) {
  pb::Struct config = ParseStruct(kSmolLm135M);
  config.mutable_fields()->erase(std::string(key));
  return config;
}

// The error ParseLlamaConfig gives, or "OK".
std::string ErrorOf(const pb::Struct& config) {
  const auto parsed = ParseLlamaConfig(config, kWhere, nullptr);
  if (parsed.ok()) return "OK";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
  return std::string(parsed.status().message());
}

// Catches: a checkpoint's config.json whose source dtype is lost or misread, so that
// `checkpoint export` would write another dtype than the model came in.
TEST(ParseLlamaConfigTest, SourceDtypeReadAndChecked) {
  const auto c =
      ParseLlamaConfig(SmolWith("trainstep_source_dtype", R"("float16")"), kWhere, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source_dtype, "float16");
  EXPECT_EQ(ParseLlamaConfig(ParseStruct(kSmolLm135M), kWhere, nullptr)->source_dtype, "");
  EXPECT_TRUE(absl::StrContains(ErrorOf(SmolWith("trainstep_source_dtype", R"("int8")")),
                                "trainstep_source_dtype must be float32, bfloat16 or float16"));
  EXPECT_TRUE(absl::StrContains(ErrorOf(SmolWith("trainstep_source_dtype", "3")),
                                "trainstep_source_dtype"));
}

// Catches: a key misread or a real small model refused (e.g. rope_scaling null or
// pretraining_tp 1 treated as unsupported, informational keys warned about).
TEST(ParseLlamaConfigTest, SmolLm135MParses) {
  std::vector<std::string> warnings;
  const auto c = ParseLlamaConfigJson(kSmolLm135M, kWhere, &warnings);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 576);
  EXPECT_EQ(c->intermediate_size, 1536);
  EXPECT_EQ(c->num_hidden_layers, 30);
  EXPECT_EQ(c->num_attention_heads, 9);
  EXPECT_EQ(c->num_key_value_heads, 3);
  EXPECT_EQ(c->vocab_size, 49152);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->torch_dtype, "float32");
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_TRUE(warnings.empty()) << warnings.front();

  // SmolLM2-135M differs in rope_theta.
  const auto smol2 = ParseLlamaConfig(SmolWith("rope_theta", "100000"), kWhere, nullptr);
  ASSERT_TRUE(smol2.ok()) << smol2.status();
  EXPECT_EQ(smol2->rope_theta, 100000.0);
}

// Catches: Qwen2 built without its q/k/v bias (its weights would not load, or load wrongly), or
// with an o_proj bias; its sliding_window (unused without use_sliding_window) refused.
TEST(ParseLlamaConfigTest, Qwen2HasQkvBiasOnly) {
  std::vector<std::string> warnings;
  const auto c = ParseLlamaConfigJson(kQwen2, kWhere, &warnings);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_EQ(c->model_type, "qwen2");
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_TRUE(warnings.empty()) << warnings.front();

  // attention_bias is not read for Qwen2, even when it says otherwise or is not a bool.
  for (const char* attention_bias : {"false", "true", "\"yes\""}) {
    pb::Struct qwen2 = ParseStruct(kQwen2);
    (*qwen2.mutable_fields())["attention_bias"] =
        ParseStruct(absl::StrCat(R"({"v": )", attention_bias, "}")).fields().at("v");
    const auto parsed = ParseLlamaConfig(qwen2, kWhere, nullptr);
    ASSERT_TRUE(parsed.ok()) << attention_bias << ": " << parsed.status();
    EXPECT_TRUE(parsed->qkv_bias);
    EXPECT_FALSE(parsed->o_bias);
  }
}

// Catches: attention_bias ignored for Llama (Llama-2-style checkpoints with biases).
TEST(ParseLlamaConfigTest, AttentionBiasSetsBothBiasesForLlama) {
  const auto c = ParseLlamaConfig(SmolWith("attention_bias", "true"), kWhere, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->o_bias);
}

// Catches: defaults that differ from transformers' (a model trained with the wrong eps or
// theta), num_key_value_heads not defaulting to num_attention_heads (MHA).
TEST(ParseLlamaConfigTest, DefaultsApplied) {
  std::vector<std::string> warnings;
  const auto c = ParseLlamaConfigJson(
      R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": 100})",
      kWhere, &warnings);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->torch_dtype, "");
  EXPECT_TRUE(warnings.empty());
}

// Catches: a missing required key defaulted to 0 (a division by zero later) or to a guess.
TEST(ParseLlamaConfigTest, MissingRequiredKey) {
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "vocab_size"}) {
    EXPECT_EQ(ErrorOf(SmolWithout(key)), absl::StrCat(kWhere, ": ", key, " is required"));
  }
}

// Catches: "64" read as 64, 64.5 truncated, true read as 1, null read as 0; a message that does
// not say which key or what it got.
TEST(ParseLlamaConfigTest, WrongTypesNameTheKey) {
  struct Case {
    const char* key;
    const char* value;
    const char* message;
  };
  const Case cases[] = {
      {"hidden_size", R"("576")", R"(hidden_size must be an integer, got the string "576")"},
      {"hidden_size", "576.5", "hidden_size must be an integer, got 576.5"},
      {"num_hidden_layers", "null", "num_hidden_layers must be an integer, got null"},
      {"vocab_size", "true", "vocab_size must be an integer, got true"},
      {"num_key_value_heads", "[3]", "num_key_value_heads must be an integer, got a list"},
      {"max_position_embeddings", "{}", "max_position_embeddings must be an integer, got an obj"},
      {"rms_norm_eps", R"("1e-5")", R"(rms_norm_eps must be a number, got the string "1e-5")"},
      {"rope_theta", "null", "rope_theta must be a number, got null"},
      {"tie_word_embeddings", R"("true")", "tie_word_embeddings must be true or false"},
      {"tie_word_embeddings", "1", "tie_word_embeddings must be true or false, got 1"},
      {"attention_bias", "0", "attention_bias must be true or false, got 0"},
      {"model_type", "2", "model_type must be a string, got 2"},
      {"torch_dtype", "16", "torch_dtype must be a string, got 16"},
      {"mlp_bias", "0", "mlp_bias must be true or false, got 0"},
      {"use_sliding_window", "null", "use_sliding_window must be true or false, got null"},
      {"pretraining_tp", R"("1")", "pretraining_tp must be an integer"},
      {"head_dim", "64.5", "head_dim must be an integer, got 64.5"},
      {"attention_dropout", R"("0")", "attention_dropout must be a number"},
      {"sliding_window", R"("4096")", "sliding_window must be an integer"},
  };
  for (const Case& c : cases) {
    const std::string error = ErrorOf(SmolWith(c.key, c.value));
    EXPECT_EQ(error.find(absl::StrCat(kWhere, ": ", c.message)), 0u)
        << c.key << "=" << c.value << ": " << error;
  }
}

// Catches: zero or negative sizes (division by zero, negative allocations), absurd sizes that
// overflow element counts, a double out of int64's range converted (undefined behaviour), an
// eps or theta that makes RMSNorm or RoPE meaningless. Each message gives range and value.
TEST(ParseLlamaConfigTest, OutOfRange) {
  struct Case {
    const char* key;
    const char* value;
    const char* message;
  };
  const Case cases[] = {
      {"hidden_size", "0", "hidden_size must be from 1 to 1000000, got 0"},
      {"hidden_size", "-576", "hidden_size must be from 1 to 1000000, got -576"},
      {"intermediate_size", "1000001", "intermediate_size must be from 1 to 1000000, got 1000001"},
      {"num_hidden_layers", "10001", "num_hidden_layers must be from 1 to 10000, got 10001"},
      {"num_attention_heads", "1e300", "num_attention_heads must be from 1 to 10000, got 1e+300"},
      {"num_key_value_heads", "0", "num_key_value_heads must be from 1 to 10000, got 0"},
      {"vocab_size", "1", "vocab_size must be from 2 to 10000000, got 1"},
      {"vocab_size", "9.3e18", "vocab_size must be from 2 to 10000000, got 9.3e+18"},
      {"max_position_embeddings", "0", "max_position_embeddings must be from 1 to 10000000, got 0"},
      {"rms_norm_eps", "0", "rms_norm_eps must be greater than 0 and less than 1, got 0"},
      {"rms_norm_eps", "1", "rms_norm_eps must be greater than 0 and less than 1, got 1"},
      {"rms_norm_eps", "-1e-5", "rms_norm_eps must be greater than 0 and less than 1, got -1e-05"},
      {"rope_theta", "0", "rope_theta must be a finite number greater than 0, got 0"},
      {"rope_theta", "-10000", "rope_theta must be a finite number greater than 0, got -10000"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ErrorOf(SmolWith(c.key, c.value)), absl::StrCat(kWhere, ": ", c.message))
        << c.key << "=" << c.value;
  }
}

// Catches: NaN or infinity in a Struct built in code (JSON cannot carry them) slipping through
// comparisons that are false for NaN.
TEST(ParseLlamaConfigTest, NonFiniteNumbersInStruct) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const char* key : {"hidden_size", "rms_norm_eps", "rope_theta", "head_dim",
                          "attention_dropout", "pretraining_tp", "sliding_window"}) {
    for (double v : {nan, inf, -inf}) {
      pb::Struct config = ParseStruct(kSmolLm135M);
      (*config.mutable_fields())[key].set_number_value(v);
      const std::string error = ErrorOf(config);
      EXPECT_TRUE(absl::StartsWith(error, absl::StrCat(kWhere, ": ", key, " "))) << error;
    }
  }
  // A Value with no kind set (possible only in code) is not mistaken for a number.
  pb::Struct config = ParseStruct(kSmolLm135M);
  (*config.mutable_fields())["hidden_size"] = pb::Value();
  EXPECT_EQ(ErrorOf(config),
            absl::StrCat(kWhere, ": hidden_size must be an integer, got no value"));
}

// Catches: shapes whose attention heads do not split the hidden size, GQA groups that do not
// divide, odd head dims that RoPE cannot pair; each message names both keys and values.
TEST(ParseLlamaConfigTest, DivisibilityErrors) {
  EXPECT_EQ(
      ErrorOf(SmolWith("num_attention_heads", "7")),
      absl::StrCat(kWhere, ": hidden_size (576) must be divisible by num_attention_heads (7)"));
  EXPECT_EQ(ErrorOf(SmolWith("num_key_value_heads", "2")),
            absl::StrCat(kWhere,
                         ": num_attention_heads (9) must be divisible by num_key_value_heads (2)"));
  EXPECT_EQ(ErrorOf(SmolWith("num_key_value_heads", "18")),
            absl::StrCat(
                kWhere, ": num_attention_heads (9) must be divisible by num_key_value_heads (18)"));
  pb::Struct odd = SmolWith("hidden_size", "567");  // 567 / 9 = 63
  EXPECT_EQ(ErrorOf(odd), absl::StrCat(kWhere,
                                       ": hidden_size (567) / num_attention_heads (9) = 63 must be "
                                       "even: rotary embeddings rotate pairs of dimensions"));
}

// Catches: a config silently trained as something else than transformers computes (Llama 3.1's
// rope_scaling, GELU, Mistral's sliding window, a Mistral-Nemo-style head_dim...). Each error
// names the key and its value.
TEST(ParseLlamaConfigTest, UnsupportedKeysAreErrors) {
  struct Case {
    const char* key;
    const char* value;
    const char* spelled;  // how the message shows the value
  };
  const Case cases[] = {
      {"hidden_act", R"("gelu")", R"("gelu")"},
      {"hidden_act", "null", "null"},
      {"hidden_activation", R"("gelu_pytorch_tanh")", R"("gelu_pytorch_tanh")"},
      {"rope_scaling", R"({"rope_type": "llama3", "factor": 8.0})",
       R"({"rope_type": "llama3", ...})"},
      {"rope_scaling", R"({"type": "linear", "factor": 2.0})", R"({"type": "linear", ...})"},
      {"rope_scaling", R"({"factor": 2.0})", "an object"},
      {"mlp_bias", "true", "true"},
      {"pretraining_tp", "2", "2"},
      {"head_dim", "128", "128"},
      {"use_sliding_window", "true", "true"},
      {"attention_dropout", "0.1", "0.1"},
      {"sliding_window", "1024", "1024"},
      {"rope_type", R"("yarn")", R"("yarn")"},
      {"partial_rotary_factor", "0.5", "0.5"},
  };
  for (const Case& c : cases) {
    const std::string error = ErrorOf(SmolWith(c.key, c.value));
    EXPECT_TRUE(absl::StartsWith(
        error, absl::StrCat(kWhere, ": ", c.key, " ", c.spelled, " is not supported (only ")))
        << c.key << "=" << c.value << ": " << error;
  }
  EXPECT_EQ(ErrorOf(SmolWith("head_dim", "128")),
            absl::StrCat(kWhere,
                         ": head_dim 128 is not supported (only hidden_size / "
                         "num_attention_heads = 576 / 9 = 64)"));
  EXPECT_EQ(ErrorOf(SmolWith("sliding_window", "1024")),
            absl::StrCat(kWhere,
                         ": sliding_window 1024 is not supported (only null or at least "
                         "max_position_embeddings (2048))"));
}

// Catches: the supported spellings of those keys refused (they appear in real configs).
TEST(ParseLlamaConfigTest, SupportedValuesOfCheckedKeysAccepted) {
  const std::pair<const char*, const char*> cases[] = {
      {"hidden_activation", R"("silu")"},
      {"mlp_bias", "false"},
      {"pretraining_tp", "1"},
      {"head_dim", "64"},
      {"head_dim", "null"},
      {"use_sliding_window", "false"},
      {"attention_dropout", "0"},
      {"sliding_window", "null"},
      {"sliding_window", "2048"},
      {"sliding_window", "4096"},
      {"rope_type", R"("default")"},
      {"partial_rotary_factor", "1.0"},
      {"rope_type", "null"},
      {"torch_dtype", "null"},
      {"eos_token_id", "[1, 2]"},
  };
  for (const auto& [key, value] : cases) {
    std::vector<std::string> warnings;
    const auto c = ParseLlamaConfig(SmolWith(key, value), kWhere, &warnings);
    EXPECT_TRUE(c.ok()) << key << "=" << value << ": " << c.status();
    EXPECT_TRUE(warnings.empty()) << key << ": " << warnings.front();
  }
  // Mistral honours sliding_window: the same window as Qwen2's ignored one is refused.
  pb::Struct mistral = ParseStruct(kQwen2);
  (*mistral.mutable_fields())["model_type"].set_string_value("mistral");
  EXPECT_EQ(ErrorOf(mistral),
            absl::StrCat(kWhere,
                         ": sliding_window 4096 is not supported (only null or at least "
                         "max_position_embeddings (32768))"));
}

// Catches: an unknown key refused (new transformers versions add keys), or ignored without a
// word (a key that matters would go unnoticed); a hostile file flooding the log.
TEST(ParseLlamaConfigTest, UnknownKeyWarns) {
  std::vector<std::string> warnings;
  const auto c = ParseLlamaConfig(SmolWith("num_experts", "8"), kWhere, &warnings);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], absl::StrCat(kWhere, ": unknown key 'num_experts' ignored"));

  // A null warnings pointer is allowed.
  EXPECT_TRUE(ParseLlamaConfig(SmolWith("num_experts", "8"), kWhere, nullptr).ok());

  // Many unknown keys: the first 32 by name, then a count; control characters escaped.
  pb::Struct many = ParseStruct(kSmolLm135M);
  for (int i = 0; i < 1000; ++i) {
    (*many.mutable_fields())[absl::StrCat("k\n", 1000 + i)].set_bool_value(true);
  }
  warnings.clear();
  ASSERT_TRUE(ParseLlamaConfig(many, kWhere, &warnings).ok());
  ASSERT_EQ(warnings.size(), 33u);
  EXPECT_EQ(warnings[0], absl::StrCat(kWhere, ": unknown key 'k\\n1000' ignored"));
  EXPECT_EQ(warnings[31], absl::StrCat(kWhere, ": unknown key 'k\\n1031' ignored"));
  EXPECT_EQ(warnings[32], absl::StrCat(kWhere, ": 968 more unknown keys ignored"));

  // Warnings are added only when the config is accepted.
  pb::Struct bad = SmolWith("num_experts", "8");
  bad.mutable_fields()->erase("vocab_size");
  warnings.clear();
  EXPECT_FALSE(ParseLlamaConfig(bad, kWhere, &warnings).ok());
  EXPECT_TRUE(warnings.empty());
}

// Catches: an unknown architecture refused, or built as Llama without a word.
TEST(ParseLlamaConfigTest, UnknownModelTypeWarnsAndIsTreatedAsLlama) {
  std::vector<std::string> warnings;
  const auto c = ParseLlamaConfig(SmolWith("model_type", R"("smollm")"), kWhere, &warnings);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "smollm");
  EXPECT_FALSE(c->qkv_bias);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], absl::StrCat(kWhere, R"(: model_type "smollm" is not llama, mistral or )"
                                              "qwen2; treated as llama"));
  warnings.clear();
  ASSERT_TRUE(ParseLlamaConfig(SmolWith("model_type", R"("mistral")"), kWhere, &warnings).ok());
  EXPECT_TRUE(warnings.empty());
}

// Catches: a stack overflow or quadratic time on a hostile file of nested brackets; brackets
// inside strings counted as nesting.
TEST(ParseLlamaConfigJsonTest, DeepNestingRejectedFast) {
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& json :
       {std::string(100000, '['), absl::StrCat("{\"a\": ", std::string(100000, '['), "}"),
        absl::StrCat("{\"a\": ", std::string(100000, '{'), "}")}) {
    const auto parsed = ParseLlamaConfigJson(json, kWhere, nullptr);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(
        parsed.status().message(),
        absl::StrCat(kWhere, ": not valid config JSON: JSON nests deeper than 32")))
        << parsed.status();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));

  // Brackets in a string are not nesting; 32 levels of objects (the deepest protobuf decodes)
  // are allowed, 33 are not.
  auto nested = [](int levels) {
    std::string value = "1";
    for (int i = 1; i < levels; ++i) value = absl::StrCat(R"({"a": )", value, "}");
    std::string json(kSmolLm135M);
    json.insert(json.rfind('}'), absl::StrCat(R"(, "_name_or_path": ")", std::string(1000, '['),
                                              R"(\"[", "x": )", value));
    return json;
  };
  EXPECT_TRUE(
      absl::StartsWith(ParseLlamaConfigJson(nested(33), kWhere, nullptr).status().message(),
                       absl::StrCat(kWhere, ": not valid config JSON: JSON nests deeper than 32")));
  std::vector<std::string> warnings;
  const auto parsed = ParseLlamaConfigJson(nested(32), kWhere, &warnings);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(warnings, std::vector<std::string>{absl::StrCat(kWhere, ": unknown key 'x' ignored")});
}

// Catches: a file that is not an object (or not JSON) crashing, or reaching the key checks
// with a confusing "hidden_size is required"; messages that do not name the file.
TEST(ParseLlamaConfigJsonTest, NotAnObjectOrInvalid) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "expected an object, got nothing"},
      {"  \n", "expected an object, got nothing"},
      {"[1, 2]", "expected an object, got a list"},
      {"\"config\"", "expected an object, got a string"},
      {"42", "expected an object, got a number"},
      {"null", "expected an object, got null"},
      {"true", "expected an object, got a boolean"},
      {"<html>", "expected an object, got not JSON"},
      {R"({"hidden_size": 576)", ""},
      {R"({"hidden_size": 576} trailing)", ""},
      {"{\"hidden_size\": \"\xff\"}", ""},
  };
  for (const auto& [json, what] : cases) {
    const auto parsed = ParseLlamaConfigJson(json, kWhere, nullptr);
    ASSERT_FALSE(parsed.ok()) << json;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(parsed.status().message(),
                                 absl::StrCat(kWhere, ": not valid config JSON: ", what)))
        << json << ": " << parsed.status();
  }
  // A byte-order mark (some editors write one) is skipped.
  EXPECT_TRUE(
      ParseLlamaConfigJson(absl::StrCat("\xEF\xBB\xBF", kSmolLm135M), kWhere, nullptr).ok());
}

// Catches: a written config.json that does not read back to the model trained (biases lost
// for Qwen2 or attention_bias Llama, torch_dtype ignored), or unstable output (unsorted keys).
TEST(LlamaConfigJsonTest, RoundTrips) {
  std::vector<LlamaConfig> configs;
  for (const pb::Struct& s :
       {ParseStruct(kSmolLm135M), ParseStruct(kQwen2), SmolWith("attention_bias", "true"),
        SmolWith("model_type", R"("mistral")"), SmolWith("model_type", R"("other")"),
        SmolWithout("torch_dtype"), SmolWith("rms_norm_eps", "1.0000000000000002e-06"),
        SmolWith("trainstep_source_dtype", R"("bfloat16")")}) {
    const auto c = ParseLlamaConfig(s, kWhere, nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    configs.push_back(*c);
  }
  for (const LlamaConfig& c : configs) {
    for (const std::string& dtype : {c.torch_dtype, std::string("bfloat16")}) {
      const std::string json = LlamaConfigJson(c, dtype);
      std::vector<std::string> warnings;
      const auto back = ParseLlamaConfigJson(json, kWhere, &warnings);
      ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
      LlamaConfig expected = c;
      expected.torch_dtype = dtype;
      EXPECT_TRUE(*back == expected) << json;
      EXPECT_TRUE(warnings.empty() || c.model_type == "other") << json;
      EXPECT_EQ(json.back(), '\n');
    }
    // The Struct for a job spec reads back too.
    const auto from_struct = ParseLlamaConfig(LlamaConfigStruct(c), kWhere, nullptr);
    ASSERT_TRUE(from_struct.ok()) << from_struct.status();
    EXPECT_TRUE(*from_struct == c);
  }
  EXPECT_TRUE(configs[0] != configs[1]);

  // The exact text: sorted keys, two-space indent, numbers as JSON writes them.
  EXPECT_EQ(LlamaConfigJson(configs[1], "float32"), R"({
  "architectures": [
    "Qwen2ForCausalLM"
  ],
  "hidden_act": "silu",
  "hidden_size": 896,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "tie_word_embeddings": true,
  "torch_dtype": "float32",
  "vocab_size": 151936
}
)");
  const std::string smol = LlamaConfigJson(configs[0], "");
  EXPECT_NE(smol.find(R"(  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
)"),
            std::string::npos)
      << smol;
  EXPECT_EQ(smol.find("torch_dtype"), std::string::npos) << smol;
}

}  // namespace
}  // namespace trainstep
