#include "worker/checkpoint/safetensors.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace trainstep::ckpt {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian and this code does not byte-swap");

using internal::QuotedName;
using internal::TensorError;

// The safetensors dtypes as LibTorch scalar types.
struct Dtype {
  SafetensorsDtype dtype;
  at::ScalarType type;
};
constexpr Dtype kDtypes[] = {
    {SafetensorsDtype::kF64, at::kDouble}, {SafetensorsDtype::kF32, at::kFloat},
    {SafetensorsDtype::kF16, at::kHalf},   {SafetensorsDtype::kBF16, at::kBFloat16},
    {SafetensorsDtype::kI64, at::kLong},   {SafetensorsDtype::kI32, at::kInt},
    {SafetensorsDtype::kI16, at::kShort},  {SafetensorsDtype::kI8, at::kChar},
    {SafetensorsDtype::kU8, at::kByte},    {SafetensorsDtype::kBool, at::kBool},
};

std::optional<SafetensorsDtype> ToSafetensorsDtype(at::ScalarType type) {
  for (const Dtype& d : kDtypes) {
    if (type == d.type) return d.dtype;
  }
  return std::nullopt;
}

std::string LibTorchMessage(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

absl::Status WithPath(const std::string& path, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

// ---------------------------------------------------------------------------------------------
// Writing.

// The start of a file: the length prefix and the padded header. The tensors' bytes follow in
// TensorMap order.
struct PreparedHeader {
  std::string prefix;
  uint64_t data_bytes = 0;
};

absl::StatusOr<at::Tensor> ToContiguousCpu(const std::string& name, const at::Tensor& tensor) {
  try {
    at::Tensor t = tensor.is_cpu() ? tensor : tensor.cpu();
    // A lazily negated view keeps its un-negated bytes in memory; materialise it first.
    return t.resolve_conj().resolve_neg().contiguous();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("tensor ", QuotedName(name),
                     ": copying to a contiguous CPU tensor failed: ", LibTorchMessage(e)));
  }
}

// Checks every tensor and builds the header without copying any tensor.
absl::StatusOr<PreparedHeader> Prepare(const TensorMap& tensors, const Metadata& metadata) {
  std::vector<SafetensorsTensorInfo> infos;
  infos.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.defined()) return TensorError(name, "undefined tensor");
    if (tensor.layout() != at::kStrided)
      return TensorError(name, "only dense tensors are supported");
    std::optional<SafetensorsDtype> dtype = ToSafetensorsDtype(tensor.scalar_type());
    if (!dtype.has_value()) {
      return TensorError(
          name, absl::StrCat("dtype ", c10::toString(tensor.scalar_type()),
                             " is not supported (supported: ", SupportedSafetensorsDtypes(), ")"));
    }
    infos.push_back(
        {name, *dtype, std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end())});
  }
  PreparedHeader out;
  ASSIGN_OR_RETURN(out.prefix, SafetensorsFilePrefix(infos, metadata, &out.data_bytes));
  return out;
}

// Calls `sink(std::string_view)` with each tensor's bytes in header order. Copies (to the CPU,
// contiguous) one tensor at a time, so a GPU model never has a second full copy in host memory.
template <typename Sink>
absl::Status ForEachTensorBytes(const TensorMap& tensors, Sink sink) {
  for (const auto& [name, tensor] : tensors) {
    ASSIGN_OR_RETURN(at::Tensor cpu, ToContiguousCpu(name, tensor));
    if (cpu.nbytes() == 0) continue;
    RETURN_IF_ERROR(sink(std::string_view(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes())));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Reading.

absl::StatusOr<TensorMap> Materialize(const SafetensorsHeader& header) {
  TensorMap tensors;
  for (const SafetensorsEntry& e : header.entries) {
    ASSIGN_OR_RETURN(at::Tensor t,
                     TensorFromSafetensors(e.name, e.dtype, e.shape,
                                           header.data.substr(e.begin, e.end - e.begin)));
    tensors.emplace(e.name, std::move(t));
  }
  return tensors;
}

}  // namespace

at::ScalarType ToScalarType(SafetensorsDtype dtype) {
  for (const Dtype& d : kDtypes) {
    if (d.dtype == dtype) return d.type;
  }
  return at::kFloat;  // Unreachable: every enumerator is in the table.
}

absl::StatusOr<at::Tensor> TensorFromSafetensors(absl::string_view name, SafetensorsDtype dtype,
                                                 const std::vector<int64_t>& shape,
                                                 absl::string_view bytes) {
  try {
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(ToScalarType(dtype)));
    if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    return t;
  } catch (const std::exception& ex) {
    return absl::ResourceExhaustedError(absl::StrCat("tensor ", QuotedName(name), ": allocating ",
                                                     bytes.size(),
                                                     " bytes failed: ", LibTorchMessage(ex)));
  }
}

absl::StatusOr<std::string> SerializeSafetensors(const TensorMap& tensors,
                                                 const Metadata& metadata) {
  ASSIGN_OR_RETURN(PreparedHeader prepared, Prepare(tensors, metadata));
  std::string out;
  out.reserve(prepared.prefix.size() + prepared.data_bytes);
  out += prepared.prefix;
  RETURN_IF_ERROR(ForEachTensorBytes(tensors, [&out](std::string_view bytes) {
    out.append(bytes);
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<TensorMap> ParseSafetensors(absl::string_view bytes, Metadata* metadata) {
  ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(bytes));
  ASSIGN_OR_RETURN(TensorMap tensors, Materialize(header));
  if (metadata != nullptr) *metadata = std::move(header.metadata);
  return tensors;
}

absl::Status WriteSafetensorsFile(const std::string& path, const TensorMap& tensors,
                                  const Metadata& metadata, Env* env) {
  absl::StatusOr<PreparedHeader> prepared = Prepare(tensors, metadata);
  if (!prepared.ok()) return WithPath(path, prepared.status());
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path));
  RETURN_IF_ERROR(file->Append(prepared->prefix));
  RETURN_IF_ERROR(
      ForEachTensorBytes(tensors, [&file](std::string_view bytes) { return file->Append(bytes); }));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

absl::StatusOr<TensorMap> ReadSafetensorsFile(const std::string& path, Metadata* metadata,
                                              Env* env) {
  ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(path));
  absl::StatusOr<TensorMap> tensors = ParseSafetensors(bytes, metadata);
  if (!tensors.ok()) return WithPath(path, tensors.status());
  return tensors;
}

}  // namespace trainstep::ckpt
