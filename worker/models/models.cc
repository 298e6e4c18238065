// The built-in models (tiny_gpt, mlp) and the TorchScript wrapper.
#include <torch/nn/functional/activation.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/script.h>
#include <torch/utils.h>

#include <cmath>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "core/spec.h"
#include "worker/models/activation_checkpoint.h"
#include "worker/models/llama.h"
#include "worker/models/model.h"
#include "worker/models/weights_load.h"
#include "worker/train/torch_status.h"

namespace trainstep {
namespace {

// Causal self-attention, written out so nothing depends on fused kernels that differ
// across LibTorch versions.
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t d_model, int64_t n_head) : n_head(n_head), d_head(d_model / n_head) {
    qkv = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
    proj = register_module("proj", torch::nn::Linear(d_model, d_model));
  }
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
    std::vector<at::Tensor> parts = qkv(x).chunk(3, /*dim=*/2);
    auto heads = [&](const at::Tensor& y) {
      return y.view({b, t, n_head, d_head}).transpose(1, 2);
    };
    at::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    at::Tensor att = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d_head));
    // Right padding plus a causal mask: real positions never see the padding after them.
    at::Tensor mask = at::ones({t, t}, at::TensorOptions().dtype(at::kBool).device(x.device()))
                          .triu(/*diagonal=*/1);
    att = att.masked_fill(mask, -std::numeric_limits<float>::infinity());
    att = at::softmax(att, /*dim=*/-1);
    at::Tensor y = at::matmul(att, v).transpose(1, 2).contiguous().view({b, t, d});
    return proj(y);
  }
  int64_t n_head, d_head;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(Attention);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d_model, int64_t n_head) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    attn = register_module("attn", Attention(d_model, n_head));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    fc = register_module("fc", torch::nn::Linear(d_model, 4 * d_model));
    out = register_module("out", torch::nn::Linear(4 * d_model, d_model));
  }
  at::Tensor forward(at::Tensor x) {
    x = x + attn(ln1(x));
    return x + out(at::gelu(fc(ln2(x))));
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  Attention attn{nullptr};
  torch::nn::Linear fc{nullptr}, out{nullptr};
};
TORCH_MODULE(Block);

// A decoder-only transformer over token ids 0..vocab-1 (256 by default: bytes).
struct TinyGptImpl : torch::nn::Module {
  TinyGptImpl(const v1::TinyGpt& s, int64_t vocab, bool checkpoint)
      : seq_len(s.seq_len()), checkpoint(checkpoint) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(vocab, s.d_model()));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(s.seq_len(), s.d_model()));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < s.n_layer(); ++i) {
      Block block(s.d_model(), s.n_head());
      blocks->push_back(block);
      block_fns.push_back(
          [block](const std::vector<at::Tensor>& in) mutable { return block->forward(in[0]); });
    }
    ln_f =
        register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model()})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(s.d_model(), vocab)));
  }
  at::Tensor forward(const at::Tensor& ids) {
    const int64_t t = ids.size(1);
    at::Tensor pos = at::arange(t, at::TensorOptions().dtype(at::kLong).device(ids.device()));
    at::Tensor x = tok_emb(ids) + pos_emb(pos).unsqueeze(0);
    for (const BlockFn& block : block_fns) x = RunBlock(block, {x}, checkpoint);
    return head(ln_f(x));
  }
  int64_t seq_len;
  bool checkpoint;
  std::vector<BlockFn> block_fns;  // one per block: a checkpoint's backward calls it again
  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TinyGpt);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const v1::Mlp& s) {
    fc1 = register_module("fc1", torch::nn::Linear(s.in_features(), s.hidden()));
    fc2 = register_module("fc2", torch::nn::Linear(s.hidden(), s.out_features()));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(at::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

NamedTensors FromDict(const torch::OrderedDict<std::string, at::Tensor>& dict) {
  NamedTensors out;
  for (const auto& item : dict) out.emplace_back(item.key(), item.value());
  return out;
}

// A torch::nn module held as a Model.
template <typename Holder>
class NativeModel : public Model {
 public:
  NativeModel(Holder module, int64_t vocab) : module_(std::move(module)), vocab_(vocab) {}
  at::Tensor Forward(const at::Tensor& input) override { return module_->forward(input); }
  NamedTensors NamedParameters() override { return FromDict(module_->named_parameters()); }
  NamedTensors NamedBuffers() override { return FromDict(module_->named_buffers()); }
  void SetTraining(bool training) override { module_->train(training); }
  void To(const at::Device& device) override { module_->to(device); }
  int64_t VocabSize() const override { return vocab_; }

 private:
  Holder module_;
  int64_t vocab_;
};

class TorchScriptModel : public Model {
 public:
  TorchScriptModel(torch::jit::Module module, int64_t vocab)
      : module_(std::move(module)), vocab_(vocab) {}
  at::Tensor Forward(const at::Tensor& input) override {
    return module_.forward({input}).toTensor();
  }
  NamedTensors NamedParameters() override {
    NamedTensors out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true))
      out.emplace_back(p.name, p.value);
    return out;
  }
  NamedTensors NamedBuffers() override {
    NamedTensors out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
    return out;
  }
  void SetTraining(bool training) override { module_.train(training); }
  void To(const at::Device& device) override { module_.to(device); }
  int64_t VocabSize() const override { return vocab_; }

 private:
  torch::jit::Module module_;
  int64_t vocab_;
};

// The vocabulary of a loaded TorchScript language model (BuildModel says how); `how` tells
// which way it was found, for messages. Errors name model.torchscript.path.
absl::StatusOr<int64_t> TorchScriptVocabulary(torch::jit::Module& module, const std::string& path,
                                              std::string* how) {
  const std::string prefix = absl::StrCat("model.torchscript.path: the model ", path);
  int64_t vocab = 0;
  if (module.hasattr("vocab_size")) {
    const c10::IValue v = module.attr("vocab_size");
    if (!v.isInt()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, " has a vocab_size attribute of type ",
                                                     v.tagKind(), "; it must be an int"));
    }
    vocab = v.toInt();
    *how = "its vocab_size attribute";
  } else {
    // Eval mode and no autograd: a probe must not move batch-norm statistics or draw dropout's
    // random numbers, which would change what training starts from.
    const bool training = module.is_training();
    module.eval();
    auto restore = absl::MakeCleanup([&] { module.train(training); });
    torch::NoGradGuard no_grad;
    at::Device device = at::kCPU;
    for (const auto& p : module.parameters(/*recurse=*/true)) {
      device = p.device();
      break;
    }
    at::Tensor logits;
    try {
      const c10::IValue out =
          module.forward({at::zeros({1, 1}, at::TensorOptions().dtype(at::kLong).device(device))});
      if (!out.isTensor()) {
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, " returned a ", out.tagKind(),
            " for input_ids [1, 1]; forward(input_ids [B, T]) must return logits [B, T, V]"));
      }
      logits = out.toTensor();
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix,
          " has no vocab_size attribute, and its forward failed on one token (input_ids "
          "int64 [1, 1] of zeros), which would tell its vocabulary: ",
          ShortWhat(e, 400)));
    }
    if (logits.dim() != 3 || logits.size(0) != 1 || logits.size(1) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, " returned shape ", c10::str(logits.sizes()),
          " for input_ids [1, 1]; forward(input_ids [B, T]) must return logits [B, T, V]"));
    }
    vocab = logits.size(2);
    *how = "its logits for one token";
  }
  if (vocab < 2 || vocab > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, " has a vocabulary of ", vocab, " (",
                                                   *how, "); it must be 2..1000000"));
  }
  return vocab;
}

absl::StatusOr<std::unique_ptr<Model>> BuildModelOrThrow(const v1::JobSpec& resolved,
                                                         const AllowedRoots& roots);

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> BuildModel(const v1::JobSpec& resolved,
                                                  const AllowedRoots& roots) {
  // LibTorch throws; nothing escapes this function but a Status.
  try {
    return BuildModelOrThrow(resolved, roots);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("building the model: ", ShortWhat(e, 400)));
  }
}

namespace {

// The model of the spec's kind, with its own initial weights.
absl::StatusOr<std::unique_ptr<Model>> BuildKind(const v1::JobSpec& resolved,
                                                 const AllowedRoots& roots) {
  const v1::Model& m = resolved.model();
  // Same seed, same initial weights on every rank (and in the tests' reference loop).
  torch::manual_seed(resolved.seed());
  switch (m.kind_case()) {
    case v1::Model::kTinyGpt: {
      const int64_t vocab = ModelVocabSize(resolved);
      return std::unique_ptr<Model>(new NativeModel<TinyGpt>(
          TinyGpt(m.tiny_gpt(), vocab, m.activation_checkpointing()), vocab));
    }
    case v1::Model::kMlp:
      return std::unique_ptr<Model>(new NativeModel<Mlp>(Mlp(m.mlp()), 0));
    case v1::Model::kTorchscript: {
      const v1::TorchScript& ts = m.torchscript();
      torch::jit::Module module;
      try {
        module = torch::jit::load(ts.path());
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat("model.torchscript.path: cannot load ",
                                                       ts.path(), ": ", ShortWhat(e, 400)));
      }
      std::string how;
      ASSIGN_OR_RETURN(const int64_t vocab, TorchScriptVocabulary(module, ts.path(), &how));
      if (ts.has_vocab_size() && ts.vocab_size() != vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.torchscript.vocab_size is ", ts.vocab_size(), ", but the model ",
                         ts.path(), " has a vocabulary of ", vocab, " (", how, ")"));
      }
      return std::unique_ptr<Model>(new TorchScriptModel(std::move(module), vocab));
    }
    case v1::Model::kLlama:
      return BuildLlama(m.llama(), m.activation_checkpointing(), roots);
    case v1::Model::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("model is required: one of tiny_gpt, mlp, torchscript, llama");
}

absl::StatusOr<std::unique_ptr<Model>> BuildModelOrThrow(const v1::JobSpec& resolved,
                                                         const AllowedRoots& roots) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, BuildKind(resolved, roots));
  if (!resolved.model().init_from().empty()) {
    RETURN_IF_ERROR(InitFromCheckpoint(resolved.model().init_from(), roots, *model));
  }
  return model;
}

}  // namespace

void RecordModelVocabulary(const Model& model, v1::JobSpec& resolved) {
  const auto vocab = static_cast<int32_t>(model.VocabSize());
  if (resolved.model().has_torchscript()) {
    resolved.mutable_model()->mutable_torchscript()->set_vocab_size(vocab);
  } else if (resolved.model().has_llama()) {
    resolved.mutable_model()->mutable_llama()->set_vocab_size(vocab);
  }
}

}  // namespace trainstep
