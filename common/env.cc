#include "common/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace trainstep {
namespace {

// Captures errno at once: building the message may clobber it.
absl::Status PosixError(const char* op, const std::string& path) {
  const int err = errno;
  return absl::ErrnoToStatus(err, absl::StrCat(op, " ", path));
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(std::string_view data) override {
    if (fd_ < 0) return Closed();
    const char* p = data.data();
    size_t left = data.size();
    // write() may be partial or interrupted; only a real error stops the loop.
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        return PosixError("write", path_);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fd_ < 0) return Closed();
    if (::fsync(fd_) != 0) return PosixError("fsync", path_);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (fd_ < 0) return Closed();
    const int fd = std::exchange(fd_, -1);
    // No retry on EINTR: on Linux the descriptor is gone either way.
    if (::close(fd) != 0) return PosixError("close", path_);
    return absl::OkStatus();
  }

 private:
  absl::Status Closed() const {
    return absl::FailedPreconditionError(absl::StrCat("file already closed: ", path_));
  }

  const std::string path_;
  int fd_;  // -1 once closed.
};

class PosixEnv : public Env {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return Open(path, O_WRONLY | O_CREAT | O_TRUNC);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    return Open(path, O_WRONLY | O_CREAT | O_APPEND);
  }

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("open", path);
    std::string out;
    struct stat st;
    if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
    char buf[64 * 1024];
    while (true) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        absl::Status s = PosixError("read", path);
        ::close(fd);
        return s;
      }
      out.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return PosixError("rename", absl::StrCat(from, " to ", to));
    }
    return absl::OkStatus();
  }

  absl::Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError("unlink", path);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return PosixError("opendir", dir);
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* e = ::readdir(d)) {
      const std::string_view name = e->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
      errno = 0;
    }
    // readdir returns null both at the end and on error; only errno tells them apart.
    absl::Status s = errno != 0 ? PosixError("readdir", dir) : absl::OkStatus();
    ::closedir(d);
    if (!s.ok()) return s;
    return names;
  }

  absl::Status CreateDirs(const std::string& dir) override {
    if (dir.empty()) return absl::InvalidArgumentError("CreateDirs: empty path");
    // Create each prefix ending before a '/', then the whole path.
    for (size_t pos = dir.find('/', 1);; pos = dir.find('/', pos + 1)) {
      const std::string prefix = dir.substr(0, pos);
      if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        return PosixError("mkdir", prefix);
      }
      if (pos == std::string::npos) break;
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return PosixError("stat", dir);
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat("not a directory: ", dir));
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return PosixError("open", dir);
    absl::Status s = ::fsync(fd) == 0 ? absl::OkStatus() : PosixError("fsync", dir);
    ::close(fd);
    return s;
  }

  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  absl::Status TruncateFile(const std::string& path, uint64_t size) override {
    if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0) {
      return PosixError("truncate", path);
    }
    return absl::OkStatus();
  }

 private:
  static absl::StatusOr<std::unique_ptr<WritableFile>> Open(const std::string& path, int flags) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError("open", path);
    return std::make_unique<PosixWritableFile>(path, fd);
  }
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv();
  return env;
}

}  // namespace trainstep
