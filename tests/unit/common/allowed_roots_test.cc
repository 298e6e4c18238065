#include "common/allowed_roots.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class AllowedRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / absl::StrCat("trainstep-roots-", getpid());
    fs::remove_all(base_);
    fs::create_directories(base_ / "root/data");
    fs::create_directories(base_ / "outside");
    std::ofstream(base_ / "root/data/a.txt") << "a";
    std::ofstream(base_ / "outside/secret") << "s";
  }
  void TearDown() override { fs::remove_all(base_); }
  std::string P(const std::string& rel) const { return (base_ / rel).string(); }

  fs::path base_;
};

// Catches: a path with ".." or a symlink escaping the root being allowed (the probe read
// /etc/shadow), or a path inside being refused.
TEST_F(AllowedRootsTest, ResolvesDotDotAndSymlinksBeforeComparing) {
  absl::StatusOr<AllowedRoots> roots = AllowedRoots::Parse(P("root"));
  ASSERT_TRUE(roots.ok()) << roots.status();
  EXPECT_TRUE(roots->restricted());
  EXPECT_TRUE(roots->Check("f", P("root/data/a.txt")).ok());
  EXPECT_TRUE(roots->Check("f", P("root")).ok());
  EXPECT_TRUE(roots->Check("f", P("root/ckpt/not/yet")).ok());  // created later

  absl::Status dotdot = roots->Check("data.text.paths[0]", P("root/data/../../outside/secret"));
  EXPECT_EQ(dotdot.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(dotdot.message()), HasSubstr("data.text.paths[0]: "));
  EXPECT_THAT(std::string(dotdot.message()),
              HasSubstr(absl::StrCat("resolves to ", P("outside/secret"))));
  EXPECT_THAT(std::string(dotdot.message()), HasSubstr("--allowed-roots"));

  fs::create_symlink(P("outside"), P("root/link"));
  EXPECT_EQ(roots->Check("f", P("root/link/secret")).code(), absl::StatusCode::kPermissionDenied);
  fs::create_symlink("../../outside/secret", P("root/data/rel"));
  EXPECT_EQ(roots->Check("f", P("root/data/rel")).code(), absl::StatusCode::kPermissionDenied);
  // A dangling link to outside: creating the checkpoint dir through it would land outside.
  fs::create_symlink(P("outside/new-ckpt"), P("root/dangling"));
  EXPECT_EQ(roots->Check("checkpoint.dir", P("root/dangling/sub")).code(),
            absl::StatusCode::kPermissionDenied);
  // A prefix that is not a path component: root2 is not inside root.
  fs::create_directories(P("root2"));
  EXPECT_EQ(roots->Check("f", P("root2/x")).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(roots->Check("f", "/etc/shadow").code(), absl::StatusCode::kPermissionDenied);
}

// Catches: no roots refusing anything (the default is "any path", with a warning), a missing
// root accepted silently (every job would then fail), and several roots not all honoured.
TEST_F(AllowedRootsTest, ParseAndSeveralRoots) {
  absl::StatusOr<AllowedRoots> none = AllowedRoots::Parse("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->restricted());
  EXPECT_TRUE(none->Check("f", "/etc/shadow").ok());
  EXPECT_EQ(AllowedRoots::Parse(P("missing")).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<AllowedRoots> two =
      AllowedRoots::Parse(absl::StrCat(P("root/data"), ", ", P("outside")));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_TRUE(two->Check("f", P("outside/secret")).ok());
  EXPECT_TRUE(two->Check("f", P("root/data/a.txt")).ok());
  EXPECT_FALSE(two->Check("f", P("root")).ok());
}

// Catches: a path field of the spec left unchecked (model, jsonl, tokens, checkpoint dir).
TEST_F(AllowedRootsTest, CheckSpecPathsCoversEveryPathField) {
  absl::StatusOr<AllowedRoots> roots = AllowedRoots::Parse(P("root"));
  ASSERT_TRUE(roots.ok());
  v1::JobSpec ok;
  ok.mutable_data()->mutable_text()->add_paths(P("root/data"));
  ok.mutable_checkpoint()->set_dir(P("root/ckpt"));
  EXPECT_TRUE(CheckSpecPaths(ok, *roots).ok());
  const auto expect_refused = [&](v1::JobSpec spec, const std::string& field) {
    absl::Status s = CheckSpecPaths(spec, *roots);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << field;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field + ": "));
  };
  v1::JobSpec s = ok;
  s.mutable_data()->mutable_text()->add_paths("/etc/shadow");
  expect_refused(s, "data.text.paths[1]");
  s = ok;
  s.mutable_data()->mutable_jsonl()->set_path("/etc/passwd");
  expect_refused(s, "data.jsonl.path");
  s = ok;
  s.mutable_data()->mutable_tokens()->set_path("/etc/passwd");
  expect_refused(s, "data.tokens.path");
  s = ok;
  s.mutable_model()->mutable_torchscript()->set_path("/tmp/evil.pt");
  expect_refused(s, "model.torchscript.path");
  s = ok;
  s.mutable_checkpoint()->set_dir(P("outside"));
  expect_refused(s, "checkpoint.dir");
}

}  // namespace
}  // namespace trainstep
