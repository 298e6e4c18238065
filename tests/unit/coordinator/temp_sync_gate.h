// A test Env that holds or fails the fsync of a journal snapshot's temp file, for
// journal_test and coordinator_test: a background snapshot stops mid-write deterministically.
#ifndef TRAINSTEP_TESTS_UNIT_COORDINATOR_TEMP_SYNC_GATE_H_
#define TRAINSTEP_TESTS_UNIT_COORDINATOR_TEMP_SYNC_GATE_H_

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

// Forwards to `target`, but lets a test hold the fsync of a snapshot's temp file open (so a
// background snapshot stops mid-write, deterministically) or fail it, leaving every other
// file's fsync alone.
class TempSyncGate : public EnvWrapper {
 public:
  explicit TempSyncGate(Env* target) : EnvWrapper(target) {}

  // The next temp-file fsync waits until Release.
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
  // The next temp-file fsync fails with `error` (before reaching the disk).
  void FailNext(absl::Status error) {
    absl::MutexLock lock(&mu_);
    fail_next_ = std::move(error);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = EnvWrapper::NewWritableFile(path);
    if (!file.ok() || !IsTemp(path)) return file;
    return std::unique_ptr<WritableFile>(new File(this, *std::move(file)));
  }

 private:
  class File : public WritableFile {
   public:
    File(TempSyncGate* gate, std::unique_ptr<WritableFile> file)
        : gate_(gate), file_(std::move(file)) {}
    absl::Status Append(std::string_view data) override { return file_->Append(data); }
    absl::Status Sync() override {
      if (absl::Status s = gate_->BeforeSync(); !s.ok()) return s;
      return file_->Sync();
    }
    absl::Status Close() override { return file_->Close(); }

   private:
    TempSyncGate* const gate_;
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

  absl::Mutex mu_;
  absl::CondVar cv_;
  bool hold_next_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fail_next_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainstep

#endif  // TRAINSTEP_TESTS_UNIT_COORDINATOR_TEMP_SYNC_GATE_H_
