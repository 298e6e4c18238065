// common/tls.h: the flags and TRAINSTEP_TLS_* / TRAINSTEP_TOKEN resolved in one place, PEM
// files checked with messages naming the flag, and the sentence for each kind of TLS failure
// (the words gRPC 1.51 uses, as tests/integration/security_process_test.cc sees them).
#include "common/tls.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace {

using ::testing::HasSubstr;

constexpr char kCert[] = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
constexpr char kKey[] = "-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n";

class TlsFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trainstep_tls_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ca_ = Write("ca.crt", kCert);
    cert_ = Write("client.crt", kCert);
    key_ = Write("client.key", kKey);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  EnvLookup Env(std::map<std::string, std::string> vars) {
    return [vars](const char* name) {
      auto it = vars.find(name);
      return it == vars.end() ? std::string() : it->second;
    };
  }

  std::string dir_, ca_, cert_, key_;
};

// Catches: a worker or CLI silently going plaintext when the environment asks for TLS, or a
// flag losing to its variable.
TEST_F(TlsFlagsTest, FlagsWinAndVariablesFillTheGaps) {
  absl::StatusOr<ChannelSecurity> none = ResolveChannelSecurity({}, Env({}));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->tls());
  EXPECT_TRUE(none->token.empty());

  absl::StatusOr<ChannelSecurity> env =
      ResolveChannelSecurity({}, Env({{"TRAINSTEP_TLS_CA", ca_},
                                      {"TRAINSTEP_TLS_CERT", cert_},
                                      {"TRAINSTEP_TLS_KEY", key_},
                                      {"TRAINSTEP_TOKEN", " tok-123 \n"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_TRUE(env->tls());
  EXPECT_EQ(env->files.cert, cert_);
  EXPECT_EQ(env->token, "tok-123");

  const std::string other_ca = Write("other.crt", kCert);
  const std::string token_file = Write("token", "from-file\n");
  ChannelSecurityFlags flags;
  flags.tls_ca = other_ca;
  flags.token_file = token_file;
  absl::StatusOr<ChannelSecurity> both = ResolveChannelSecurity(
      flags, Env({{"TRAINSTEP_TLS_CA", ca_}, {"TRAINSTEP_TOKEN", "from-env"}}));
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->files.ca, other_ca);
  EXPECT_EQ(both->token, "from-file");
}

// Catches: a token sent in plaintext, half a key pair, a typo'd path found only at the first
// handshake — each refused up front naming where the value came from.
TEST_F(TlsFlagsTest, BadCombinationsAndFilesNameTheirSource) {
  EXPECT_THAT(ResolveChannelSecurity({}, Env({{"TRAINSTEP_TOKEN", "t"}})).status().message(),
              HasSubstr("TRAINSTEP_TOKEN needs TLS"));
  ChannelSecurityFlags half;
  half.tls_ca = ca_;
  half.tls_cert = cert_;
  EXPECT_THAT(ResolveChannelSecurity(half, Env({})).status().message(),
              HasSubstr("--tls-cert needs its pair"));
  ChannelSecurityFlags no_ca;
  no_ca.tls_cert = cert_;
  no_ca.tls_key = key_;
  EXPECT_THAT(ResolveChannelSecurity(no_ca, Env({})).status().message(),
              HasSubstr("--tls-cert needs --tls-ca"));
  EXPECT_THAT(
      ResolveChannelSecurity({}, Env({{"TRAINSTEP_TLS_CA", dir_ + "/missing"}})).status().message(),
      HasSubstr("TRAINSTEP_TLS_CA " + dir_ + "/missing: cannot read it"));
  ChannelSecurityFlags swapped;
  swapped.tls_ca = ca_;
  swapped.tls_cert = key_;
  swapped.tls_key = cert_;
  EXPECT_THAT(ResolveChannelSecurity(swapped, Env({})).status().message(),
              HasSubstr("--tls-cert " + key_ + ": not a PEM certificate file"));
  ChannelSecurityFlags spaced;
  spaced.tls_ca = ca_;
  spaced.token_file = Write("two-tokens", "a b\n");
  EXPECT_THAT(ResolveChannelSecurity(spaced, Env({})).status().message(),
              HasSubstr("must hold one token"));
}

// Catches: a TLS failure reported as "is the coordinator running?" — each kind gets its own
// sentence (the messages are gRPC 1.51's, as the process test sees them).
TEST(ExplainSecurityFailure, EachKindSaysWhich) {
  ChannelSecurity plain;
  ChannelSecurity tls;
  tls.files.ca = "/certs/ca.crt";
  ChannelSecurity mtls = tls;
  mtls.files.cert = "/certs/client.crt";
  const auto unavailable = [](const char* last_error) {
    return absl::UnavailableError(
        absl::StrCat("failed to connect to all addresses; last error: ", last_error));
  };
  EXPECT_THAT(ExplainSecurityFailure(unavailable("UNAVAILABLE: ipv4:127.0.0.1:1: Socket closed"),
                                     plain, "h:1"),
              HasSubstr("if it serves TLS, pass --tls-ca"));
  EXPECT_THAT(ExplainSecurityFailure(unavailable("UNKNOWN: ipv4:127.0.0.1:1: Tls handshake "
                                                 "failed: SSL_ERROR_SSL: error:0A00010B:SSL "
                                                 "routines::wrong version number"),
                                     tls, "h:1"),
              HasSubstr("does not speak TLS"));
  EXPECT_THAT(ExplainSecurityFailure(unavailable("UNKNOWN: Tls handshake failed: SSL_ERROR_SSL: "
                                                 "error:0A000086:SSL routines::certificate "
                                                 "verify failed"),
                                     tls, "h:1"),
              HasSubstr("no CA in /certs/ca.crt signs: untrusted certificate"));
  EXPECT_THAT(
      ExplainSecurityFailure(unavailable("UNKNOWN: ipv4:127.0.0.2:1: Custom verification check "
                                         "failed with error: UNAUTHENTICATED: Hostname "
                                         "Verification Check failed."),
                             tls, "127.0.0.2:1"),
      HasSubstr("does not name \"127.0.0.2\": wrong host name"));
  EXPECT_THAT(ExplainSecurityFailure(unavailable("UNAVAILABLE: Socket closed"), tls, "h:1"),
              HasSubstr("pass --tls-cert and --tls-key"));
  EXPECT_THAT(ExplainSecurityFailure(unavailable("UNAVAILABLE: Socket closed"), mtls, "h:1"),
              HasSubstr("did not accept /certs/client.crt"));
  EXPECT_EQ(
      ExplainSecurityFailure(
          unavailable("UNKNOWN: Failed to connect to remote host: Connection refused"), tls, "h:1"),
      "");
  EXPECT_EQ(ExplainSecurityFailure(absl::NotFoundError("certificate verify failed"), tls, "h:1"),
            "");
}

}  // namespace
}  // namespace trainstep
