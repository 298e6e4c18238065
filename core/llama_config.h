// A Hugging Face Llama-family config.json (Llama, Mistral, Qwen2, SmolLM): parsed, validated and
// written back. Torch-free so that the coordinator can reject a bad model before any worker
// loads it. A user's file is hostile input: every problem is an INVALID_ARGUMENT, never a crash.
#ifndef TRAINSTEP_CORE_LLAMA_CONFIG_H_
#define TRAINSTEP_CORE_LLAMA_CONFIG_H_

#include <google/protobuf/struct.pb.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainstep {

// The key of a checkpoint's config.json naming the dtype its model was loaded in.
inline constexpr char kSourceDtypeKey[] = "trainstep_source_dtype";

// The shape of a decoder-only Llama-family model as trainstep builds it. ParseLlamaConfig
// returns only configs whose head_dim() divides exactly and is even.
struct LlamaConfig {
  int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0, num_attention_heads = 0,
          num_key_value_heads = 0, vocab_size = 0, max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // q/k/v projections have a bias
  bool o_bias = false;    // o_proj has a bias
  std::string model_type = "llama";
  std::string torch_dtype;  // as the file says ("float32", "bfloat16", "float16"), "" if absent
  // What a trainstep checkpoint's weights came in as (kSourceDtypeKey): its config.json says
  // float32, which its master weights are, and `checkpoint export` writes this dtype by default.
  std::string source_dtype;
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

bool operator==(const LlamaConfig& a, const LlamaConfig& b);
inline bool operator!=(const LlamaConfig& a, const LlamaConfig& b) { return !(a == b); }

// `config` is config.json's top-level object. `where` names it in every error and warning
// (e.g. "model.llama.config" or "/models/x/config.json"): errors read "<where>: <key> ...".
// Unknown keys are not errors: each adds a warning naming the key to *warnings (if non-null),
// at most 32 of them and then one that counts the rest. *warnings is appended to only on success.
// "dtype" (transformers >= 4.56) is read as torch_dtype when torch_dtype is absent.
absl::StatusOr<LlamaConfig> ParseLlamaConfig(const google::protobuf::Struct& config,
                                             absl::string_view where,
                                             std::vector<std::string>* warnings);

// The same from JSON text (a file's contents): not an object / invalid JSON is INVALID_ARGUMENT
// naming `where`. Nesting deeper than 32 is rejected by a linear scan before parsing; the size
// of `json` is the caller's concern.
absl::StatusOr<LlamaConfig> ParseLlamaConfigJson(absl::string_view json, absl::string_view where,
                                                 std::vector<std::string>* warnings);

// config.json as trainstep writes it beside its weights: every key of LlamaConfig (biases as
// model_type/attention_bias), architectures ["LlamaForCausalLM"] or ["Qwen2ForCausalLM"],
// hidden_act "silu", rope_scaling null, torch_dtype `torch_dtype` (omitted if empty),
// trainstep_source_dtype `config.source_dtype` (omitted if empty); pretty,
// keys sorted, ends with a newline. A config ParseLlamaConfig returned parses back to an equal
// one; a hand-made one whose biases no config.json can say (qwen2 without exactly q/k/v bias,
// another model_type with qkv_bias != o_bias) does not.
std::string LlamaConfigJson(const LlamaConfig& config, absl::string_view torch_dtype);

// The config as a Struct (the same keys as LlamaConfigJson, torch_dtype as in `config`), for
// recording in a job spec.
google::protobuf::Struct LlamaConfigStruct(const LlamaConfig& config);

}  // namespace trainstep

#endif  // TRAINSTEP_CORE_LLAMA_CONFIG_H_
