#include "client/export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/allowed_roots.h"
#include "common/hf_weights.h"
#include "common/log.h"
#include "common/safetensors_format.h"
#include "common/status_macros.h"
#include "core/llama_config.h"

namespace trainstep::client {
namespace {

using ckpt::SafetensorsDtype;

constexpr char kConfigFile[] = "config.json";
// Every Llama-family model has it: a safetensors file without it holds no llama weights.
constexpr char kEmbedTokens[] = "model.embed_tokens.weight";
// A real config.json is a few KB; a larger file is not read into memory.
constexpr int64_t kMaxConfigBytes = 16 << 20;
// Input bytes per write: bounds the conversion buffer and the input held in memory, and keeps
// each write large.
constexpr size_t kChunkBytes = size_t{4} << 20;

absl::Status ErrnoError(const char* what, const std::string& path) {
  const int err = errno;
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

// The same status with `context` in front of its message.
absl::Status WithContext(const absl::Status& s, absl::string_view context) {
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

// "a/b/" → "a/b", so that "<dir>.tmp-<pid>" is a sibling and not a child; "/" stays.
std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string JoinPath(const std::string& dir, absl::string_view name) {
  return absl::StrCat(dir, dir.back() == '/' ? "" : "/", name);
}

std::string ParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// 1000-based, as --max-shard-size's default "5GB" is.
std::string HumanBytes(uint64_t bytes) {
  if (bytes < 1000) return absl::StrCat(bytes, " B");
  const char* const units[] = {"KB", "MB", "GB", "TB", "PB", "EB"};
  double value = static_cast<double>(bytes) / 1000;
  int unit = 0;
  while (value >= 999.95 && unit + 1 < 6) {
    value /= 1000;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, units[unit]);
}

uint32_t BitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FloatFromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Whether `path` is a directory; NOT_FOUND if it does not exist.
absl::StatusOr<bool> IsDirectory(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError("stat", path);
  return S_ISDIR(st.st_mode);
}

absl::StatusOr<LlamaConfig> ReadConfig(const std::string& checkpoint_dir, Env* env) {
  const std::string path = JoinPath(checkpoint_dir, kConfigFile);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::InvalidArgumentError(
          absl::StrCat(checkpoint_dir, " is not a llama checkpoint: no ", kConfigFile));
    }
    return ErrnoError("stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  if (st.st_size > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is ", st.st_size, " bytes, more than any config (limit ", kMaxConfigBytes, ")"));
  }
  ASSIGN_OR_RETURN(const std::string json, env->ReadFile(path));
  // Unknown keys are no reason to refuse: the config written out keeps only what trainstep read.
  return ParseLlamaConfigJson(json, path, /*warnings=*/nullptr);
}

// One tensor of the input (of HfWeights: a mapping of its file) and where it goes.
struct InputTensor {
  std::string name;
  const HfWeights::Tensor* tensor;
};

// The files of the export: each with its tensors, in name order.
struct OutputFile {
  std::string name;
  std::vector<InputTensor> tensors;
  uint64_t bytes = 0;
};

SafetensorsDtype OutputDtype(SafetensorsDtype in, SafetensorsDtype target) {
  return in == SafetensorsDtype::kF32 ? target : in;
}

uint64_t OutputBytes(const HfWeights::Tensor& t, SafetensorsDtype target) {
  return t.bytes.size() / ckpt::SafetensorsElementSize(t.dtype) *
         ckpt::SafetensorsElementSize(OutputDtype(t.dtype, target));
}

// Split as transformers splits (PlanHfShards); one file is model.safetensors.
std::vector<OutputFile> PlanFiles(const HfWeights& weights, SafetensorsDtype target,
                                  uint64_t max_bytes) {
  std::vector<uint64_t> sizes;
  for (const auto& [name, t] : weights.tensors()) sizes.push_back(OutputBytes(t, target));
  const std::vector<int> shard = PlanHfShards(sizes, max_bytes);
  std::vector<OutputFile> files(shard.empty() ? 1 : shard.back() + 1);
  size_t i = 0;
  for (const auto& [name, t] : weights.tensors()) {
    files[shard[i]].tensors.push_back({name, &t});
    files[shard[i]].bytes += sizes[i];
    ++i;
  }
  for (size_t f = 0; f < files.size(); ++f) {
    files[f].name = files.size() == 1
                        ? std::string(kHfSingleFile)
                        : HfShardFileName(static_cast<int>(f + 1), static_cast<int>(files.size()));
  }
  return files;
}

// Appends one tensor's bytes (of `input`) in `target`, a chunk at a time: F32 is converted
// through a buffer of one chunk, and each chunk's input pages are released once written.
absl::Status AppendTensor(absl::string_view bytes, SafetensorsDtype from, SafetensorsDtype target,
                          WritableFile* file) {
  const bool convert = from == SafetensorsDtype::kF32 && target != SafetensorsDtype::kF32;
  uint16_t (*narrow)(float) = target == SafetensorsDtype::kBF16 ? &Bf16FromF32 : &F16FromF32;
  std::string buffer;
  if (convert) buffer.resize(std::min(bytes.size(), kChunkBytes) / 2);
  for (size_t start = 0; start < bytes.size(); start += kChunkBytes) {
    const absl::string_view chunk = bytes.substr(start, kChunkBytes);  // a multiple of 4 bytes
    if (!convert) {
      RETURN_IF_ERROR(file->Append(std::string_view(chunk.data(), chunk.size())));
    } else {
      const auto* in = reinterpret_cast<const unsigned char*>(chunk.data());
      const size_t n = chunk.size() / 4;
      for (size_t i = 0; i < n; ++i) {
        // Little-endian in the file and in the output, whatever the host.
        const unsigned char* p = in + 4 * i;
        const uint32_t bits =
            uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
        const uint16_t out = narrow(FloatFromBits(bits));
        buffer[2 * i] = static_cast<char>(out & 0xFF);
        buffer[2 * i + 1] = static_cast<char>(out >> 8);
      }
      RETURN_IF_ERROR(file->Append(std::string_view(buffer.data(), 2 * n)));
    }
    HfWeights::ReleasePages(chunk);
  }
  return absl::OkStatus();
}

// Writes `path` whole and makes it durable; `write` appends the contents.
template <typename Write>
absl::Status WriteSyncedFile(Env* env, const std::string& path, Write write) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path));
  RETURN_IF_ERROR(write(file.get()));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

// Removes `dir` and the files in it (the temporary directory holds nothing else).
void RemoveTemporaryDir(Env* env, const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(dir);
  if (names.ok()) {
    for (const std::string& name : *names) env->DeleteFile(JoinPath(dir, name)).IgnoreError();
  }
  ::rmdir(dir.c_str());
}

// --out may not exist yet (its parent must), or be an empty directory, which the rename
// replaces.
absl::Status CheckOutDir(const std::string& out, Env* env) {
  absl::StatusOr<bool> is_dir = IsDirectory(out);
  if (is_dir.ok()) {
    if (!*is_dir) {
      return absl::FailedPreconditionError(
          absl::StrCat("--out ", out, " exists and is not a directory"));
    }
    ASSIGN_OR_RETURN(const std::vector<std::string> names, env->ListDir(out));
    if (!names.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--out ", out, " exists and is not empty; choose a new directory"));
    }
    return absl::OkStatus();
  }
  if (!absl::IsNotFound(is_dir.status())) return WithContext(is_dir.status(), "--out");
  const std::string parent = ParentDir(out);
  absl::StatusOr<bool> parent_is_dir = IsDirectory(parent);
  if (!parent_is_dir.ok() || !*parent_is_dir) {
    return absl::FailedPreconditionError(
        absl::StrCat("--out ", out, ": its parent directory ", parent, " does not exist"));
  }
  return absl::OkStatus();
}

struct Summary {
  size_t tensors = 0;
  size_t files = 0;
  uint64_t tensor_bytes = 0;
};

// Writes every file of the export into `tmp`, printing one line each as it would be named in
// `out`.
absl::Status WriteExport(const std::string& tmp, const std::string& out, const LlamaConfig& config,
                         const std::string& dtype, SafetensorsDtype target,
                         const HfWeights& weights, uint64_t max_shard_bytes, Env* env,
                         std::ostream& progress, Summary* summary) {
  const std::vector<OutputFile> files = PlanFiles(weights, target, max_shard_bytes);
  std::map<std::string, std::string> weight_map;
  for (const OutputFile& f : files) {
    std::vector<ckpt::SafetensorsTensorInfo> infos;
    infos.reserve(f.tensors.size());
    for (const InputTensor& in : f.tensors) {
      infos.push_back({in.name, OutputDtype(in.tensor->dtype, target), in.tensor->shape});
      weight_map.emplace(in.name, f.name);
    }
    // transformers refuses a file without {"format": "pt"}.
    ASSIGN_OR_RETURN(const std::string prefix,
                     ckpt::SafetensorsFilePrefix(infos, {{"format", "pt"}}));
    const std::string path = JoinPath(tmp, f.name);
    RETURN_IF_ERROR(WriteSyncedFile(env, path, [&](WritableFile* file) -> absl::Status {
      RETURN_IF_ERROR(file->Append(prefix));
      for (const InputTensor& in : f.tensors) {
        RETURN_IF_ERROR(AppendTensor(in.tensor->bytes, in.tensor->dtype, target, file));
      }
      return absl::OkStatus();
    }));
    progress << "wrote " << JoinPath(out, f.name) << " (" << f.tensors.size()
             << (f.tensors.size() == 1 ? " tensor, " : " tensors, ") << HumanBytes(f.bytes) << ")\n"
             << std::flush;
    summary->tensors += f.tensors.size();
    summary->tensor_bytes += f.bytes;
    ++summary->files;
  }
  if (files.size() > 1) {
    const std::string index = HfIndexJson(summary->tensor_bytes, weight_map);
    RETURN_IF_ERROR(WriteSyncedFile(env, JoinPath(tmp, kHfIndexFile),
                                    [&](WritableFile* file) { return file->Append(index); }));
    progress << "wrote " << JoinPath(out, kHfIndexFile) << "\n";
    ++summary->files;
  }
  // The exported weights are what torch_dtype says; the source dtype means nothing there.
  LlamaConfig written = config;
  written.source_dtype.clear();
  const std::string config_json = LlamaConfigJson(written, dtype);
  RETURN_IF_ERROR(WriteSyncedFile(env, JoinPath(tmp, kConfigFile),
                                  [&](WritableFile* file) { return file->Append(config_json); }));
  progress << "wrote " << JoinPath(out, kConfigFile) << "\n";
  ++summary->files;
  return env->SyncDir(tmp);
}

}  // namespace

bool IsExportDtype(absl::string_view dtype) {
  return dtype == "float32" || dtype == "bfloat16" || dtype == "float16";
}

uint16_t Bf16FromF32(float value) {
  const uint32_t bits = BitsOf(value);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) {
    // Truncation keeps the sign and the top of the payload; the quiet bit keeps it a NaN
    // even when the payload's top bits are all zero.
    return static_cast<uint16_t>((bits >> 16) | 0x0040);
  }
  // Adding 0x7FFF rounds halves down, and the kept LSB turns exact halves to even. A carry
  // into the exponent is the correct next binade, and the largest finite values become inf.
  const uint32_t lsb = (bits >> 16) & 1;
  return static_cast<uint16_t>((bits + 0x7FFF + lsb) >> 16);
}

uint16_t F16FromF32(float value) {
  const uint32_t bits = BitsOf(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7FFFFFFF;
  if (abs > 0x7F800000) {  // NaN: quiet, keeping the top of the payload.
    return static_cast<uint16_t>(sign | 0x7E00 | ((abs >> 13) & 0x03FF));
  }
  // 65520 is halfway between 65504 (the largest half, odd mantissa) and 65536: ties to even go
  // up, so it and everything above (inf included) is inf.
  if (abs >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);
  if (abs >= 0x38800000) {  // At least 2^-14: a normal half.
    // Rebias the exponent from 127 to 15, then round away the low 13 mantissa bits; a carry
    // out of the mantissa correctly bumps the exponent.
    const uint32_t rebiased = abs - (uint32_t{127 - 15} << 23);
    const uint32_t lsb = (rebiased >> 13) & 1;
    return static_cast<uint16_t>(sign | ((rebiased + 0x0FFF + lsb) >> 13));
  }
  // Subnormal halves are multiples of 2^-24; 2^-25 and below round to zero (ties to even).
  if (abs <= 0x33000000) return sign;
  const uint32_t exponent = abs >> 23;  // 102..112 here
  const uint32_t mantissa = (abs & 0x007FFFFF) | 0x00800000;
  // value = mantissa * 2^(exponent - 150) = (mantissa >> shift) units of 2^-24.
  const uint32_t shift = 126 - exponent;  // 14..24
  uint32_t result = mantissa >> shift;
  const uint32_t rest = mantissa & ((uint32_t{1} << shift) - 1);
  const uint32_t half = uint32_t{1} << (shift - 1);
  if (rest > half || (rest == half && (result & 1) != 0)) ++result;  // May reach 2^-14: exact.
  return static_cast<uint16_t>(sign | result);
}

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  const auto invalid = [text](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        why, ": want a size like 5GB, 500MB or 2GiB (bytes if no unit), got \"", text, "\""));
  };
  absl::string_view digits = text;
  size_t unit_start = 0;
  while (unit_start < digits.size() && absl::ascii_isdigit(digits[unit_start])) ++unit_start;
  const absl::string_view number = digits.substr(0, unit_start);
  const std::string unit = absl::AsciiStrToUpper(digits.substr(unit_start));
  if (number.empty()) {
    return invalid(absl::StartsWith(text, "-") ? "must be positive" : "not a size");
  }
  struct Unit {
    const char* name;
    uint64_t factor;
  };
  constexpr uint64_t kKiB = 1024;
  const Unit units[] = {{"", 1},
                        {"B", 1},
                        {"KB", 1000},
                        {"MB", 1000'000},
                        {"GB", 1000'000'000},
                        {"TB", 1000'000'000'000},
                        {"KIB", kKiB},
                        {"MIB", kKiB * kKiB},
                        {"GIB", kKiB * kKiB * kKiB},
                        {"TIB", kKiB * kKiB * kKiB * kKiB}};
  const Unit* found = nullptr;
  for (const Unit& u : units) {
    if (unit == u.name) found = &u;
  }
  if (found == nullptr) return invalid("unknown unit");
  uint64_t value = 0;
  if (!absl::SimpleAtoi(number, &value)) return invalid("too large");
  if (value == 0) return invalid("must be positive");
  if (value > std::numeric_limits<uint64_t>::max() / found->factor) return invalid("too large");
  return value * found->factor;
}

absl::Status ExportCheckpoint(const ExportOptions& options, std::ostream& progress, Env* env) {
  if (options.checkpoint_dir.empty()) return absl::InvalidArgumentError("no checkpoint directory");
  if (options.out_dir.empty()) return absl::InvalidArgumentError("--out is empty");
  if (!options.dtype.empty() && !IsExportDtype(options.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype must be float32, bfloat16 or float16, got \"", options.dtype, "\""));
  }
  if (options.max_shard_bytes == 0) {
    return absl::InvalidArgumentError("--max-shard-size must be positive");
  }
  const std::string ckpt_dir = StripTrailingSlashes(options.checkpoint_dir);
  const std::string out = StripTrailingSlashes(options.out_dir);

  // Everything about the input is checked before anything is written.
  absl::StatusOr<bool> is_dir = IsDirectory(ckpt_dir);
  if (!is_dir.ok()) {
    if (absl::IsNotFound(is_dir.status())) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint directory ", ckpt_dir, " does not exist"));
    }
    return is_dir.status();
  }
  if (!*is_dir) return absl::InvalidArgumentError(absl::StrCat(ckpt_dir, " is not a directory"));
  ASSIGN_OR_RETURN(const LlamaConfig config, ReadConfig(ckpt_dir, env));
  const std::string dtype = !options.dtype.empty()         ? options.dtype
                            : !config.source_dtype.empty() ? config.source_dtype
                                                           : "float32";
  const SafetensorsDtype target = dtype == "bfloat16"  ? SafetensorsDtype::kBF16
                                  : dtype == "float16" ? SafetensorsDtype::kF16
                                                       : SafetensorsDtype::kF32;

  // model.safetensors, or (a checkpoint above the shard size) shards and their index.
  ASSIGN_OR_RETURN(std::unique_ptr<HfWeights> weights,
                   HfWeights::OpenTensors(ckpt_dir, AllowedRoots(), "checkpoint"));
  bool has_embeddings = false;
  for (const auto& [name, t] : weights->tensors()) {
    if (name == kEmbedTokens) has_embeddings = true;
    if (t.dtype == SafetensorsDtype::kF64) {
      return absl::InvalidArgumentError(
          absl::StrCat(JoinPath(ckpt_dir, t.file), ": tensor ", ckpt::internal::QuotedName(name),
                       " is F64, which a Hugging Face llama model never holds"));
    }
  }
  if (!has_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat(ckpt_dir, " has no ", kEmbedTokens, ": not the weights of a llama model"));
  }

  RETURN_IF_ERROR(CheckOutDir(out, env));
  // A sibling, so that the final rename stays within one file system.
  const std::string tmp = absl::StrCat(out, ".tmp-", ::getpid());
  if (env->FileExists(tmp)) {
    return absl::FailedPreconditionError(
        absl::StrCat(tmp, " exists (left by an interrupted export?); remove it and retry"));
  }
  RETURN_IF_ERROR(env->CreateDirs(tmp));
  Summary summary;
  absl::Status s = WriteExport(tmp, out, config, dtype, target, *weights, options.max_shard_bytes,
                               env, progress, &summary);
  // rename(2) replaces an empty directory, so an empty --out is taken over atomically too.
  if (s.ok()) s = env->RenameFile(tmp, out);
  if (!s.ok()) {
    RemoveTemporaryDir(env, tmp);
    return s;
  }
  RETURN_IF_ERROR(env->SyncDir(ParentDir(out)));
  progress << "exported " << summary.tensors << " tensors (" << HumanBytes(summary.tensor_bytes)
           << ", " << dtype << ") from " << ckpt_dir << " to " << out << " in " << summary.files
           << " files\n";
  return absl::OkStatus();
}

}  // namespace trainstep::client
