// A test Env that holds or fails the fsync of chosen files (by default a journal snapshot's
// temp file), for journal_test, coordinator_test and job_service_test: a background snapshot,
// or an answer waiting for the log's fsync, stops there deterministically.
#ifndef TRAINSTEP_TESTS_UNIT_COORDINATOR_SYNC_GATE_H_
#define TRAINSTEP_TESTS_UNIT_COORDINATOR_SYNC_GATE_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"

namespace trainstep {

inline bool IsTemp(const std::string& path) {
  return path.size() > 4 && path.compare(path.size() - 4, 4, ".tmp") == 0;
}

// Forwards to `target`, but lets a test hold the fsync of the files `gated` names open or
// fail it, leaving every other file's fsync alone.
class SyncGate : public EnvWrapper {
 public:
  explicit SyncGate(Env* target, bool (*gated)(const std::string& path) = &IsTemp)
      : EnvWrapper(target), gated_(gated) {}

  // The next gated fsync waits until Release.
  void HoldNext() {
    absl::MutexLock lock(&mu_);
    hold_next_ = true;
    held_ = false;
    released_ = false;
  }
  // Returns once a held fsync waits.
  void WaitUntilHeld() {
    absl::MutexLock lock(&mu_);
    while (!held_) cv_.Wait(&mu_);
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
    cv_.SignalAll();
  }
  // The next gated fsync fails with `error` (before reaching the disk).
  void FailNext(absl::Status error) {
    absl::MutexLock lock(&mu_);
    fail_next_ = std::move(error);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = EnvWrapper::NewWritableFile(path);
    if (!file.ok() || !gated_(path)) return file;
    return std::unique_ptr<WritableFile>(new File(this, *std::move(file)));
  }

 private:
  class File : public WritableFile {
   public:
    File(SyncGate* gate, std::unique_ptr<WritableFile> file)
        : gate_(gate), file_(std::move(file)) {}
    absl::Status Append(std::string_view data) override { return file_->Append(data); }
    absl::Status Sync() override {
      if (absl::Status s = gate_->BeforeSync(); !s.ok()) return s;
      return file_->Sync();
    }
    absl::Status Close() override { return file_->Close(); }

   private:
    SyncGate* const gate_;
    std::unique_ptr<WritableFile> file_;
  };

  absl::Status BeforeSync() {
    absl::MutexLock lock(&mu_);
    if (!fail_next_.ok()) return std::exchange(fail_next_, absl::OkStatus());
    if (!hold_next_) return absl::OkStatus();
    hold_next_ = false;
    held_ = true;
    cv_.SignalAll();
    while (!released_) cv_.Wait(&mu_);
    return absl::OkStatus();
  }

  bool (*const gated_)(const std::string& path);
  absl::Mutex mu_;
  absl::CondVar cv_;
  bool hold_next_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fail_next_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainstep

#endif  // TRAINSTEP_TESTS_UNIT_COORDINATOR_SYNC_GATE_H_
