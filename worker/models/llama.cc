#include "worker/models/llama.h"

#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/models/activation_checkpoint.h"
#include "worker/models/weights_load.h"

namespace trainstep {
namespace {

// Hugging Face's default initializer_range: what a fresh model of theirs starts from.
constexpr double kInitStd = 0.02;

torch::nn::Linear Linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// Normalised in fp32 whatever the compute dtype, then scaled by the weight in the input's
// dtype: modeling_llama's LlamaRMSNorm, step for step.
struct RmsNormImpl : torch::nn::Module {
  RmsNormImpl(int64_t size, double eps) : eps(eps) {
    weight = register_parameter("weight", at::ones({size}));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x.to(at::kFloat);
    h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
    return weight * h.to(x.scalar_type());
  }
  double eps;
  at::Tensor weight;
};
TORCH_MODULE(RmsNorm);

// The two halves swapped, the new first half negated.
at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

struct Rotary {
  at::Tensor cos, sin;  // [T, head_dim], in the compute dtype
};

// cos and sin of position · inv_freq for positions 0..T-1, inv_freq = theta^(-2i/head_dim),
// each frequency used for both halves; computed in fp32 as the reference does.
Rotary RotaryTables(int64_t t, int64_t head_dim, double theta, const at::Tensor& like) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(like.device());
  at::Tensor inv_freq =
      1.0 / at::pow(theta, at::arange(0, head_dim, 2, f32.dtype(at::kLong)).to(at::kFloat) /
                               static_cast<double>(head_dim));
  at::Tensor freqs = at::outer(at::arange(t, f32), inv_freq);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(like.scalar_type()), emb.sin().to(like.scalar_type())};
}

struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const LlamaConfig& c)
      : n_head(c.num_attention_heads), n_kv(c.num_key_value_heads), head_dim(c.head_dim()) {
    q_proj = register_module("q_proj", Linear(c.hidden_size, n_head * head_dim, c.qkv_bias));
    k_proj = register_module("k_proj", Linear(c.hidden_size, n_kv * head_dim, c.qkv_bias));
    v_proj = register_module("v_proj", Linear(c.hidden_size, n_kv * head_dim, c.qkv_bias));
    o_proj = register_module("o_proj", Linear(n_head * head_dim, c.hidden_size, c.o_bias));
  }
  at::Tensor forward(const at::Tensor& x, const Rotary& rope) {
    const int64_t b = x.size(0), t = x.size(1);
    auto heads = [&](const at::Tensor& y, int64_t n) {
      return y.view({b, t, n, head_dim}).transpose(1, 2);
    };
    at::Tensor q = heads(q_proj(x), n_head);
    at::Tensor k = heads(k_proj(x), n_kv);
    at::Tensor v = heads(v_proj(x), n_kv);
    q = q * rope.cos + RotateHalf(q) * rope.sin;
    k = k * rope.cos + RotateHalf(k) * rope.sin;
    // Grouped-query attention: KV head j serves query heads j·g .. j·g + g − 1.
    if (n_kv != n_head) {
      k = k.repeat_interleave(n_head / n_kv, /*dim=*/1);
      v = v.repeat_interleave(n_head / n_kv, /*dim=*/1);
    }
    at::Tensor scores =
        at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(head_dim)));
    // Causal with right padding: a real position never sees the padding after it.
    at::Tensor mask = at::ones({t, t}, at::TensorOptions().dtype(at::kBool).device(x.device()))
                          .triu(/*diagonal=*/1);
    scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
    at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    at::Tensor y = at::matmul(probs, v).transpose(1, 2).reshape({b, t, n_head * head_dim});
    return o_proj(y);
  }
  int64_t n_head, n_kv, head_dim;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const LlamaConfig& c) {
    gate_proj = register_module("gate_proj", Linear(c.hidden_size, c.intermediate_size, false));
    up_proj = register_module("up_proj", Linear(c.hidden_size, c.intermediate_size, false));
    down_proj = register_module("down_proj", Linear(c.intermediate_size, c.hidden_size, false));
  }
  at::Tensor forward(const at::Tensor& x) { return down_proj(at::silu(gate_proj(x)) * up_proj(x)); }
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

struct DecoderLayerImpl : torch::nn::Module {
  explicit DecoderLayerImpl(const LlamaConfig& c) {
    self_attn = register_module("self_attn", Attention(c));
    mlp = register_module("mlp", Mlp(c));
    input_layernorm = register_module("input_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps));
    post_attention_layernorm =
        register_module("post_attention_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps));
  }
  at::Tensor forward(at::Tensor x, const Rotary& rope) {
    x = x + self_attn->forward(input_layernorm(x), rope);
    return x + mlp(post_attention_layernorm(x));
  }
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

// What Hugging Face calls LlamaModel ("model." in parameter names).
struct BodyImpl : torch::nn::Module {
  explicit BodyImpl(const LlamaConfig& c) {
    embed_tokens =
        register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(DecoderLayer(c));
    norm = register_module("norm", RmsNorm(c.hidden_size, c.rms_norm_eps));
  }
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RmsNorm norm{nullptr};
};
TORCH_MODULE(Body);

// LlamaForCausalLM: the body and the output head (the embedding itself when tied, so the
// parameter list, like the file, has no lm_head.weight).
struct CausalLmImpl : torch::nn::Module {
  CausalLmImpl(const LlamaConfig& c, bool checkpoint) : config(c), checkpoint(checkpoint) {
    model = register_module("model", Body(c));
    if (!c.tie_word_embeddings) {
      lm_head = register_module("lm_head", Linear(c.hidden_size, c.vocab_size, false));
    }
    for (const auto& layer : *model->layers) {
      DecoderLayer decoder(std::dynamic_pointer_cast<DecoderLayerImpl>(layer));
      layer_fns.push_back([decoder](const std::vector<at::Tensor>& in) mutable {
        return decoder->forward(in[0], Rotary{in[1], in[2]});
      });
    }
  }
  at::Tensor forward(const at::Tensor& ids) {
    at::Tensor x = model->embed_tokens(ids);
    const Rotary rope = RotaryTables(ids.size(1), config.head_dim(), config.rope_theta, /*like=*/x);
    for (const BlockFn& layer : layer_fns) x = RunBlock(layer, {x, rope.cos, rope.sin}, checkpoint);
    x = model->norm(x);
    return lm_head ? lm_head(x) : at::linear(x, model->embed_tokens->weight);
  }
  LlamaConfig config;
  bool checkpoint;
  Body model{nullptr};
  torch::nn::Linear lm_head{nullptr};
  std::vector<BlockFn> layer_fns;  // one per layer: a checkpoint's backward calls it again
};
TORCH_MODULE(CausalLm);

class LlamaModel : public Model {
 public:
  LlamaModel(const LlamaConfig& config, LlamaInit init, bool checkpoint)
      : module_(config, checkpoint) {
    if (init == LlamaInit::kForLoading) return;
    torch::NoGradGuard no_grad;
    for (auto& item : module_->named_parameters()) {
      const std::string& name = item.key();
      at::Tensor& p = item.value();
      if (absl::EndsWith(name, "norm.weight")) {
        p.fill_(1.0);
      } else if (absl::EndsWith(name, ".bias")) {
        p.zero_();
      } else {
        p.normal_(0.0, kInitStd);
      }
    }
  }
  at::Tensor Forward(const at::Tensor& input) override { return module_->forward(input); }
  NamedTensors NamedParameters() override {
    NamedTensors out;
    for (const auto& item : module_->named_parameters()) out.emplace_back(item.key(), item.value());
    return out;
  }
  NamedTensors NamedBuffers() override { return {}; }
  void SetTraining(bool training) override { module_->train(training); }
  void To(const at::Device& device) override { module_->to(device); }
  int64_t VocabSize() const override { return module_->config.vocab_size; }
  // The weights are the fp32 master weights, whatever they were loaded from.
  std::map<std::string, std::string> CheckpointFiles() const override {
    return {{"config.json", LlamaConfigJson(module_->config, "float32")}};
  }
  const LlamaConfig& config() const { return module_->config; }

 private:
  CausalLm module_;
};

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// What `checkpoint export` writes by default: the weights' own dtype when they share one,
// else what config.json says, else float32.
std::string WeightsDtype(const HfWeights& weights, const LlamaConfig& config) {
  std::optional<ckpt::SafetensorsDtype> common;
  bool mixed = false;
  for (const auto& [name, t] : weights.tensors()) {
    if (common.has_value() && *common != t.dtype) mixed = true;
    common = t.dtype;
  }
  if (common.has_value() && !mixed) {
    switch (*common) {
      case ckpt::SafetensorsDtype::kBF16:
        return "bfloat16";
      case ckpt::SafetensorsDtype::kF16:
        return "float16";
      case ckpt::SafetensorsDtype::kF32:
        return "float32";
      default:
        break;
    }
  }
  if (config.torch_dtype == "bfloat16" || config.torch_dtype == "float16") {
    return config.torch_dtype;
  }
  return "float32";
}

}  // namespace

std::unique_ptr<Model> NewLlama(const LlamaConfig& config, LlamaInit init,
                                bool activation_checkpointing) {
  return std::make_unique<LlamaModel>(config, init, activation_checkpointing);
}

const LlamaConfig* LlamaConfigOf(const Model& model) {
  const auto* llama = dynamic_cast<const LlamaModel*>(&model);
  return llama == nullptr ? nullptr : &llama->config();
}

absl::Status LoadLlamaWeights(const HfWeights& weights, absl::string_view field, Model& model) {
  const NamedTensors params = model.NamedParameters();
  const auto& tensors = weights.tensors();
  // Everything is checked before anything is copied: a bad file trains nothing and leaves no
  // half-loaded model behind.
  std::map<std::string, const at::Tensor*> wanted;
  for (const auto& [name, p] : params) wanted.emplace(name, &p);
  for (const auto& [name, p] : params) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      const bool tied_head = name == "lm_head.weight";
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", weights.dir(), " has no tensor '", name, "' (", Shape(p.sizes().vec()),
          ") that its config.json asks for",
          tied_head ? "; a model whose file has no lm_head.weight sets tie_word_embeddings" : ""));
    }
    const HfWeights::Tensor& t = it->second;
    if (t.shape != p.sizes().vec()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": tensor '", name, "' in ", weights.dir(), "/", t.file, " has shape ",
          Shape(t.shape), ", but config.json makes it ", Shape(p.sizes().vec())));
    }
    if (!IsWeightDtype(t.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": tensor '", name, "' in ", weights.dir(), "/", t.file, " is ",
                       ckpt::SafetensorsDtypeName(t.dtype), "; weights must be F32, BF16 or F16"));
    }
  }
  for (const auto& [name, t] : tensors) {
    if (wanted.count(name) != 0) continue;
    // Older exports carry the rotary frequencies, which are computed from rope_theta.
    if (absl::EndsWith(name, ".rotary_emb.inv_freq")) continue;
    const bool tied_head = name == "lm_head.weight";
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", weights.dir(), "/", t.file, " has tensor ", ckpt::internal::QuotedName(name),
        ", which a model of its config.json does not have",
        tied_head ? " (tie_word_embeddings is true: the output head is the embedding)" : ""));
  }
  for (const auto& [name, p] : params) {
    at::Tensor dst = p;
    CopyWeight(tensors.at(name), dst);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> BuildLlama(const v1::Llama& spec,
                                                  bool activation_checkpointing,
                                                  const AllowedRoots& roots) {
  std::vector<std::string> warnings;
  std::unique_ptr<Model> model;
  std::string vocab_source;
  if (spec.path().empty()) {
    ASSIGN_OR_RETURN(const LlamaConfig config,
                     ParseLlamaConfig(spec.config(), "model.llama.config", &warnings));
    for (const std::string& w : warnings) LogWarning(w);
    LlamaConfig fresh = config;
    fresh.source_dtype = "float32";
    model = NewLlama(fresh, LlamaInit::kRandom, activation_checkpointing);
    vocab_source = "model.llama.config";
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<HfWeights> weights,
                     HfWeights::Open(spec.path(), roots, "model.llama.path"));
    vocab_source = absl::StrCat(weights->dir(), "/config.json");
    absl::StatusOr<LlamaConfig> config =
        ParseLlamaConfigJson(weights->config_json(), vocab_source, &warnings);
    if (!config.ok()) {
      return absl::Status(config.status().code(),
                          absl::StrCat("model.llama.path: ", config.status().message()));
    }
    for (const std::string& w : warnings) LogWarning(w);
    config->source_dtype = WeightsDtype(*weights, *config);
    model = NewLlama(*config, LlamaInit::kForLoading, activation_checkpointing);
    RETURN_IF_ERROR(LoadLlamaWeights(*weights, "model.llama.path", *model));
    LogInfo(absl::StrCat("loaded ", weights->tensors().size(), " tensors (",
                         weights->total_bytes() >> 20, " MiB) from ", weights->dir()));
  }
  if (spec.has_vocab_size() && spec.vocab_size() != model->VocabSize()) {
    return absl::InvalidArgumentError(absl::StrCat("model.llama.vocab_size is ", spec.vocab_size(),
                                                   ", but ", vocab_source, " has vocab_size ",
                                                   model->VocabSize()));
  }
  return model;
}

}  // namespace trainstep
