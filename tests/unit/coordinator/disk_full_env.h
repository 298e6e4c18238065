// A test Env over a real one whose disk can fill up (every open, write and fsync fails with
// ENOSPC until it is freed) and whose next fsync can fail with EIO: the storage faults the
// coordinator must outlive, for coordinator_test and the loopback tests.
#ifndef TRAINSTEP_TESTS_UNIT_COORDINATOR_DISK_FULL_ENV_H_
#define TRAINSTEP_TESTS_UNIT_COORDINATOR_DISK_FULL_ENV_H_

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/env.h"

namespace trainstep {

class DiskFullEnv : public EnvWrapper {
 public:
  explicit DiskFullEnv(Env* target) : EnvWrapper(target) {}

  void SetFull(bool full) { full_.store(full); }
  // The next fsync of a file fails with EIO (the data may or may not have reached the disk).
  void FailNextSync() { fail_next_sync_.store(true); }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    if (full_.load()) return Full("open", path);
    absl::StatusOr<std::unique_ptr<WritableFile>> file = EnvWrapper::NewWritableFile(path);
    if (!file.ok()) return file;
    return std::unique_ptr<WritableFile>(new File(this, path, *std::move(file)));
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    if (full_.load()) return Full("open", path);
    absl::StatusOr<std::unique_ptr<WritableFile>> file = EnvWrapper::NewAppendableFile(path);
    if (!file.ok()) return file;
    return std::unique_ptr<WritableFile>(new File(this, path, *std::move(file)));
  }

 private:
  class File : public WritableFile {
   public:
    File(DiskFullEnv* env, std::string path, std::unique_ptr<WritableFile> file)
        : env_(env), path_(std::move(path)), file_(std::move(file)) {}
    absl::Status Append(std::string_view data) override {
      if (env_->full_.load()) return Full("write", path_);
      return file_->Append(data);
    }
    absl::Status Sync() override {
      if (env_->fail_next_sync_.exchange(false)) {
        return absl::DataLossError(absl::StrCat("fsync ", path_, ": Input/output error"));
      }
      if (env_->full_.load()) return Full("fsync", path_);
      return file_->Sync();
    }
    absl::Status Close() override { return file_->Close(); }

   private:
    DiskFullEnv* const env_;
    const std::string path_;
    std::unique_ptr<WritableFile> file_;
  };

  static absl::Status Full(const char* op, const std::string& path) {
    return absl::ResourceExhaustedError(absl::StrCat(op, " ", path, ": No space left on device"));
  }

  std::atomic<bool> full_{false};
  std::atomic<bool> fail_next_sync_{false};
};

}  // namespace trainstep

#endif  // TRAINSTEP_TESTS_UNIT_COORDINATOR_DISK_FULL_ENV_H_
