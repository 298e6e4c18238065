// Test file systems: InMemoryEnv models what survives a power loss (synced bytes, directory
// entries made durable by SyncDir); FaultInjectionEnv records every change so a test can crash
// at any byte of any write, and can fail chosen operations (LevelDB's FaultInjectionTestEnv).
#ifndef TRAINSTEP_TESTS_UNIT_COORDINATOR_FAULT_INJECTION_ENV_H_
#define TRAINSTEP_TESTS_UNIT_COORDINATOR_FAULT_INJECTION_ENV_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"

namespace trainstep {

// What a power loss does to data and directory entries that were not made durable.
enum class CrashMode {
  kKeepUnsynced,  // Everything written survives (the disk happened to flush it all).
  kDropUnsynced,  // Unsynced bytes vanish; directory entries revert to their last SyncDir.
  kZeroUnsynced,  // As kDropUnsynced, but files keep their size with unsynced bytes zeroed
                  // (ext4/XFS after the size update reached the disk but the data did not).
};

inline const char* CrashModeName(CrashMode mode) {
  switch (mode) {
    case CrashMode::kKeepUnsynced:
      return "KeepUnsynced";
    case CrashMode::kDropUnsynced:
      return "DropUnsynced";
    case CrashMode::kZeroUnsynced:
      return "ZeroUnsynced";
  }
  return "Unknown";
}

// Lets gtest name the mode in messages instead of "4-byte object <01-00 00-00>".
inline void PrintTo(CrashMode mode, std::ostream* os) { *os << CrashModeName(mode); }

// A thread-safe in-memory file system. Paths are plain strings split at the last '/';
// "" is the root, so "/j/log" lives in directory "/j", which lives in "". Directories are
// durable once created. Simplifications: a handle writes by path, so writing to a renamed or
// deleted file fails (POSIX would keep writing the unlinked inode); truncation is durable at once.
class InMemoryEnv : public Env {
 public:
  InMemoryEnv() { dirs_.insert(""); }

  // Bytes of a live file, or nullopt.
  std::optional<std::string> Contents(const std::string& path) const {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(path);
    if (it == live_.end()) return std::nullopt;
    return it->second->data;
  }
  // The leading bytes of a live file that would survive a power loss (ignoring its dir entry).
  std::string SyncedContents(const std::string& path) const {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(path);
    return it == live_.end() ? "" : it->second->data.substr(0, it->second->synced);
  }
  // Overwrites one byte of a live file in place (and durably): simulated bit rot.
  void CorruptByte(const std::string& path, size_t offset, char xor_mask = 0x40) {
    absl::MutexLock lock(&mu_);
    live_.at(path)->data.at(offset) ^= xor_mask;
  }
  // Replaces a live file's bytes, durably.
  void SetContents(const std::string& path, std::string data) {
    absl::MutexLock lock(&mu_);
    auto& node = live_.at(path);
    node->data = std::move(data);
    node->synced = node->data.size();
  }

  // Path-level primitives; WritableFile handles and replay both go through them.
  absl::Status CreateFile(const std::string& path, bool truncate) {
    absl::MutexLock lock(&mu_);
    if (dirs_.count(Parent(path)) == 0) return NotFound("open", path);
    if (dirs_.count(path) != 0) return absl::FailedPreconditionError("is a directory: " + path);
    auto& node = live_[path];
    if (node == nullptr) {
      node = std::make_shared<Inode>();
    } else if (truncate) {
      node->data.clear();
      node->synced = 0;
    }
    return absl::OkStatus();
  }
  absl::Status AppendToFile(const std::string& path, std::string_view data) {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(path);
    if (it == live_.end()) return NotFound("write", path);
    it->second->data.append(data);
    return absl::OkStatus();
  }
  absl::Status SyncFile(const std::string& path) {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(path);
    if (it == live_.end()) return NotFound("fsync", path);
    it->second->synced = it->second->data.size();
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    if (absl::Status s = CreateFile(path, /*truncate=*/true); !s.ok()) return s;
    return std::unique_ptr<WritableFile>(new File(this, path));
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    if (absl::Status s = CreateFile(path, /*truncate=*/false); !s.ok()) return s;
    return std::unique_ptr<WritableFile>(new File(this, path));
  }
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    std::optional<std::string> data = Contents(path);
    if (!data) return NotFound("open", path);
    return *std::move(data);
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(from);
    if (it == live_.end()) return NotFound("rename", from);
    if (dirs_.count(Parent(to)) == 0) return NotFound("rename to", to);
    std::shared_ptr<Inode> node = it->second;
    live_.erase(it);
    live_[to] = std::move(node);
    return absl::OkStatus();
  }
  absl::Status DeleteFile(const std::string& path) override {
    absl::MutexLock lock(&mu_);
    if (live_.erase(path) == 0) return NotFound("unlink", path);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    absl::MutexLock lock(&mu_);
    if (dirs_.count(dir) == 0) return NotFound("opendir", dir);
    std::vector<std::string> names;
    for (const auto& [path, node] : live_) {
      if (Parent(path) == dir) names.push_back(path.substr(dir.size() + 1));
    }
    for (const std::string& d : dirs_) {
      if (!d.empty() && Parent(d) == dir) names.push_back(d.substr(dir.size() + 1));
    }
    return names;
  }
  absl::Status CreateDirs(const std::string& dir) override {
    absl::MutexLock lock(&mu_);
    for (size_t pos = dir.find('/', 1);; pos = dir.find('/', pos + 1)) {
      const std::string prefix = dir.substr(0, pos);
      if (live_.count(prefix) != 0) {
        return absl::FailedPreconditionError("not a directory: " + prefix);
      }
      dirs_.insert(prefix);
      if (pos == std::string::npos) break;
    }
    return absl::OkStatus();
  }
  absl::Status SyncDir(const std::string& dir) override {
    absl::MutexLock lock(&mu_);
    if (dirs_.count(dir) == 0) return NotFound("open", dir);
    for (auto it = durable_.begin(); it != durable_.end();) {
      it = Parent(it->first) == dir ? durable_.erase(it) : std::next(it);
    }
    for (const auto& [path, node] : live_) {
      if (Parent(path) == dir) durable_[path] = node;
    }
    return absl::OkStatus();
  }
  bool FileExists(const std::string& path) override {
    absl::MutexLock lock(&mu_);
    return live_.count(path) != 0 || dirs_.count(path) != 0;
  }
  absl::Status TruncateFile(const std::string& path, uint64_t size) override {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(path);
    if (it == live_.end()) return NotFound("truncate", path);
    it->second->data.resize(size, '\0');
    it->second->synced = std::min<size_t>(it->second->synced, size);
    return absl::OkStatus();
  }

  // Power loss: keeps what `mode` says survives; afterwards everything left counts as durable.
  void PowerLoss(CrashMode mode) {
    absl::MutexLock lock(&mu_);
    if (mode != CrashMode::kKeepUnsynced) {
      live_ = durable_;
      for (auto& [path, node] : live_) {
        if (mode == CrashMode::kDropUnsynced) {
          node->data.resize(node->synced);
        } else {
          std::fill(node->data.begin() + node->synced, node->data.end(), '\0');
        }
      }
    }
    durable_ = live_;
    for (auto& [path, node] : live_) node->synced = node->data.size();
  }

  // Deep copy of `other`'s files, keeping which entries share an inode. Never holds both
  // locks, so copying in either direction cannot deadlock.
  void CopyFrom(const InMemoryEnv& other) {
    if (this == &other) return;
    std::map<const Inode*, std::shared_ptr<Inode>> copies;
    const auto copy = [&copies](const std::shared_ptr<Inode>& node) {
      auto& c = copies[node.get()];
      if (c == nullptr) c = std::make_shared<Inode>(*node);
      return c;
    };
    std::map<std::string, std::shared_ptr<Inode>> live, durable;
    std::set<std::string> dirs;
    {
      absl::MutexLock lock(&other.mu_);
      for (const auto& [path, node] : other.live_) live[path] = copy(node);
      for (const auto& [path, node] : other.durable_) durable[path] = copy(node);
      dirs = other.dirs_;
    }
    absl::MutexLock lock(&mu_);
    live_ = std::move(live);
    durable_ = std::move(durable);
    dirs_ = std::move(dirs);
  }

 private:
  struct Inode {
    std::string data;
    size_t synced = 0;  // data[0, synced) survives a power loss.
  };

  class File : public WritableFile {
   public:
    File(InMemoryEnv* env, std::string path) : env_(env), path_(std::move(path)) {}
    absl::Status Append(std::string_view data) override {
      if (closed_) return absl::FailedPreconditionError("closed: " + path_);
      return env_->AppendToFile(path_, data);
    }
    absl::Status Sync() override {
      if (closed_) return absl::FailedPreconditionError("closed: " + path_);
      return env_->SyncFile(path_);
    }
    absl::Status Close() override {
      if (closed_) return absl::FailedPreconditionError("closed: " + path_);
      closed_ = true;
      return absl::OkStatus();
    }

   private:
    InMemoryEnv* const env_;
    const std::string path_;
    bool closed_ = false;
  };

  static std::string Parent(const std::string& path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? "" : path.substr(0, slash);
  }
  static absl::Status NotFound(const char* op, const std::string& path) {
    return absl::NotFoundError(absl::StrCat(op, " ", path, ": No such file or directory"));
  }

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Inode>> live_ ABSL_GUARDED_BY(mu_);
  // Entries as of each directory's last SyncDir; what a power loss reverts to.
  std::map<std::string, std::shared_ptr<Inode>> durable_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> dirs_ ABSL_GUARDED_BY(mu_);
};

// One successful change to the file system, replayable. A write of n bytes is n crash steps
// (a crash may keep any prefix of it); every other change is one.
struct FsOp {
  enum Kind {
    kCreate,
    kOpenAppend,
    kAppend,
    kSync,
    kRename,
    kDelete,
    kTruncate,
    kSyncDir,
    kMkdirs
  };

  FsOp(Kind kind, std::string path, std::string arg = "", uint64_t size = 0)
      : kind(kind), path(std::move(path)), arg(std::move(arg)), size(size) {}

  Kind kind;
  std::string path;
  std::string arg;    // kAppend: the bytes; kRename: the new path.
  uint64_t size = 0;  // kTruncate: the new size.

  size_t steps() const { return kind == kAppend ? arg.size() : 1; }
};

// An InMemoryEnv that logs every change (for crashes at any step) and fails operations on
// request. Thread-safe. Destroy every user (Journal, open files) before CrashAfter.
class FaultInjectionEnv : public EnvWrapper {
 public:
  FaultInjectionEnv() : EnvWrapper(&fs_) {}

  InMemoryEnv& fs() { return fs_; }

  // Runs before every WritableFile::Sync, outside all locks: lets a test hold an fsync open.
  void SetSyncHook(std::function<void()> hook) {
    absl::MutexLock lock(&mu_);
    sync_hook_ = std::move(hook);
  }

  // The next operation of `kind` (kAppend: WritableFile::Append, kSync: WritableFile::Sync,
  // kCreate: NewWritableFile, ...) fails with `error` and changes nothing.
  void FailNext(FsOp::Kind kind, absl::Status error) {
    absl::MutexLock lock(&mu_);
    fail_next_[kind] = std::move(error);
  }
  // Successful operations of `kind` so far (e.g. kSync: fsyncs of files).
  int count(FsOp::Kind kind) const {
    absl::MutexLock lock(&mu_);
    auto it = counts_.find(kind);
    return it == counts_.end() ? 0 : it->second;
  }

  // Crash steps since construction or the last crash: crash points are 0..TotalSteps().
  size_t TotalSteps() const {
    absl::MutexLock lock(&mu_);
    size_t n = 0;
    for (const FsOp& op : ops_) n += op.steps();
    return n;
  }

  // Power loss just after the first `steps` steps: the file system becomes what it was then,
  // minus what `mode` says an unsynced change loses. The log then starts afresh.
  void CrashAfter(size_t steps, CrashMode mode) {
    absl::MutexLock lock(&mu_);
    fs_.CopyFrom(base_);
    size_t left = steps;
    for (const FsOp& op : ops_) {
      const size_t steps = std::min(op.steps(), left);
      if (steps < op.steps() && op.kind != FsOp::kAppend) break;
      // Replaying what once succeeded cannot fail unless this class is broken.
      if (absl::Status s = Apply(&fs_, op, steps); !s.ok()) {
        std::fprintf(stderr, "FaultInjectionEnv replay failed: %s\n", s.ToString().c_str());
        std::abort();
      }
      left -= steps;
      if (steps < op.steps()) break;
    }
    fs_.PowerLoss(mode);
    base_.CopyFrom(fs_);
    ops_.clear();
  }

  // An independent copy with the same files and change log, so one recorded workload can be
  // crashed at every step.
  std::unique_ptr<FaultInjectionEnv> Fork() const {
    auto copy = std::make_unique<FaultInjectionEnv>();
    absl::MutexLock lock(&mu_);
    absl::MutexLock copy_lock(&copy->mu_);  // Brand new, so no lock-order cycle.
    copy->fs_.CopyFrom(fs_);
    copy->base_.CopyFrom(base_);
    copy->ops_ = ops_;
    return copy;
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return Open(FsOp::kCreate, path);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    return Open(FsOp::kOpenAppend, path);
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    return Do({FsOp::kRename, from, to});
  }
  absl::Status DeleteFile(const std::string& path) override { return Do({FsOp::kDelete, path}); }
  absl::Status CreateDirs(const std::string& dir) override { return Do({FsOp::kMkdirs, dir}); }
  absl::Status SyncDir(const std::string& dir) override { return Do({FsOp::kSyncDir, dir}); }
  absl::Status TruncateFile(const std::string& path, uint64_t size) override {
    return Do({FsOp::kTruncate, path, "", size});
  }

 private:
  class File : public WritableFile {
   public:
    File(FaultInjectionEnv* env, std::string path) : env_(env), path_(std::move(path)) {}
    absl::Status Append(std::string_view data) override {
      if (closed_) return absl::FailedPreconditionError("closed: " + path_);
      return env_->Do({FsOp::kAppend, path_, std::string(data)});
    }
    absl::Status Sync() override {
      if (closed_) return absl::FailedPreconditionError("closed: " + path_);
      env_->RunSyncHook();
      return env_->Do({FsOp::kSync, path_});
    }
    absl::Status Close() override {
      if (closed_) return absl::FailedPreconditionError("closed: " + path_);
      closed_ = true;
      return absl::OkStatus();
    }

   private:
    FaultInjectionEnv* const env_;
    const std::string path_;
    bool closed_ = false;
  };

  void RunSyncHook() {
    std::function<void()> hook;
    {
      absl::MutexLock lock(&mu_);
      hook = sync_hook_;
    }
    if (hook) hook();
  }

  // Applies the first `steps` steps of `op` (all of it unless it is a write cut short).
  static absl::Status Apply(InMemoryEnv* fs, const FsOp& op, size_t steps) {
    switch (op.kind) {
      case FsOp::kCreate:
        return fs->CreateFile(op.path, /*truncate=*/true);
      case FsOp::kOpenAppend:
        return fs->CreateFile(op.path, /*truncate=*/false);
      case FsOp::kAppend:
        return fs->AppendToFile(op.path, std::string_view(op.arg).substr(0, steps));
      case FsOp::kSync:
        return fs->SyncFile(op.path);
      case FsOp::kRename:
        return fs->RenameFile(op.path, op.arg);
      case FsOp::kDelete:
        return fs->DeleteFile(op.path);
      case FsOp::kTruncate:
        return fs->TruncateFile(op.path, op.size);
      case FsOp::kSyncDir:
        return fs->SyncDir(op.path);
      case FsOp::kMkdirs:
        return fs->CreateDirs(op.path);
    }
    return absl::InternalError("unknown FsOp");
  }

  // Runs `op` unless a failure is queued for its kind, and logs it if it succeeded. Holding mu_
  // throughout keeps the log in the order the changes happened.
  absl::Status Do(FsOp op) {
    absl::MutexLock lock(&mu_);
    auto fail = fail_next_.find(op.kind);
    if (fail != fail_next_.end()) {
      absl::Status error = std::move(fail->second);
      fail_next_.erase(fail);
      return error;
    }
    absl::Status s = Apply(&fs_, op, op.steps());
    if (s.ok()) {
      ++counts_[op.kind];
      ops_.push_back(std::move(op));
    }
    return s;
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> Open(FsOp::Kind kind, const std::string& path) {
    if (absl::Status s = Do({kind, path}); !s.ok()) return s;
    return std::unique_ptr<WritableFile>(new File(this, path));
  }

  InMemoryEnv fs_;  // The live file system; EnvWrapper reads go straight to it.
  mutable absl::Mutex mu_;
  InMemoryEnv base_ ABSL_GUARDED_BY(mu_);  // The file system when ops_ began.
  std::vector<FsOp> ops_ ABSL_GUARDED_BY(mu_);
  std::map<FsOp::Kind, absl::Status> fail_next_ ABSL_GUARDED_BY(mu_);
  std::map<FsOp::Kind, int> counts_ ABSL_GUARDED_BY(mu_);
  std::function<void()> sync_hook_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainstep

#endif  // TRAINSTEP_TESTS_UNIT_COORDINATOR_FAULT_INJECTION_ENV_H_
