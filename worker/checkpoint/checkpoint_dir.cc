#include "worker/checkpoint/checkpoint_dir.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/xxh64.h"

namespace trainstep::ckpt {
namespace {

constexpr char kModelFile[] = "model.safetensors";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kMetaFile[] = "meta.json";
constexpr char kDirPrefix[] = "ckpt-";
std::string JoinPath(const std::string& dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

std::string ParentDir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

// Canonical decimal only, so "ckpt-07" can never shadow "ckpt-7".
std::optional<int64_t> ParseId(absl::string_view digits) {
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int64_t id;
  if (!absl::SimpleAtoi(digits, &id)) return std::nullopt;
  return id;
}

// "ckpt-<id>" → id.
std::optional<int64_t> ParseCheckpointDirName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kDirPrefix)) return std::nullopt;
  return ParseId(name);
}

// ".ckpt-<id>.tmp-<pid>" or ".ckpt-<id>.old-<pid>" (our own leftovers) → id.
std::optional<int64_t> ParseLeftoverName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, ".") || !absl::ConsumePrefix(&name, kDirPrefix)) {
    return std::nullopt;
  }
  const size_t dot = name.find('.');
  if (dot == absl::string_view::npos) return std::nullopt;
  const absl::string_view rest = name.substr(dot + 1);
  if (!absl::StartsWith(rest, "tmp-") && !absl::StartsWith(rest, "old-")) return std::nullopt;
  return ParseId(name.substr(0, dot));
}

std::string LeftoverPath(const std::string& dir, int64_t id, absl::string_view kind) {
  return JoinPath(dir, absl::StrCat(".", kDirPrefix, id, ".", kind, "-", ::getpid()));
}

// Env has no directory removal (yet); this rmdir is the one file-system call that bypasses it.
absl::Status RemoveEmptyDir(const std::string& path) {
  if (::rmdir(path.c_str()) != 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("rmdir ", path));
  }
  return absl::OkStatus();
}

// Our checkpoint directories hold only files.
absl::Status RemoveCheckpointTree(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(path));
  for (const std::string& name : names) RETURN_IF_ERROR(env->DeleteFile(JoinPath(path, name)));
  return RemoveEmptyDir(path);
}

absl::Status WriteWholeFile(Env* env, const std::string& path, absl::string_view contents) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path));
  RETURN_IF_ERROR(file->Append(std::string_view(contents.data(), contents.size())));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

absl::StatusOr<CheckpointMeta> ReadMeta(Env* env, const std::string& ckpt_path,
                                        int64_t expected_id) {
  const std::string path = JoinPath(ckpt_path, kMetaFile);
  ASSIGN_OR_RETURN(std::string json, env->ReadFile(path));
  absl::StatusOr<CheckpointMeta> meta = CheckpointMetaFromJson(json);
  if (!meta.ok()) {
    return absl::Status(meta.status().code(), absl::StrCat(path, ": ", meta.status().message()));
  }
  if (meta->checkpoint_id != expected_id) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": checkpoint_id is ", meta->checkpoint_id, ", not ", expected_id));
  }
  return meta;
}

// The files of one checkpoint as they are written: each one's XXH64 over the bytes appended,
// by name, for meta.json. Hashing what is written (not a read-back) costs no second pass.
class DigestingEnv : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, target()->NewWritableFile(path));
    const size_t slash = path.rfind('/');
    Xxh64* digest = &digests_.insert_or_assign(path.substr(slash + 1), Xxh64()).first->second;
    return std::unique_ptr<WritableFile>(new DigestingFile(std::move(file), digest));
  }

  std::map<std::string, uint64_t> Digests() const {
    std::map<std::string, uint64_t> out;
    for (const auto& [name, h] : digests_) out.emplace(name, h.Digest());
    return out;
  }

 private:
  class DigestingFile : public WritableFile {
   public:
    DigestingFile(std::unique_ptr<WritableFile> file, Xxh64* digest)
        : file_(std::move(file)), digest_(digest) {}
    absl::Status Append(std::string_view data) override {
      digest_->Update(data);
      return file_->Append(data);
    }
    absl::Status Sync() override { return file_->Sync(); }
    absl::Status Close() override { return file_->Close(); }

   private:
    std::unique_ptr<WritableFile> file_;
    Xxh64* digest_;
  };

  std::map<std::string, Xxh64> digests_;
};

// DATA_LOSS naming the file unless every file with a digest in meta.json hashes to it. Streamed
// in blocks outside `env`, as sharded weights are mapped: a shard of gigabytes is never held
// whole in memory for it.
absl::Status VerifyDigests(const std::string& ckpt_path, const CheckpointMeta& meta) {
  std::vector<char> block(size_t{4} << 20);
  for (const auto& [name, expected] : meta.file_xxh64) {
    const std::string path = JoinPath(ckpt_path, name);
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::DataLossError(
          absl::StrCat(path, " is missing (meta.json lists it): the checkpoint is damaged"));
    }
    Xxh64 h;
    while (in) {
      in.read(block.data(), static_cast<std::streamsize>(block.size()));
      h.Update(std::string_view(block.data(), static_cast<size_t>(in.gcount())));
    }
    if (in.bad()) return absl::DataLossError(absl::StrCat("reading ", path, " failed"));
    if (h.Digest() != expected) {
      return absl::DataLossError(absl::StrFormat(
          "%s is corrupt: its XXH64 is %016x, meta.json recorded %016x when it was written", path,
          h.Digest(), expected));
    }
  }
  return absl::OkStatus();
}

// Inside a checkpoint directory that exists, a file missing or not what was written is lost
// data, not a caller's mistake.
absl::Status AsDataLoss(const absl::Status& s) {
  if (s.ok() || (s.code() != absl::StatusCode::kInvalidArgument && !absl::IsNotFound(s))) {
    return s;
  }
  return absl::DataLossError(s.message());
}

// A sharded checkpoint has the index instead of model.safetensors.
bool IsSharded(Env* env, const std::string& ckpt_path) {
  return !env->FileExists(JoinPath(ckpt_path, kModelFile)) &&
         env->FileExists(JoinPath(ckpt_path, kHfIndexFile));
}

// The model's tensors: model.safetensors when it fits max_shard_bytes, else Hugging Face's
// shards and index, split as transformers splits (PlanHfShards), in name order.
absl::Status WriteModel(Env* env, const std::string& dir, const TensorMap& model,
                        const Metadata& metadata, uint64_t max_shard_bytes) {
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const auto& [name, t] : model) {
    sizes.push_back(t.defined() ? static_cast<uint64_t>(t.numel()) * t.element_size() : 0);
    total += sizes.back();
  }
  if (total <= max_shard_bytes) {
    return WriteSafetensorsFile(JoinPath(dir, kModelFile), model, metadata, env);
  }
  const std::vector<int> plan = PlanHfShards(sizes, max_shard_bytes);
  const int count = plan.back() + 1;
  std::vector<TensorMap> shards(count);
  std::map<std::string, std::string> weight_map;
  size_t i = 0;
  for (const auto& [name, t] : model) {
    shards[plan[i]].emplace(name, t);
    weight_map.emplace(name, HfShardFileName(plan[i] + 1, count));
    ++i;
  }
  for (int s = 0; s < count; ++s) {
    RETURN_IF_ERROR(WriteSafetensorsFile(JoinPath(dir, HfShardFileName(s + 1, count)), shards[s],
                                         metadata, env));
  }
  return WriteWholeFile(env, JoinPath(dir, kHfIndexFile), HfIndexJson(total, weight_map));
}

absl::StatusOr<TensorMap> ReadModel(Env* env, const std::string& ckpt_path) {
  if (!IsSharded(env, ckpt_path)) {
    return ReadSafetensorsFile(JoinPath(ckpt_path, kModelFile), nullptr, env);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<HfWeights> weights,
                   HfWeights::OpenTensors(ckpt_path, AllowedRoots(), "checkpoint"));
  TensorMap out;
  for (const auto& [name, t] : weights->tensors()) {
    ASSIGN_OR_RETURN(at::Tensor tensor, TensorFromSafetensors(name, t.dtype, t.shape, t.bytes));
    out.emplace(name, std::move(tensor));
  }
  return out;
}

// Everything ReadCheckpoint checks, without building tensors.
absl::Status CheckComplete(Env* env, const std::string& ckpt_path, int64_t id) {
  ASSIGN_OR_RETURN(const CheckpointMeta meta, ReadMeta(env, ckpt_path, id));
  RETURN_IF_ERROR(VerifyDigests(ckpt_path, meta));
  if (IsSharded(env, ckpt_path)) {
    RETURN_IF_ERROR(HfWeights::OpenTensors(ckpt_path, AllowedRoots(), "checkpoint").status());
  }
  for (const char* name : {kModelFile, kOptimizerFile}) {
    if (name == kModelFile && IsSharded(env, ckpt_path)) continue;
    const std::string path = JoinPath(ckpt_path, name);
    ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(path));
    if (absl::Status s = ValidateSafetensors(bytes); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

// Makes `tmp` the visible ckpt-<id>, replacing an existing one.
absl::Status Publish(Env* env, const std::string& dir, const std::string& tmp,
                     const std::string& final_path, const std::string& aside) {
  if (!env->FileExists(final_path)) {
    RETURN_IF_ERROR(env->RenameFile(tmp, final_path));
    return env->SyncDir(dir);
  }
  // rename() cannot replace a non-empty directory: move the old one aside first.
  if (env->FileExists(aside)) RETURN_IF_ERROR(RemoveCheckpointTree(env, aside));
  RETURN_IF_ERROR(env->RenameFile(final_path, aside));
  if (absl::Status s = env->RenameFile(tmp, final_path); !s.ok()) {
    // Put the old checkpoint back so that a failed rewrite loses nothing.
    if (absl::Status back = env->RenameFile(aside, final_path); !back.ok()) {
      LogError(
          absl::StrCat("checkpoint ", final_path, " is now only at ", aside, ": ", back.message()));
    }
    return s;
  }
  RETURN_IF_ERROR(env->SyncDir(dir));
  if (absl::Status s = RemoveCheckpointTree(env, aside); !s.ok()) {
    LogWarning(absl::StrCat("removing the replaced checkpoint ", aside, ": ", s.message()));
  }
  return env->SyncDir(dir);
}

// The job that wrote `path` (a ckpt-<id> or a leftover): its meta.json's, "" if unknown.
std::string WriterOf(Env* env, const std::string& path) {
  absl::StatusOr<std::string> json = env->ReadFile(JoinPath(path, kMetaFile));
  if (!json.ok()) return "";
  absl::StatusOr<CheckpointMeta> meta = CheckpointMetaFromJson(*json);
  return meta.ok() ? meta->job_id : "";
}

// Best effort: a checkpoint that is durable stays written even if cleaning up fails.
void Prune(Env* env, const std::string& dir, int64_t written_id, int keep_last,
           const std::string& job_id) {
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(dir);
  if (!names.ok()) {
    LogWarning(absl::StrCat("checkpoint retention: ", names.status().message()));
    return;
  }
  std::vector<int64_t> ids;
  std::vector<std::string> doomed;  // Paths to delete.
  for (const std::string& name : *names) {
    if (std::optional<int64_t> id = ParseCheckpointDirName(name)) {
      // Unreadable counts as another job's: when in doubt, keep it.
      if (WriterOf(env, JoinPath(dir, name)) == job_id) ids.push_back(*id);
    } else if (std::optional<int64_t> left = ParseLeftoverName(name); left && *left < written_id) {
      doomed.push_back(JoinPath(dir, name));  // A crashed writer's, never to be renamed in now.
    }
  }
  if (keep_last > 0 && ids.size() > static_cast<size_t>(keep_last)) {
    std::sort(ids.begin(), ids.end());
    size_t excess = ids.size() - static_cast<size_t>(keep_last);
    bool renamed = false;
    for (int64_t id : ids) {
      if (excess == 0) break;
      if (id == written_id) continue;
      --excess;
      // Renamed aside first: a crash mid-delete must not leave a ckpt-<id> missing files.
      const std::string aside = LeftoverPath(dir, id, "old");
      absl::Status s = env->FileExists(aside) ? RemoveCheckpointTree(env, aside) : absl::OkStatus();
      if (s.ok()) s = env->RenameFile(JoinPath(dir, CheckpointDirName(id)), aside);
      if (!s.ok()) {
        LogWarning(absl::StrCat("checkpoint retention: ", s.message()));
        continue;
      }
      renamed = true;
      doomed.push_back(aside);
    }
    if (renamed) {
      if (absl::Status s = env->SyncDir(dir); !s.ok()) {
        LogWarning(absl::StrCat("checkpoint retention: ", s.message()));
        return;  // Deleting now could leave a ckpt-<id> that lost files after a crash.
      }
    }
  }
  for (const std::string& path : doomed) {
    if (absl::Status s = RemoveCheckpointTree(env, path); !s.ok()) {
      LogWarning(absl::StrCat("checkpoint retention: ", s.message()));
    }
  }
  if (!doomed.empty()) {
    if (absl::Status s = env->SyncDir(dir); !s.ok()) {
      LogWarning(absl::StrCat("checkpoint retention: ", s.message()));
    }
  }
}

}  // namespace

absl::Status ClaimCheckpointDir(const std::string& dir, const std::string& job_id, Env* env) {
  const std::string marker = JoinPath(dir, kClaimFile);
  if (env->FileExists(marker)) {
    ASSIGN_OR_RETURN(std::string owner, env->ReadFile(marker));
    absl::StripTrailingAsciiWhitespace(&owner);
    if (owner == job_id) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.dir ", dir, " belongs to ", owner.empty() ? "another job" : owner, " (", marker,
        "); ", job_id, " will neither write nor delete there: give it its own directory"));
  }
  if (!env->FileExists(dir)) {
    RETURN_IF_ERROR(env->CreateDirs(dir));
    RETURN_IF_ERROR(env->SyncDir(ParentDir(dir)));  // So `dir` itself survives a crash.
  } else {
    ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(dir));
    for (const std::string& name : names) {
      if (!ParseCheckpointDirName(name) && !ParseLeftoverName(name)) continue;
      const std::string writer = WriterOf(env, JoinPath(dir, name));
      if (writer == job_id) continue;
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint.dir ", dir, " holds ", name, ", written by ",
                       writer.empty() ? "an unknown job" : writer, "; ", job_id,
                       " will neither write nor delete there: give it its own directory (or move ",
                       name, " away)"));
    }
  }
  const std::string tmp = absl::StrCat(marker, ".tmp-", ::getpid());
  RETURN_IF_ERROR(WriteWholeFile(env, tmp, absl::StrCat(job_id, "\n")));
  RETURN_IF_ERROR(env->RenameFile(tmp, marker));
  return env->SyncDir(dir);
}

std::string CheckpointDirName(int64_t checkpoint_id) {
  return absl::StrCat(kDirPrefix, checkpoint_id);
}

absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir, const CheckpointMeta& meta,
                                            const TensorMap& model, const TensorMap& optimizer,
                                            int keep_last, Env* env, const WriteOptions& options) {
  if (meta.checkpoint_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_id ", meta.checkpoint_id, " is negative"));
  }
  if (keep_last < 0) {
    return absl::InvalidArgumentError(absl::StrCat("keep_last ", keep_last, " is negative"));
  }
  // Everything that can be rejected is rejected before the disk is touched.
  RETURN_IF_ERROR(CheckpointMetaToJson(meta).status());
  for (const auto& [name, contents] : options.extra_files) {
    if (name.empty() || name[0] == '.' || absl::StrContains(name, '/') || name == kModelFile ||
        name == kOptimizerFile || name == kMetaFile || name == kHfIndexFile ||
        absl::StartsWith(name, "model-")) {
      return absl::InvalidArgumentError(
          absl::StrCat("extra checkpoint file name \"", name, "\" is not allowed"));
    }
  }

  const int64_t id = meta.checkpoint_id;
  const std::string final_path = JoinPath(dir, CheckpointDirName(id));
  const std::string tmp = LeftoverPath(dir, id, "tmp");
  const std::string aside = LeftoverPath(dir, id, "old");

  RETURN_IF_ERROR(ClaimCheckpointDir(dir, meta.job_id, env));
  // Left by an earlier process that had our pid.
  if (env->FileExists(tmp)) RETURN_IF_ERROR(RemoveCheckpointTree(env, tmp));
  RETURN_IF_ERROR(env->CreateDirs(tmp));

  const auto write_all = [&]() -> absl::Status {
    // "format": "pt" tells Hugging Face tools these are PyTorch tensors.
    const Metadata file_metadata = {{"format", "pt"}};
    DigestingEnv files(env);
    RETURN_IF_ERROR(WriteModel(&files, tmp, model, file_metadata, options.max_shard_bytes));
    RETURN_IF_ERROR(
        WriteSafetensorsFile(JoinPath(tmp, kOptimizerFile), optimizer, file_metadata, &files));
    for (const auto& [name, contents] : options.extra_files) {
      RETURN_IF_ERROR(WriteWholeFile(&files, JoinPath(tmp, name), contents));
    }
    // Last, so that it can vouch for every other file.
    CheckpointMeta with_digests = meta;
    with_digests.file_xxh64 = files.Digests();
    ASSIGN_OR_RETURN(const std::string meta_json, CheckpointMetaToJson(with_digests));
    RETURN_IF_ERROR(WriteWholeFile(env, JoinPath(tmp, kMetaFile), meta_json));
    RETURN_IF_ERROR(env->SyncDir(tmp));
    return Publish(env, dir, tmp, final_path, aside);
  };
  if (absl::Status s = write_all(); !s.ok()) {
    if (env->FileExists(tmp)) {
      if (absl::Status r = RemoveCheckpointTree(env, tmp); !r.ok()) {
        LogWarning(absl::StrCat("removing ", tmp, " after a failed write: ", r.message()));
      }
    }
    return s;
  }
  Prune(env, dir, id, keep_last, meta.job_id);
  return final_path;
}

absl::StatusOr<LoadedCheckpoint> ReadCheckpoint(const std::string& dir, int64_t checkpoint_id,
                                                Env* env) {
  if (checkpoint_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_id ", checkpoint_id, " is negative"));
  }
  LoadedCheckpoint out;
  out.path = JoinPath(dir, CheckpointDirName(checkpoint_id));
  if (!env->FileExists(out.path)) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", out.path, " does not exist"));
  }
  absl::StatusOr<CheckpointMeta> meta = ReadMeta(env, out.path, checkpoint_id);
  if (!meta.ok()) return AsDataLoss(meta.status());
  out.meta = *std::move(meta);
  RETURN_IF_ERROR(VerifyDigests(out.path, out.meta));
  absl::StatusOr<TensorMap> model = ReadModel(env, out.path);
  if (!model.ok()) return AsDataLoss(model.status());
  out.model = *std::move(model);
  absl::StatusOr<TensorMap> optimizer =
      ReadSafetensorsFile(JoinPath(out.path, kOptimizerFile), nullptr, env);
  if (!optimizer.ok()) return AsDataLoss(optimizer.status());
  out.optimizer = *std::move(optimizer);
  return out;
}

absl::StatusOr<std::optional<int64_t>> LatestCheckpoint(const std::string& dir, Env* env) {
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(dir);
  if (absl::IsNotFound(names.status())) return std::optional<int64_t>();
  if (!names.ok()) return names.status();
  std::vector<int64_t> ids;
  for (const std::string& name : *names) {
    if (std::optional<int64_t> id = ParseCheckpointDirName(name)) ids.push_back(*id);
  }
  std::sort(ids.rbegin(), ids.rend());
  for (int64_t id : ids) {
    const std::string path = JoinPath(dir, CheckpointDirName(id));
    absl::Status s = CheckComplete(env, path, id);
    if (s.ok()) return std::optional<int64_t>(id);
    LogWarning(absl::StrCat("skipping incomplete checkpoint ", path, ": ", s.message()));
  }
  return std::optional<int64_t>();
}

}  // namespace trainstep::ckpt
