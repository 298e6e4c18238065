// Every file-system access of the coordinator (journal) and workers (checkpoints) goes through
// Env, so tests can swap in an in-memory, crash-simulating file system (LevelDB's Env idea).
#ifndef TRAINSTEP_COMMON_ENV_H_
#define TRAINSTEP_COMMON_ENV_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainstep {

// A file open for sequential writing. Not thread-safe; one owner at a time.
// Append is unbuffered: after it returns the bytes are in the OS, not yet on disk.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(std::string_view data) = 0;
  // Makes every appended byte durable (fsync).
  virtual absl::Status Sync() = 0;
  // Further calls after Close fail. The destructor closes an unclosed file, ignoring errors.
  virtual absl::Status Close() = 0;
};

// Thread-safe. Errors carry the path and the OS reason; codes follow errno
// (ENOENT → NOT_FOUND, EACCES → PERMISSION_DENIED, ENOSPC → RESOURCE_EXHAUSTED, ...).
class Env {
 public:
  virtual ~Env() = default;

  // Creates or truncates `path`.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // Creates `path` if missing; writes go to its end.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) = 0;
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // Atomically replaces `to` if it exists. Durable only after SyncDir of the parent.
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  // Entry names (not paths) in `dir`, without "." and "..", in no particular order.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // Like `mkdir -p`: succeeds if `dir` already exists as a directory.
  virtual absl::Status CreateDirs(const std::string& dir) = 0;
  // Makes creations, renames and deletions of entries in `dir` durable (fsync on the directory).
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  virtual bool FileExists(const std::string& path) = 0;
  virtual absl::Status TruncateFile(const std::string& path, uint64_t size) = 0;

  // The POSIX file system. Never deleted.
  static Env* Default();
};

// Forwards every call to `target`; subclass it to intercept a few (fault injection, counting).
class EnvWrapper : public Env {
 public:
  // `target` must outlive the wrapper.
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return target_->NewWritableFile(path);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    return target_->NewAppendableFile(path);
  }
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    return target_->ReadFile(path);
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    return target_->RenameFile(from, to);
  }
  absl::Status DeleteFile(const std::string& path) override { return target_->DeleteFile(path); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return target_->ListDir(dir);
  }
  absl::Status CreateDirs(const std::string& dir) override { return target_->CreateDirs(dir); }
  absl::Status SyncDir(const std::string& dir) override { return target_->SyncDir(dir); }
  bool FileExists(const std::string& path) override { return target_->FileExists(path); }
  absl::Status TruncateFile(const std::string& path, uint64_t size) override {
    return target_->TruncateFile(path, size);
  }

 private:
  Env* const target_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_ENV_H_
