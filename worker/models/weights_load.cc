#include "worker/models/weights_load.h"

#include <torch/utils.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/checkpoint/safetensors.h"

namespace trainstep {
namespace {

constexpr char kField[] = "model.init_from";

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

bool IsWeightDtype(ckpt::SafetensorsDtype d) {
  return d == ckpt::SafetensorsDtype::kF32 || d == ckpt::SafetensorsDtype::kBF16 ||
         d == ckpt::SafetensorsDtype::kF16;
}

void CopyWeight(const HfWeights::Tensor& t, at::Tensor& dst) {
  torch::NoGradGuard no_grad;
  const at::ScalarType type = ckpt::ToScalarType(t.dtype);
  const size_t element = ckpt::SafetensorsElementSize(t.dtype);
  at::Tensor source;
  if (reinterpret_cast<uintptr_t>(t.bytes.data()) % element == 0) {
    source =
        at::from_blob(const_cast<char*>(t.bytes.data()), t.shape, at::TensorOptions().dtype(type));
  } else {  // a file may pack a tensor at any byte offset; the kernels want alignment
    source = at::empty(t.shape, at::TensorOptions().dtype(type));
    std::memcpy(source.data_ptr(), t.bytes.data(), t.bytes.size());
  }
  dst.copy_(source);
}

absl::Status InitFromCheckpoint(const std::string& path, const AllowedRoots& roots, Model& model) {
  ASSIGN_OR_RETURN(std::unique_ptr<HfWeights> weights, HfWeights::OpenTensors(path, roots, kField));
  const auto& tensors = weights->tensors();
  NamedTensors targets = model.NamedParameters();
  const size_t parameters = targets.size();
  for (auto& buffer : model.NamedBuffers()) targets.push_back(std::move(buffer));
  std::map<std::string, bool> wanted;
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto& [name, dst] = targets[i];
    wanted.emplace(name, true);
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, ": ", weights->dir(), " has no tensor '", name, "' (",
                       Shape(dst.sizes().vec()), "): it is not a checkpoint of this model"));
    }
    const HfWeights::Tensor& t = it->second;
    if (t.shape != dst.sizes().vec()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, ": tensor '", name, "' in ", weights->dir(), "/", t.file, " has shape ",
          Shape(t.shape), ", but the model's is ", Shape(dst.sizes().vec())));
    }
    // Parameters take any float weights; a buffer (a step counter, a mask) only its own dtype.
    const bool ok = i < parameters ? IsWeightDtype(t.dtype)
                                   : ckpt::ToScalarType(t.dtype) == dst.scalar_type() ||
                                         (dst.is_floating_point() && IsWeightDtype(t.dtype));
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, ": tensor '", name, "' in ", weights->dir(), "/", t.file, " is ",
                       ckpt::SafetensorsDtypeName(t.dtype), ", which cannot be the model's ",
                       c10::toString(dst.scalar_type())));
    }
  }
  for (const auto& [name, t] : tensors) {
    if (wanted.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, ": ", weights->dir(), "/", t.file, " has tensor ",
                       ckpt::internal::QuotedName(name),
                       ", which the model does not have: it is not a checkpoint of this model"));
    }
  }
  for (auto& [name, dst] : targets) CopyWeight(tensors.at(name), dst);
  LogInfo(absl::StrCat("model.init_from: ", tensors.size(), " tensors from ", weights->dir()));
  return absl::OkStatus();
}

}  // namespace trainstep
