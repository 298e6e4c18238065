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
  s.mutable_model()->mutable_llama()->set_path(P("outside/model"));
  expect_refused(s, "model.llama.path");
  s = ok;
  s.mutable_model()->set_init_from(P("outside/ckpt-3"));
  expect_refused(s, "model.init_from");
  s = ok;
  s.mutable_checkpoint()->set_dir(P("outside"));
  expect_refused(s, "checkpoint.dir");
  // The held-out data was loaded with no roots at all.
  s = ok;
  s.mutable_eval()->mutable_data()->mutable_text()->add_paths("/etc/shadow");
  expect_refused(s, "eval.data.text.paths[0]");
  s = ok;
  s.mutable_eval()->mutable_data()->mutable_jsonl()->set_path(P("outside/secret"));
  expect_refused(s, "eval.data.jsonl.path");
  s = ok;
  s.mutable_eval()->mutable_data()->mutable_tokens()->set_path("/etc/passwd");
  expect_refused(s, "eval.data.tokens.path");
}

// Catches: an owner that names a parent ("..") or a sibling ("a/../b") through its own name,
// and the encoding drifting from what operators create directories by.
TEST(EncodeOwnerTest, OneSafeComponentPerOwner) {
  EXPECT_EQ(EncodeOwner("DNS:trainstep-client"), "DNS%3Atrainstep-client");
  EXPECT_EQ(EncodeOwner("alice"), "alice");
  EXPECT_EQ(EncodeOwner("a.b_c-9"), "a.b_c-9");
  EXPECT_EQ(EncodeOwner("a/../b"), "a%2F..%2Fb");
  EXPECT_EQ(EncodeOwner(".."), "%2E%2E");
  EXPECT_EQ(EncodeOwner("."), "%2E");
  EXPECT_EQ(EncodeOwner("URI:spiffe://x y"), "URI%3Aspiffe%3A%2F%2Fx%20y");
  EXPECT_EQ(EncodeOwner("\xc3\xa9"), "%C3%A9");
  EXPECT_EQ(EncodeOwner(""), kUnauthenticatedOwner);
}

// Catches: one tenant reaching another's data or checkpoints (directly, through "..", through
// a symlink in its own tree), a missing owner directory accepted (or created), {owner} roots
// used before they are bound to a job's owner.
TEST_F(AllowedRootsTest, OwnerRootsGiveEachTenantOnlyItsSubtree) {
  for (const char* d : {"data/shared", "data/DNS%3Aalice", "data/bob", "data/local",
                        "ckpt/DNS%3Aalice", "ckpt/bob", "ckpt/local"}) {
    fs::create_directories(base_ / d);
  }
  std::ofstream(base_ / "data/bob/private.jsonl") << "{}";
  std::ofstream(base_ / "data/shared/common.txt") << "x";
  absl::StatusOr<AllowedRoots> template_roots = AllowedRoots::Parse(
      absl::StrCat(P("data/shared"), ",", P("data/{owner}"), ",", P("ckpt/{owner}")), {});
  ASSERT_TRUE(template_roots.ok()) << template_roots.status();
  EXPECT_TRUE(template_roots->per_owner());
  EXPECT_EQ(template_roots->Check("f", P("data/shared/common.txt")).code(),
            absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<AllowedRoots> alice = template_roots->ForOwner("DNS:alice");
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_FALSE(alice->per_owner());
  EXPECT_TRUE(alice->Check("f", P("data/shared/common.txt")).ok());
  EXPECT_TRUE(alice->Check("f", P("data/DNS%3Aalice")).ok());
  EXPECT_TRUE(alice->Check("checkpoint.dir", P("ckpt/DNS%3Aalice/run-1")).ok());
  absl::Status other = alice->Check("data.jsonl.path", P("data/bob/private.jsonl"));
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(other.message()), HasSubstr("data.jsonl.path: "));
  EXPECT_THAT(std::string(other.message()), HasSubstr(P("data/DNS%3Aalice")));
  EXPECT_EQ(alice->Check("f", P("data/DNS%3Aalice/../bob/private.jsonl")).code(),
            absl::StatusCode::kPermissionDenied);
  fs::create_symlink("../bob", base_ / "data/DNS%3Aalice/link");
  EXPECT_EQ(alice->Check("f", P("data/DNS%3Aalice/link/private.jsonl")).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(alice->Check("checkpoint.dir", P("ckpt/bob/run-1")).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(alice->Check("f", P("data")).code(), absl::StatusCode::kPermissionDenied);

  absl::StatusOr<AllowedRoots> bob = template_roots->ForOwner("bob");
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_TRUE(bob->Check("f", P("data/bob/private.jsonl")).ok());
  EXPECT_EQ(bob->Check("f", P("data/DNS%3Aalice")).code(), absl::StatusCode::kPermissionDenied);

  // Unauthenticated jobs (the local launcher) are the owner "local".
  absl::StatusOr<AllowedRoots> local = template_roots->ForOwner("");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(local->Check("f", P("ckpt/local/x")).ok());

  absl::StatusOr<AllowedRoots> carol = template_roots->ForOwner("carol");
  EXPECT_EQ(carol.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(carol.status().message()), HasSubstr(P("data/carol")));
  EXPECT_THAT(std::string(carol.status().message()), HasSubstr("\"carol\""));
  EXPECT_FALSE(fs::exists(base_ / "data/carol"));
  // ".." as an owner is a name, not the parent: no directory of that name, so refused.
  EXPECT_EQ(template_roots->ForOwner("..").status().code(), absl::StatusCode::kFailedPrecondition);

  // {owner} is a whole component, once, under an existing directory.
  EXPECT_EQ(AllowedRoots::Parse(P("data/x{owner}"), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AllowedRoots::Parse(P("data/{owner}/{owner}"), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AllowedRoots::Parse(P("missing/{owner}"), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A root without {owner} is bound as it is.
  absl::StatusOr<AllowedRoots> plain = AllowedRoots::Parse(P("data/shared"), {});
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->ForOwner("anyone").ok());
}

// Catches: a job that names the worker's own key (directly, through "..", a symlink, the
// directory holding it, or the timestamped directory behind a Kubernetes Secret volume), with
// or without roots, or with --allowed-roots /; /proc/self/environ (TRAINSTEP_TOKEN) readable.
TEST_F(AllowedRootsTest, TheWorkersOwnSecretsAreRefusedWhateverTheRoots) {
  // A Secret volume's layout: tls.key -> ..data/tls.key, ..data -> ..2026_12_06.
  fs::create_directories(base_ / "root/tls/..2026_12_06");
  std::ofstream(base_ / "root/tls/..2026_12_06/tls.key") << "KEY";
  fs::create_directory_symlink("..2026_12_06", base_ / "root/tls/..data");
  fs::create_symlink("..data/tls.key", base_ / "root/tls/tls.key");
  fs::create_symlink("../tls/tls.key", base_ / "root/data/innocent.txt");
  const std::vector<Secret> secrets = {{"TLS key (--tls-key)", P("root/tls/tls.key")},
                                       {"token file (--token-file)", ""}};
  for (const std::string flag : {P("root"), std::string("/"), std::string()}) {
    SCOPED_TRACE(absl::StrCat("--allowed-roots '", flag, "'"));
    absl::StatusOr<AllowedRoots> roots = AllowedRoots::Parse(flag, secrets);
    ASSERT_TRUE(roots.ok()) << roots.status();
    for (const std::string path :
         {P("root/tls/tls.key"), P("root/tls"), P("root/tls/..data"),
          P("root/tls/..2026_12_06/tls.key"), P("root/data/../tls/tls.key"),
          P("root/data/innocent.txt"), P("root")}) {
      absl::Status s = roots->Check("data.text.paths[0]", path);
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << path;
      EXPECT_THAT(std::string(s.message()), HasSubstr("data.text.paths[0]: " + path)) << path;
      EXPECT_THAT(std::string(s.message()), HasSubstr("own TLS key (--tls-key)")) << path;
    }
    EXPECT_TRUE(roots->Check("f", P("root/data/a.txt")).ok());
  }
  absl::StatusOr<AllowedRoots> defaults = AllowedRoots::Parse("/");
  ASSERT_TRUE(defaults.ok());
  for (const char* path : {"/proc/self/environ", "/proc/1/mem", "/proc",
                           "/var/run/secrets/kubernetes.io/serviceaccount/token"}) {
    EXPECT_EQ(defaults->Check("f", path).code(), absl::StatusCode::kPermissionDenied) << path;
  }
  EXPECT_TRUE(defaults->Check("f", P("root/data/a.txt")).ok());
}

// Catches: a TLS worker (a real deployment) started with no roots, and the explicit "/" (or a
// plaintext worker without roots: the local launcher) refused.
TEST_F(AllowedRootsTest, ATlsWorkerNeedsRootsGivenOnPurpose) {
  absl::StatusOr<AllowedRoots> none = AllowedRoots::Parse("");
  absl::StatusOr<AllowedRoots> all = AllowedRoots::Parse("/");
  ASSERT_TRUE(none.ok() && all.ok());
  absl::Status refused = RequireRootsWithTls(true, *none);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("--allowed-roots is required"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("--allowed-roots /"));
  EXPECT_TRUE(RequireRootsWithTls(true, *all).ok());
  EXPECT_TRUE(RequireRootsWithTls(false, *none).ok());
}

}  // namespace
}  // namespace trainstep
