// Weights read from safetensors files (common/hf_weights.h) copied into a model's tensors: the
// one place a mapped file's bytes become parameters, for model.llama.path and model.init_from.
#ifndef TRAINSTEP_WORKER_MODELS_WEIGHTS_LOAD_H_
#define TRAINSTEP_WORKER_MODELS_WEIGHTS_LOAD_H_

#include <ATen/ATen.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/allowed_roots.h"
#include "common/hf_weights.h"
#include "worker/models/model.h"

namespace trainstep {

// Floating-point weights: F32, BF16 or F16 (widened to the parameters' fp32).
bool IsWeightDtype(ckpt::SafetensorsDtype dtype);

// Copies `t` (a weight dtype, `dst`'s shape: the caller checked both) into `dst`, converting
// to dst's dtype. No autograd.
void CopyWeight(const HfWeights::Tensor& t, at::Tensor& dst);

// model.init_from: every parameter and buffer of `model` from the checkpoint directory `path`
// (model.safetensors, or shards and their index; files checked against `roots`). Everything is
// checked before anything is copied: each tensor there, with its shape, in a weight dtype (or
// the buffer's own), and no tensor the model does not have. Errors name model.init_from, the
// file, the tensor and both shapes.
absl::Status InitFromCheckpoint(const std::string& path, const AllowedRoots& roots, Model& model);

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_MODELS_WEIGHTS_LOAD_H_
