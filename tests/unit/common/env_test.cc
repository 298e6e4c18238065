#include "common/env.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

class PosixEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trainstep_env_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  void WriteFile(const std::string& path, const std::string& data) {
    auto file = env_->NewWritableFile(path);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE((*file)->Append(data).ok());
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }
  std::string Read(const std::string& path) {
    auto data = env_->ReadFile(path);
    EXPECT_TRUE(data.ok()) << data.status();
    return data.ok() ? *data : "";
  }

  Env* env_ = Env::Default();
  std::string dir_;
};

// Catches Append/Sync/Close or ReadFile losing or mangling bytes (incl. NULs and >64 KiB reads).
TEST_F(PosixEnvTest, WriteThenReadRoundTrips) {
  std::string big(200 * 1024, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  WriteFile(Path("f"), big);
  EXPECT_EQ(Read(Path("f")), big);
}

// Catches NewWritableFile appending to an existing file instead of truncating it.
TEST_F(PosixEnvTest, NewWritableFileTruncates) {
  WriteFile(Path("f"), "old contents");
  WriteFile(Path("f"), "new");
  EXPECT_EQ(Read(Path("f")), "new");
}

// Catches NewAppendableFile truncating or writing at offset 0.
TEST_F(PosixEnvTest, NewAppendableFileAppendsAndCreates) {
  for (const char* piece : {"abc", "def"}) {
    auto file = env_->NewAppendableFile(Path("f"));
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE((*file)->Append(piece).ok());
    ASSERT_TRUE((*file)->Close().ok());
  }
  EXPECT_EQ(Read(Path("f")), "abcdef");
}

// Catches errors without the path or the OS reason, or with a non-canonical code.
TEST_F(PosixEnvTest, ErrorsNamePathAndReason) {
  auto missing = env_->ReadFile(Path("missing"));
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(Path("missing")));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("No such file or directory"));

  auto no_dir = env_->NewWritableFile(Path("no/such/dir/f"));
  EXPECT_TRUE(absl::IsNotFound(no_dir.status())) << no_dir.status();
  EXPECT_TRUE(absl::IsNotFound(env_->DeleteFile(Path("missing"))));
  EXPECT_TRUE(absl::IsNotFound(env_->RenameFile(Path("missing"), Path("x"))));
  EXPECT_TRUE(absl::IsNotFound(env_->TruncateFile(Path("missing"), 0)));
  EXPECT_TRUE(absl::IsNotFound(env_->SyncDir(Path("missing"))));
  EXPECT_TRUE(absl::IsNotFound(env_->ListDir(Path("missing")).status()));
}

// Catches a permission failure reported as something other than PERMISSION_DENIED.
TEST_F(PosixEnvTest, PermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores file permissions";
  ASSERT_TRUE(env_->CreateDirs(Path("ro")).ok());
  std::filesystem::permissions(
      Path("ro"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  auto file = env_->NewWritableFile(Path("ro/f"));
  EXPECT_TRUE(absl::IsPermissionDenied(file.status())) << file.status();
  std::filesystem::permissions(Path("ro"), std::filesystem::perms::owner_all);
}

// Catches rename refusing to replace an existing target (snapshots rely on replace).
TEST_F(PosixEnvTest, RenameReplacesTarget) {
  WriteFile(Path("a"), "A");
  WriteFile(Path("b"), "B");
  ASSERT_TRUE(env_->RenameFile(Path("a"), Path("b")).ok());
  EXPECT_FALSE(env_->FileExists(Path("a")));
  EXPECT_EQ(Read(Path("b")), "A");
}

// Catches DeleteFile/FileExists disagreeing with the file system.
TEST_F(PosixEnvTest, DeleteAndExists) {
  WriteFile(Path("a"), "A");
  EXPECT_TRUE(env_->FileExists(Path("a")));
  ASSERT_TRUE(env_->DeleteFile(Path("a")).ok());
  EXPECT_FALSE(env_->FileExists(Path("a")));
}

// Catches ListDir returning paths instead of names, or including "." and "..".
TEST_F(PosixEnvTest, ListDirReturnsNamesOnly) {
  WriteFile(Path("x"), "");
  WriteFile(Path("y"), "");
  ASSERT_TRUE(env_->CreateDirs(Path("sub")).ok());
  auto names = env_->ListDir(dir_);
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, UnorderedElementsAre("x", "y", "sub"));
}

// Catches CreateDirs failing on existing dirs, not creating parents, or accepting a file.
TEST_F(PosixEnvTest, CreateDirsIsMkdirP) {
  ASSERT_TRUE(env_->CreateDirs(Path("a/b/c")).ok());
  EXPECT_TRUE(env_->CreateDirs(Path("a/b/c")).ok());
  EXPECT_TRUE(env_->CreateDirs(Path("a/b/c/")).ok());
  WriteFile(Path("a/b/c/f"), "x");
  EXPECT_EQ(Read(Path("a/b/c/f")), "x");
  EXPECT_FALSE(env_->CreateDirs(Path("a/b/c/f")).ok());
  EXPECT_FALSE(env_->CreateDirs(Path("a/b/c/f/g")).ok());
}

// Catches SyncDir opening the directory the wrong way (e.g. O_WRONLY fails with EISDIR).
TEST_F(PosixEnvTest, SyncDirSucceeds) { EXPECT_TRUE(env_->SyncDir(dir_).ok()); }

// Catches TruncateFile ignoring the size (shrinking and zero-extending both work).
TEST_F(PosixEnvTest, TruncateFile) {
  WriteFile(Path("f"), "0123456789");
  ASSERT_TRUE(env_->TruncateFile(Path("f"), 4).ok());
  EXPECT_EQ(Read(Path("f")), "0123");
  ASSERT_TRUE(env_->TruncateFile(Path("f"), 6).ok());
  EXPECT_EQ(Read(Path("f")), std::string("0123\0\0", 6));
}

// Catches use-after-close writing to a recycled descriptor.
TEST_F(PosixEnvTest, ClosedFileRejectsCalls) {
  auto file = env_->NewWritableFile(Path("f"));
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition((*file)->Append("x")));
  EXPECT_TRUE(absl::IsFailedPrecondition((*file)->Sync()));
  EXPECT_TRUE(absl::IsFailedPrecondition((*file)->Close()));
}

// Counts calls that reach it; used to check EnvWrapper forwards instead of doing nothing.
class CountingEnv : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;
  absl::Status SyncDir(const std::string& dir) override {
    ++sync_dirs;
    return EnvWrapper::SyncDir(dir);
  }
  int sync_dirs = 0;
};

// Catches an EnvWrapper method that does not reach the target (e.g. a missed override).
TEST_F(PosixEnvTest, EnvWrapperForwardsEverything) {
  CountingEnv env(env_);
  EXPECT_EQ(env.target(), env_);
  ASSERT_TRUE(env.CreateDirs(Path("w")).ok());
  auto file = env.NewWritableFile(Path("w/f"));
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append("12345").ok());
  ASSERT_TRUE((*file)->Close().ok());
  auto app = env.NewAppendableFile(Path("w/f"));
  ASSERT_TRUE(app.ok());
  ASSERT_TRUE((*app)->Append("6").ok());
  ASSERT_TRUE((*app)->Close().ok());
  ASSERT_TRUE(env.TruncateFile(Path("w/f"), 3).ok());
  EXPECT_EQ(*env.ReadFile(Path("w/f")), "123");
  ASSERT_TRUE(env.RenameFile(Path("w/f"), Path("w/g")).ok());
  EXPECT_THAT(*env.ListDir(Path("w")), UnorderedElementsAre("g"));
  ASSERT_TRUE(env.SyncDir(Path("w")).ok());
  EXPECT_EQ(env.sync_dirs, 1);
  EXPECT_TRUE(env.FileExists(Path("w/g")));
  ASSERT_TRUE(env.DeleteFile(Path("w/g")).ok());
  EXPECT_FALSE(env_->FileExists(Path("w/g")));
}

}  // namespace
}  // namespace trainstep
