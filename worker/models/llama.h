// model.llama: the Llama-family decoder (Llama, Mistral, Qwen2, SmolLM) written out in
// LibTorch, computing what Hugging Face's modeling_llama.py / modeling_qwen2.py compute, with
// their parameter names, so that their checkpoints load and ours load in their tools.
#ifndef TRAINSTEP_WORKER_MODELS_LLAMA_H_
#define TRAINSTEP_WORKER_MODELS_LLAMA_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/allowed_roots.h"
#include "common/hf_weights.h"
#include "core/llama_config.h"
#include "trainstep/v1/spec.pb.h"
#include "worker/models/model.h"

namespace trainstep {

// How a new module's parameters start.
enum class LlamaInit {
  // Hugging Face's initialisation (normal(0, 0.02) matrices, zero biases, unit norms), drawn
  // from LibTorch's current generator: the caller seeds it.
  kRandom,
  // As LibTorch's layers make them: LoadLlamaWeights overwrites every parameter, so drawing
  // Hugging Face's normals first would only cost time.
  kForLoading,
};

// The module. Its checkpoints carry config.json with `config.source_dtype`. With
// `activation_checkpointing`, each decoder layer is recomputed in backward.
std::unique_ptr<Model> NewLlama(const LlamaConfig& config, LlamaInit init = LlamaInit::kRandom,
                                bool activation_checkpointing = false);

// The config a model made by NewLlama was built from; nullptr for another kind of model.
const LlamaConfig* LlamaConfigOf(const Model& model);

// Copies `weights` into `model` (built by NewLlama from the same config). Every tensor is
// checked before any is copied: each parameter present with its shape, in F32, BF16 or F16
// (widened to fp32 master weights), and no tensor the model does not have (save the rotary
// tables older files carry, which are computed, not trained). Errors name the tensor, the
// file and both shapes, prefixed by `field`.
absl::Status LoadLlamaWeights(const HfWeights& weights, absl::string_view field, Model& model);

// model.llama of a resolved spec: path's config and weights (files checked against `roots`;
// the config's source_dtype is the weights' dtype), or the inline config freshly initialised
// (source_dtype float32). A spec's vocab_size that disagrees with the
// config's is an error naming both.
absl::StatusOr<std::unique_ptr<Model>> BuildLlama(const v1::Llama& spec,
                                                  bool activation_checkpointing,
                                                  const AllowedRoots& roots);

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_MODELS_LLAMA_H_
