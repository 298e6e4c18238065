#include "core/llama_config.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/json_nesting.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace trainstep {
namespace {

namespace pb = ::google::protobuf;

// Far above any real model, far below where int64 products (weights' element counts) overflow.
constexpr int64_t kMaxWidth = 1'000'000;
constexpr int64_t kMaxLayersOrHeads = 10'000;
constexpr int64_t kMaxVocab = 10'000'000;
constexpr int64_t kMaxPositions = 10'000'000;
// A config.json nests two or three levels. Protobuf decodes a Struct 3 messages deep per JSON
// object level under a limit of 100, so deeper files would fail there with a cryptic message.
constexpr int kMaxJsonDepth = 32;
// A hostile file with a million unknown keys must not write a million log lines.
constexpr size_t kMaxUnknownKeyWarnings = 32;
constexpr size_t kMaxQuotedBytes = 64;

// Keys read into LlamaConfig, keys checked for values trainstep cannot compute, and keys that
// say nothing about the computation. Anything else is warned about.
constexpr absl::string_view kKnownKeys[] = {
    // Read.
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
    "tie_word_embeddings", "attention_bias", "model_type", "torch_dtype", "dtype", kSourceDtypeKey,
    // Checked.
    "hidden_act", "hidden_activation", "rope_scaling", "mlp_bias", "pretraining_tp", "head_dim",
    "use_sliding_window", "attention_dropout", "sliding_window", "rope_type",
    "partial_rotary_factor",
    // Informational.
    "architectures", "bos_token_id", "eos_token_id", "pad_token_id", "use_cache",
    "initializer_range", "transformers_version", "max_window_layers", "_name_or_path",
    "output_attentions", "output_hidden_states", "return_dict", "torchscript", "is_decoder"};

bool IsKnownKey(absl::string_view key) {
  return std::find(std::begin(kKnownKeys), std::end(kKnownKeys), key) != std::end(kKnownKeys);
}

// The shortest decimal that reads back as the same double ("1e-05", not 1.0000000000000001e-05).
std::string ShortestDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  for (int precision = 15; precision <= 17; ++precision) {
    std::string s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

// A user's string in a message: escaped, and cut short so that a hostile value cannot flood a log.
std::string Escape(absl::string_view s) {
  std::string out = absl::CEscape(s.substr(0, kMaxQuotedBytes));
  if (s.size() > kMaxQuotedBytes) out += "...";
  return out;
}

std::string Quote(absl::string_view s) { return absl::StrCat("\"", Escape(s), "\""); }

// A value as an error message shows it: the string "64", 64.5, null, an object.
std::string Describe(const pb::Value& v) {
  switch (v.kind_case()) {
    case pb::Value::kNullValue:
      return "null";
    case pb::Value::kNumberValue:
      return ShortestDouble(v.number_value());
    case pb::Value::kStringValue:
      return absl::StrCat("the string ", Quote(v.string_value()));
    case pb::Value::kBoolValue:
      return v.bool_value() ? "true" : "false";
    case pb::Value::kStructValue:
      return "an object";
    case pb::Value::kListValue:
      return "a list";
    default:
      return "no value";
  }
}

// A value as an "is not supported" message shows it, the way the file spells it where short.
std::string Spell(const pb::Value& v) {
  switch (v.kind_case()) {
    case pb::Value::kStringValue:
      return Quote(v.string_value());
    case pb::Value::kStructValue: {
      // rope_scaling's kind is what a user needs to see ("llama3", "yarn", "linear").
      for (absl::string_view key : {"rope_type", "type"}) {
        const auto it = v.struct_value().fields().find(std::string(key));
        if (it != v.struct_value().fields().end()) {
          const pb::Value& kind = it->second;
          return absl::StrCat("{\"", key, "\": ",
                              kind.kind_case() == pb::Value::kStringValue
                                  ? Quote(kind.string_value())
                                  : Describe(kind),
                              ", ...}");
        }
      }
      return "an object";
    }
    default:
      return Describe(v);
  }
}

bool IsNull(const pb::Value& v) {
  return v.kind_case() == pb::Value::kNullValue || v.kind_case() == pb::Value::KIND_NOT_SET;
}

// config.json's keys, read with the errors ParseLlamaConfig promises: "<where>: <key> ...".
class Fields {
 public:
  Fields(const pb::Struct& config, absl::string_view where) : config_(config), where_(where) {}

  // Null if the key is absent.
  const pb::Value* Find(absl::string_view key) const {
    const auto it = config_.fields().find(std::string(key));
    return it == config_.fields().end() ? nullptr : &it->second;
  }

  absl::Status Error(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", key, " ", what));
  }

  absl::Status Unsupported(absl::string_view key, const pb::Value& v,
                           absl::string_view supported) const {
    return Error(key, absl::StrCat(Spell(v), " is not supported (only ", supported, ")"));
  }

  // A JSON number with an integral value; returned as a double so that huge ones compare safely.
  absl::StatusOr<double> Integral(absl::string_view key, const pb::Value& v) const {
    const double d = v.kind_case() == pb::Value::kNumberValue ? v.number_value() : 0.5;
    if (!std::isfinite(d) || d != std::floor(d)) {
      return Error(key, absl::StrCat("must be an integer, got ", Describe(v)));
    }
    return d;
  }

  // An integer in [lo, hi]; `fallback` if absent, or an error if there is none.
  absl::StatusOr<int64_t> Int(absl::string_view key, int64_t lo, int64_t hi,
                              std::optional<int64_t> fallback) const {
    const pb::Value* v = Find(key);
    if (v == nullptr) {
      if (fallback.has_value()) return *fallback;
      return Error(key, "is required");
    }
    ASSIGN_OR_RETURN(const double d, Integral(key, *v));
    // Compared as doubles: the cast below is defined only for values in range.
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi)) {
      return Error(key, absl::StrCat("must be from ", lo, " to ", hi, ", got ", ShortestDouble(d)));
    }
    return static_cast<int64_t>(d);
  }

  // A JSON number (its range is the caller's to check); `fallback` if absent.
  absl::StatusOr<double> Number(absl::string_view key, double fallback) const {
    const pb::Value* v = Find(key);
    if (v == nullptr) return fallback;
    if (v->kind_case() != pb::Value::kNumberValue) {
      return Error(key, absl::StrCat("must be a number, got ", Describe(*v)));
    }
    return v->number_value();
  }

  absl::StatusOr<bool> Bool(absl::string_view key, bool fallback) const {
    const pb::Value* v = Find(key);
    if (v == nullptr) return fallback;
    if (v->kind_case() != pb::Value::kBoolValue) {
      return Error(key, absl::StrCat("must be true or false, got ", Describe(*v)));
    }
    return v->bool_value();
  }

  // A string; `fallback` if absent, or if null and `null_is_absent`.
  absl::StatusOr<std::string> String(absl::string_view key, absl::string_view fallback,
                                     bool null_is_absent) const {
    const pb::Value* v = Find(key);
    if (v == nullptr || (null_is_absent && IsNull(*v))) return std::string(fallback);
    if (v->kind_case() != pb::Value::kStringValue) {
      return Error(key, absl::StrCat("must be a string, got ", Describe(*v)));
    }
    return v->string_value();
  }

 private:
  const pb::Struct& config_;
  const absl::string_view where_;
};

// The keys whose values would make Hugging Face compute something trainstep does not.
absl::Status CheckUnsupported(const Fields& f, const LlamaConfig& c) {
  for (absl::string_view key : {"hidden_act", "hidden_activation"}) {
    const pb::Value* v = f.Find(key);
    if (v != nullptr &&
        !(v->kind_case() == pb::Value::kStringValue && v->string_value() == "silu")) {
      return f.Unsupported(key, *v, "\"silu\": the SwiGLU MLP");
    }
  }
  if (const pb::Value* v = f.Find("rope_scaling"); v != nullptr && !IsNull(*v)) {
    return f.Unsupported("rope_scaling", *v, "null: no RoPE scaling");
  }
  ASSIGN_OR_RETURN(const bool mlp_bias, f.Bool("mlp_bias", false));
  if (mlp_bias) return f.Unsupported("mlp_bias", *f.Find("mlp_bias"), "false");
  if (const pb::Value* v = f.Find("pretraining_tp"); v != nullptr) {
    ASSIGN_OR_RETURN(const double tp, f.Integral("pretraining_tp", *v));
    if (tp != 1) return f.Unsupported("pretraining_tp", *v, "1");
  }
  // Null is what transformers writes when head_dim is derived, as trainstep derives it.
  if (const pb::Value* v = f.Find("head_dim"); v != nullptr && !IsNull(*v)) {
    ASSIGN_OR_RETURN(const double head_dim, f.Integral("head_dim", *v));
    if (head_dim != static_cast<double>(c.head_dim())) {
      return f.Unsupported("head_dim", *v,
                           absl::StrCat("hidden_size / num_attention_heads = ", c.hidden_size,
                                        " / ", c.num_attention_heads, " = ", c.head_dim()));
    }
  }
  ASSIGN_OR_RETURN(const bool use_sliding_window, f.Bool("use_sliding_window", false));
  if (use_sliding_window) {
    return f.Unsupported("use_sliding_window", *f.Find("use_sliding_window"),
                         "false: full causal attention");
  }
  ASSIGN_OR_RETURN(const double attention_dropout, f.Number("attention_dropout", 0.0));
  if (attention_dropout != 0) {
    return f.Unsupported("attention_dropout", *f.Find("attention_dropout"), "0");
  }
  // Qwen2 reads sliding_window only under use_sliding_window (refused above); Mistral always
  // does, and a window at least as long as the context changes nothing.
  if (const pb::Value* v = f.Find("sliding_window");
      v != nullptr && !IsNull(*v) && c.model_type != "qwen2") {
    ASSIGN_OR_RETURN(const double window, f.Integral("sliding_window", *v));
    if (window < static_cast<double>(c.max_position_embeddings)) {
      return f.Unsupported("sliding_window", *v,
                           absl::StrCat("null or at least max_position_embeddings (",
                                        c.max_position_embeddings, ")"));
    }
  }
  if (const pb::Value* v = f.Find("rope_type"); v != nullptr && !IsNull(*v)) {
    if (!(v->kind_case() == pb::Value::kStringValue && v->string_value() == "default")) {
      return f.Unsupported("rope_type", *v, "\"default\"");
    }
  }
  if (const pb::Value* v = f.Find("partial_rotary_factor"); v != nullptr && !IsNull(*v)) {
    if (!(v->kind_case() == pb::Value::kNumberValue && v->number_value() == 1.0)) {
      return f.Unsupported("partial_rotary_factor", *v, "1.0: rotary on the whole head");
    }
  }
  return absl::OkStatus();
}

// What a JSON document that is not an object holds, in words.
std::string DescribeJsonStart(absl::string_view json) {
  if (json.empty()) return "nothing";
  switch (json.front()) {
    case '[':
      return "a list";
    case '"':
    case '\'':
      return "a string";
    case 'n':
      return "null";
    case 't':
    case 'f':
      return "a boolean";
    default:
      return (json.front() == '-' || (json.front() >= '0' && json.front() <= '9')) ? "a number"
                                                                                   : "not JSON";
  }
}

// Numbers as ShortestDouble writes them, except that JSON has no NaN or infinity.
void AppendJson(const pb::Value& v, int indent, std::string* out) {
  const std::string inner(indent + 2, ' ');
  switch (v.kind_case()) {
    case pb::Value::kNumberValue:
      out->append(std::isfinite(v.number_value()) ? ShortestDouble(v.number_value()) : "null");
      break;
    case pb::Value::kStringValue:
      out->append(JsonQuote(v.string_value()));
      break;
    case pb::Value::kBoolValue:
      out->append(v.bool_value() ? "true" : "false");
      break;
    case pb::Value::kListValue: {
      if (v.list_value().values().empty()) {
        out->append("[]");
        break;
      }
      out->append("[");
      const char* separator = "\n";
      for (const pb::Value& item : v.list_value().values()) {
        absl::StrAppend(out, separator, inner);
        AppendJson(item, indent + 2, out);
        separator = ",\n";
      }
      absl::StrAppend(out, "\n", std::string(indent, ' '), "]");
      break;
    }
    case pb::Value::kStructValue: {
      // Sorted: protobuf's map order is unspecified, and a written file should not churn.
      std::vector<const std::string*> keys;
      for (const auto& [key, unused] : v.struct_value().fields()) keys.push_back(&key);
      std::sort(keys.begin(), keys.end(),
                [](const std::string* a, const std::string* b) { return *a < *b; });
      if (keys.empty()) {
        out->append("{}");
        break;
      }
      out->append("{");
      const char* separator = "\n";
      for (const std::string* key : keys) {
        absl::StrAppend(out, separator, inner, JsonQuote(*key), ": ");
        AppendJson(v.struct_value().fields().at(*key), indent + 2, out);
        separator = ",\n";
      }
      absl::StrAppend(out, "\n", std::string(indent, ' '), "}");
      break;
    }
    default:
      out->append("null");
      break;
  }
}

}  // namespace

bool operator==(const LlamaConfig& a, const LlamaConfig& b) {
  return a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
         a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads && a.vocab_size == b.vocab_size &&
         a.max_position_embeddings == b.max_position_embeddings &&
         a.rms_norm_eps == b.rms_norm_eps && a.rope_theta == b.rope_theta &&
         a.tie_word_embeddings == b.tie_word_embeddings && a.qkv_bias == b.qkv_bias &&
         a.o_bias == b.o_bias && a.model_type == b.model_type && a.torch_dtype == b.torch_dtype &&
         a.source_dtype == b.source_dtype;
}

absl::StatusOr<LlamaConfig> ParseLlamaConfig(const pb::Struct& config, absl::string_view where,
                                             std::vector<std::string>* warnings) {
  const Fields f(config, where);
  LlamaConfig c;
  ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size", 1, kMaxWidth, std::nullopt));
  ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size", 1, kMaxWidth, std::nullopt));
  ASSIGN_OR_RETURN(c.num_hidden_layers,
                   f.Int("num_hidden_layers", 1, kMaxLayersOrHeads, std::nullopt));
  ASSIGN_OR_RETURN(c.num_attention_heads,
                   f.Int("num_attention_heads", 1, kMaxLayersOrHeads, std::nullopt));
  ASSIGN_OR_RETURN(c.num_key_value_heads,
                   f.Int("num_key_value_heads", 1, kMaxLayersOrHeads, c.num_attention_heads));
  ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size", 2, kMaxVocab, std::nullopt));
  ASSIGN_OR_RETURN(c.max_position_embeddings,
                   f.Int("max_position_embeddings", 1, kMaxPositions, c.max_position_embeddings));
  ASSIGN_OR_RETURN(c.rms_norm_eps, f.Number("rms_norm_eps", c.rms_norm_eps));
  if (!(c.rms_norm_eps > 0 && c.rms_norm_eps < 1)) {
    return f.Error("rms_norm_eps", absl::StrCat("must be greater than 0 and less than 1, got ",
                                                ShortestDouble(c.rms_norm_eps)));
  }
  ASSIGN_OR_RETURN(c.rope_theta, f.Number("rope_theta", c.rope_theta));
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 0)) {
    return f.Error("rope_theta", absl::StrCat("must be a finite number greater than 0, got ",
                                              ShortestDouble(c.rope_theta)));
  }
  ASSIGN_OR_RETURN(c.tie_word_embeddings, f.Bool("tie_word_embeddings", false));
  ASSIGN_OR_RETURN(c.model_type, f.String("model_type", c.model_type, /*null_is_absent=*/false));
  // Informational, so a null (or transformers >= 4.56's "dtype" instead) is no reason to refuse.
  if (f.Find("torch_dtype") != nullptr || f.Find("dtype") == nullptr) {
    ASSIGN_OR_RETURN(c.torch_dtype, f.String("torch_dtype", "", /*null_is_absent=*/true));
  } else {
    ASSIGN_OR_RETURN(c.torch_dtype, f.String("dtype", "", /*null_is_absent=*/true));
  }
  ASSIGN_OR_RETURN(c.source_dtype, f.String(kSourceDtypeKey, "", /*null_is_absent=*/true));
  if (!c.source_dtype.empty() && c.source_dtype != "float32" && c.source_dtype != "bfloat16" &&
      c.source_dtype != "float16") {
    return f.Error(kSourceDtypeKey, absl::StrCat("must be float32, bfloat16 or float16, got ",
                                                 Quote(c.source_dtype)));
  }

  if (c.model_type == "qwen2") {
    // Qwen2's modelling code hardcodes a bias on q/k/v and none on o_proj; its configs carry no
    // attention_bias, and one that does is not read by transformers either.
    c.qkv_bias = true;
    c.o_bias = false;
  } else {
    ASSIGN_OR_RETURN(const bool attention_bias, f.Bool("attention_bias", false));
    c.qkv_bias = c.o_bias = attention_bias;
  }

  if (c.hidden_size % c.num_attention_heads != 0) {
    return f.Error("hidden_size",
                   absl::StrCat("(", c.hidden_size, ") must be divisible by num_attention_heads (",
                                c.num_attention_heads, ")"));
  }
  // Grouped-query attention: each key/value head serves the same number of query heads.
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return f.Error(
        "num_attention_heads",
        absl::StrCat("(", c.num_attention_heads, ") must be divisible by num_key_value_heads (",
                     c.num_key_value_heads, ")"));
  }
  // Rotary embeddings rotate the two halves of each head against each other.
  if (c.head_dim() % 2 != 0) {
    return f.Error("hidden_size",
                   absl::StrCat("(", c.hidden_size, ") / num_attention_heads (",
                                c.num_attention_heads, ") = ", c.head_dim(),
                                " must be even: rotary embeddings rotate pairs of dimensions"));
  }
  RETURN_IF_ERROR(CheckUnsupported(f, c));

  if (warnings != nullptr) {
    if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2") {
      warnings->push_back(absl::StrCat(where, ": model_type ", Quote(c.model_type),
                                       " is not llama, mistral or qwen2; treated as llama"));
    }
    std::vector<const std::string*> unknown;
    for (const auto& [key, unused] : config.fields()) {
      if (!IsKnownKey(key)) unknown.push_back(&key);
    }
    // Sorted: protobuf's map order is unspecified, and the same file should warn the same way.
    std::sort(unknown.begin(), unknown.end(),
              [](const std::string* a, const std::string* b) { return *a < *b; });
    for (size_t i = 0; i < unknown.size() && i < kMaxUnknownKeyWarnings; ++i) {
      warnings->push_back(absl::StrCat(where, ": unknown key '", Escape(*unknown[i]), "' ignored"));
    }
    if (unknown.size() > kMaxUnknownKeyWarnings) {
      warnings->push_back(absl::StrCat(where, ": ", unknown.size() - kMaxUnknownKeyWarnings,
                                       " more unknown keys ignored"));
    }
  }
  return c;
}

absl::StatusOr<LlamaConfig> ParseLlamaConfigJson(absl::string_view json, absl::string_view where,
                                                 std::vector<std::string>* warnings) {
  // Editors on Windows may save a byte-order mark, which protobuf's parser does not skip.
  absl::ConsumePrefix(&json, "\xEF\xBB\xBF");
  if (absl::Status s = CheckJsonNesting(json, kMaxJsonDepth); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not valid config JSON: ", s.message()));
  }
  const size_t start = json.find_first_not_of(" \t\r\n");
  const absl::string_view from_start =
      start == absl::string_view::npos ? absl::string_view() : json.substr(start);
  if (from_start.empty() || from_start.front() != '{') {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": not valid config JSON: expected an object, got ", DescribeJsonStart(from_start)));
  }
  pb::Struct config;
  // The parser reads a StringPiece; absl::string_view is not std::string_view in this Abseil.
  const auto parsed =
      pb::util::JsonStringToMessage(pb::StringPiece(json.data(), json.size()), &config);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not valid config JSON: ", parsed.message().as_string()));
  }
  return ParseLlamaConfig(config, where, warnings);
}

pb::Struct LlamaConfigStruct(const LlamaConfig& config) {
  pb::Struct out;
  auto& fields = *out.mutable_fields();
  const bool qwen2 = config.model_type == "qwen2";
  fields["architectures"].mutable_list_value()->add_values()->set_string_value(
      qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
  // Qwen2's biases follow from model_type; every other type says them with attention_bias.
  if (!qwen2) fields["attention_bias"].set_bool_value(config.qkv_bias);
  fields["hidden_act"].set_string_value("silu");
  fields["hidden_size"].set_number_value(static_cast<double>(config.hidden_size));
  fields["intermediate_size"].set_number_value(static_cast<double>(config.intermediate_size));
  fields["max_position_embeddings"].set_number_value(
      static_cast<double>(config.max_position_embeddings));
  fields["model_type"].set_string_value(config.model_type);
  fields["num_attention_heads"].set_number_value(static_cast<double>(config.num_attention_heads));
  fields["num_hidden_layers"].set_number_value(static_cast<double>(config.num_hidden_layers));
  fields["num_key_value_heads"].set_number_value(static_cast<double>(config.num_key_value_heads));
  fields["rms_norm_eps"].set_number_value(config.rms_norm_eps);
  fields["rope_scaling"].set_null_value(pb::NULL_VALUE);
  fields["rope_theta"].set_number_value(config.rope_theta);
  fields["tie_word_embeddings"].set_bool_value(config.tie_word_embeddings);
  if (!config.source_dtype.empty()) fields[kSourceDtypeKey].set_string_value(config.source_dtype);
  if (!config.torch_dtype.empty()) fields["torch_dtype"].set_string_value(config.torch_dtype);
  fields["vocab_size"].set_number_value(static_cast<double>(config.vocab_size));
  return out;
}

std::string LlamaConfigJson(const LlamaConfig& config, absl::string_view torch_dtype) {
  LlamaConfig written = config;
  written.torch_dtype = std::string(torch_dtype);
  pb::Value root;
  *root.mutable_struct_value() = LlamaConfigStruct(written);
  std::string out;
  AppendJson(root, 0, &out);
  out += "\n";
  return out;
}

}  // namespace trainstep
