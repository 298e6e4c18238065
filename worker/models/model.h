// A trainable model as the worker sees it: a forward over a micro-batch and its named
// parameters (and buffers), whatever built it (built-in or a user's TorchScript file).
#ifndef TRAINSTEP_WORKER_MODELS_MODEL_H_
#define TRAINSTEP_WORKER_MODELS_MODEL_H_

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/allowed_roots.h"
#include "trainstep/v1/spec.pb.h"

namespace trainstep {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class Model {
 public:
  virtual ~Model() = default;
  // Token models: input_ids int64 [B, T] -> logits [B, T, V].
  // Regression models: features float [B, F] -> predictions [B, O].
  virtual at::Tensor Forward(const at::Tensor& input) = 0;
  // Parameters by name, in a fixed order (the order of gradient buckets and checkpoints).
  virtual NamedTensors NamedParameters() = 0;
  // Buffers (state that is not trained but must be checkpointed), by name.
  virtual NamedTensors NamedBuffers() = 0;
  virtual void SetTraining(bool training) = 0;
  virtual void To(const at::Device& device) = 0;
  // Token models: the ids they accept, 0..VocabSize()-1 (V). Regression models: 0.
  virtual int64_t VocabSize() const = 0;
  // Files written into every checkpoint beside the weights, by name (model.llama's
  // config.json, so that a checkpoint is a Hugging Face model directory). None by default.
  virtual std::map<std::string, std::string> CheckpointFiles() const { return {}; }
};

// Builds the spec's model: built-ins from the seed (identical on every rank), TorchScript
// from its file with its own weights. A TorchScript model's vocabulary is its own: its int
// attribute vocab_size when it has one, else the last dimension of its logits for one token
// (computed in eval mode without autograd, so nothing in the model changes); a
// model.torchscript.vocab_size that disagrees is INVALID_ARGUMENT naming both. Errors name
// the field (model.torchscript.path). model.llama reads its directory's files checked against
// `roots` (the job's; the default allows every path but the worker's secrets).
absl::StatusOr<std::unique_ptr<Model>> BuildModel(const v1::JobSpec& resolved,
                                                  const AllowedRoots& roots = AllowedRoots());

// Records a loaded model's vocabulary in `resolved` (model.torchscript.vocab_size or
// model.llama.vocab_size, which BuildModel checked), so that what reads the spec afterwards,
// the data's id check first, sees the model's own (ModelVocabSize). The other built-ins'
// specs hold theirs already.
void RecordModelVocabulary(const Model& model, v1::JobSpec& resolved);

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_MODELS_MODEL_H_
