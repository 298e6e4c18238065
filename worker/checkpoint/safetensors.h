// Our own reader and writer of the safetensors format (https://github.com/huggingface/safetensors)
// for LibTorch tensors. The format and the reader's validation of hostile files are in
// safetensors_format.h (Torch-free); this file adds the tensors.
#ifndef TRAINSTEP_WORKER_CHECKPOINT_SAFETENSORS_H_
#define TRAINSTEP_WORKER_CHECKPOINT_SAFETENSORS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/env.h"
#include "common/safetensors_format.h"

namespace trainstep::ckpt {

// Ordered, so the same tensors always serialize to the same bytes.
using TensorMap = std::map<std::string, at::Tensor>;

// Dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL. Any other dtype, an undefined or
// non-strided tensor, or the reserved name "__metadata__" is INVALID_ARGUMENT naming the tensor.
// Non-contiguous or non-CPU tensors are written from contiguous CPU copies.
absl::StatusOr<std::string> SerializeSafetensors(const TensorMap& tensors,
                                                 const Metadata& metadata = {});

// Tensors come back on the CPU, contiguous, owning their memory (never aliasing `bytes`).
// Malformed input is INVALID_ARGUMENT naming the tensor and the problem. `metadata`, if
// non-null, receives "__metadata__" (empty if absent) and is only written on success.
absl::StatusOr<TensorMap> ParseSafetensors(absl::string_view bytes, Metadata* metadata = nullptr);

// The LibTorch scalar type of a safetensors dtype.
at::ScalarType ToScalarType(SafetensorsDtype dtype);

// One tensor of a validated file (ParseSafetensorsHeader): a CPU tensor owning a copy of
// `bytes`. RESOURCE_EXHAUSTED naming it when the allocation fails.
absl::StatusOr<at::Tensor> TensorFromSafetensors(absl::string_view name, SafetensorsDtype dtype,
                                                 const std::vector<int64_t>& shape,
                                                 absl::string_view bytes);

// Writes `path` through `env` and fsyncs it (the caller syncs the directory). The file is
// streamed tensor by tensor: no second copy of the data is built in memory.
absl::Status WriteSafetensorsFile(const std::string& path, const TensorMap& tensors,
                                  const Metadata& metadata = {}, Env* env = Env::Default());

// Errors about the contents name `path`.
absl::StatusOr<TensorMap> ReadSafetensorsFile(const std::string& path, Metadata* metadata = nullptr,
                                              Env* env = Env::Default());

}  // namespace trainstep::ckpt

#endif  // TRAINSTEP_WORKER_CHECKPOINT_SAFETENSORS_H_
