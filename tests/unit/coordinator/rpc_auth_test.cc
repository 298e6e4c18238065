// rpc_auth.h: which flag combinations start a coordinator (and how), and the auth files
// re-read when they change without ever falling back to nothing.
#include "coordinator/rpc_auth.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace {

using ::testing::HasSubstr;

ServerSecurityFlags Flags(const std::string& listen) {
  ServerSecurityFlags f;
  f.listen = listen;
  return f;
}

// Catches: plaintext served off loopback without the explicit opt-out, and the opt-out
// without its warning.
TEST(ResolveServerSecurity, PlaintextOnlyOnLoopbackOrWithInsecure) {
  absl::StatusOr<ServerSecurity> local = ResolveServerSecurity(Flags("127.0.0.1:7070"));
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(local->tls.has_value());
  EXPECT_FALSE(local->authenticate);
  EXPECT_TRUE(local->warnings.empty());
  EXPECT_THAT(ResolveServerSecurity(Flags("0.0.0.0:7070")).status().message(),
              HasSubstr("--tls-cert"));
  ServerSecurityFlags insecure = Flags("0.0.0.0:7070");
  insecure.insecure = true;
  absl::StatusOr<ServerSecurity> open = ResolveServerSecurity(insecure);
  ASSERT_TRUE(open.ok());
  ASSERT_EQ(open->warnings.size(), 1u);
  EXPECT_THAT(open->warnings[0], HasSubstr("without authentication"));
}

// Catches: a TLS port that authenticates nobody (and so would serve everyone), auth files
// without the TLS they need, contradictory --insecure.
TEST(ResolveServerSecurity, FlagsThatDoNotFitAreRefused) {
  ServerSecurityFlags f = Flags("0.0.0.0:7070");
  f.tls_cert = "c.pem";
  EXPECT_THAT(ResolveServerSecurity(f).status().message(), HasSubstr("--tls-key"));
  f.tls_key = "k.pem";
  EXPECT_THAT(ResolveServerSecurity(f).status().message(), HasSubstr("authenticates nobody"));
  f.auth_certs = "certs.txt";
  EXPECT_THAT(ResolveServerSecurity(f).status().message(), HasSubstr("needs --tls-client-ca"));
  f.auth_certs.clear();
  f.insecure = true;
  f.auth_tokens = "tokens.txt";
  EXPECT_THAT(ResolveServerSecurity(f).status().message(), HasSubstr("--insecure contradicts"));
  ServerSecurityFlags tokens_only = Flags("127.0.0.1:7070");
  tokens_only.auth_tokens = "tokens.txt";
  EXPECT_THAT(ResolveServerSecurity(tokens_only).status().message(), HasSubstr("need TLS"));
}

// Catches: client certificates required when tokens are the other way in (a token-only CLI
// could not connect), and "every certificate is admin" going unannounced.
TEST(ResolveServerSecurity, ClientCertificatesOptionalOnlyBesideTokens) {
  ServerSecurityFlags f = Flags("0.0.0.0:7070");
  f.tls_cert = "c.pem";
  f.tls_key = "k.pem";
  f.tls_client_ca = "ca.pem";
  absl::StatusOr<ServerSecurity> mtls = ResolveServerSecurity(f);
  ASSERT_TRUE(mtls.ok());
  EXPECT_TRUE(mtls->authenticate);
  EXPECT_FALSE(mtls->tls->client_cert_optional);
  ASSERT_EQ(mtls->warnings.size(), 1u);
  EXPECT_THAT(mtls->warnings[0], HasSubstr("is an admin"));
  f.auth_tokens = "tokens.txt";
  f.auth_certs = "certs.txt";
  absl::StatusOr<ServerSecurity> both = ResolveServerSecurity(f);
  ASSERT_TRUE(both.ok());
  EXPECT_TRUE(both->tls->client_cert_optional);
  EXPECT_TRUE(both->warnings.empty());
}

class RpcAuthorizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trainstep_rpc_auth_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Written aside and renamed in, as a Kubernetes Secret volume swaps its files.
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path + ".tmp") << text;
    std::filesystem::rename(path + ".tmp", path);
    return path;
  }
  std::string dir_;
};

// Catches: a bad auth file accepted at start (the coordinator would serve with no roles).
TEST_F(RpcAuthorizerTest, AnInvalidFileRefusesToStart) {
  RpcAuthorizer::Options o;
  o.auth_tokens = Write("tokens", "short alice admin\n");
  EXPECT_THAT(RpcAuthorizer::Create(o).status().message(),
              HasSubstr("--auth-tokens " + o.auth_tokens + ": line 1"));
  o.auth_tokens = dir_ + "/missing";
  EXPECT_THAT(RpcAuthorizer::Create(o).status().message(), HasSubstr("cannot read it"));
}

// Catches: a changed file never re-read (a revoked token would keep working until a restart),
// and a file broken while serving replacing the roles with none.
TEST_F(RpcAuthorizerTest, FilesAreReReadWhenTheyChangeAndABrokenOneKeepsThePrevious) {
  RpcAuthorizer::Options o;
  o.auth_tokens = Write("tokens", "0123456789abcdef-alice alice submitter\n");
  o.auth_certs = Write("certs", "DNS:w worker\n");
  o.check_every = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<RpcAuthorizer>> a = RpcAuthorizer::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->Tables()->tokens.size(), 1u);
  EXPECT_TRUE((*a)->Tables()->certs_mapped);

  Write("tokens", "0123456789abcdef-bobby bob viewer\n0123456789abcdef-carol carol admin\n");
  std::shared_ptr<const AuthTables> t = (*a)->Tables();
  ASSERT_EQ(t->tokens.size(), 2u);
  EXPECT_EQ(t->tokens[0].principal, "bob");

  Write("tokens", "broken\n");
  EXPECT_EQ((*a)->Tables()->tokens.size(), 2u);
  Write("certs", "DNS:w worker:job-9\n");
  EXPECT_EQ((*a)->Tables()->certs[0].grant.worker_job, "job-9");
}

}  // namespace
}  // namespace trainstep
