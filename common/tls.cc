#include "common/tls.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/env.h"
#include "common/status_macros.h"

namespace trainstep {
namespace {

// A flag's value, else its variable's; `source` says which, for messages.
struct Setting {
  std::string value;
  std::string source;  // "--tls-ca" or "TRAINSTEP_TLS_CA"
};

Setting FlagOrEnv(const std::string& flag_value, const char* flag, const char* var,
                  const EnvLookup& env) {
  if (!flag_value.empty()) return {flag_value, flag};
  return {env(var), var};
}

unsigned ReloadSeconds(absl::Duration d) {
  return static_cast<unsigned>(std::max<int64_t>(1, absl::ToInt64Seconds(d)));
}

// Token bytes that may travel in an HTTP/2 header value: printable ASCII without spaces.
bool IsTokenText(absl::string_view token) {
  return std::all_of(token.begin(), token.end(), [](char c) { return c > ' ' && c < 127; });
}

}  // namespace

absl::StatusOr<std::string> ReadNamedFile(const std::string& path, const std::string& source) {
  absl::StatusOr<std::string> text = Env::Default()->ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " ", path, ": cannot read it (", text.status().message(), ")"));
  }
  return text;
}

EnvLookup ProcessEnv() {
  return [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v == nullptr ? "" : v);
  };
}

absl::Status CheckPemFile(const std::string& path, const std::string& source,
                          const std::string& label_suffix) {
  ASSIGN_OR_RETURN(const std::string text, ReadNamedFile(path, source));
  // "-----BEGIN CERTIFICATE-----", "-----BEGIN PRIVATE KEY-----", "-----BEGIN EC PRIVATE KEY-----"
  const size_t begin = text.find("-----BEGIN ");
  const size_t end = begin == std::string::npos ? begin : text.find("-----", begin + 11);
  if (begin == std::string::npos || end == std::string::npos ||
      !absl::EndsWith(absl::string_view(text).substr(begin + 11, end - begin - 11), label_suffix)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " ", path, ": not a PEM ", absl::AsciiStrToLower(label_suffix),
                     " file (no -----BEGIN ...", label_suffix, "----- line)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChannelSecurity> ResolveChannelSecurity(const ChannelSecurityFlags& flags,
                                                       const EnvLookup& env) {
  const Setting ca = FlagOrEnv(flags.tls_ca, "--tls-ca", "TRAINSTEP_TLS_CA", env);
  const Setting cert = FlagOrEnv(flags.tls_cert, "--tls-cert", "TRAINSTEP_TLS_CERT", env);
  const Setting key = FlagOrEnv(flags.tls_key, "--tls-key", "TRAINSTEP_TLS_KEY", env);
  ChannelSecurity s;
  if (!flags.token_file.empty()) {
    ASSIGN_OR_RETURN(const std::string text, ReadNamedFile(flags.token_file, "--token-file"));
    s.token = std::string(absl::StripAsciiWhitespace(text));
    if (s.token.empty() || !IsTokenText(s.token)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file ", flags.token_file,
                       ": must hold one token (printable, no spaces) and nothing else"));
    }
  } else {
    s.token = std::string(absl::StripAsciiWhitespace(env("TRAINSTEP_TOKEN")));
    if (!s.token.empty() && !IsTokenText(s.token)) {
      return absl::InvalidArgumentError("TRAINSTEP_TOKEN must be one token (printable, no spaces)");
    }
  }
  if (cert.value.empty() != key.value.empty()) {
    const Setting& given = cert.value.empty() ? key : cert;
    return absl::InvalidArgumentError(
        absl::StrCat(given.source,
                     " needs its pair: a client certificate is given with --tls-cert and its key "
                     "with --tls-key (or TRAINSTEP_TLS_CERT and TRAINSTEP_TLS_KEY)"));
  }
  if (ca.value.empty()) {
    if (!cert.value.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(cert.source,
                       " needs --tls-ca (or TRAINSTEP_TLS_CA): the CA that signs "
                       "the coordinator's certificate"));
    }
    if (!s.token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flags.token_file.empty() ? "TRAINSTEP_TOKEN" : "--token-file",
          " needs TLS: pass --tls-ca (or set TRAINSTEP_TLS_CA) so that the token does not cross "
          "the network in plaintext"));
    }
    return s;
  }
  RETURN_IF_ERROR(CheckPemFile(ca.value, ca.source, "CERTIFICATE"));
  s.files.ca = ca.value;
  if (!cert.value.empty()) {
    RETURN_IF_ERROR(CheckPemFile(cert.value, cert.source, "CERTIFICATE"));
    RETURN_IF_ERROR(CheckPemFile(key.value, key.source, "PRIVATE KEY"));
    s.files.cert = cert.value;
    s.files.key = key.value;
  }
  return s;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const ChannelSecurity& security) {
  if (!security.tls()) return grpc::InsecureChannelCredentials();
  const unsigned interval = ReloadSeconds(security.reload_interval);
  auto provider = security.files.cert.empty()
                      ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                            security.files.ca, interval)
                      : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                            security.files.key, security.files.cert, security.files.ca, interval);
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!security.files.cert.empty()) options.watch_identity_key_cert_pairs();
  std::shared_ptr<grpc::ChannelCredentials> tls = grpc::experimental::TlsCredentials(options);
  if (security.token.empty()) return tls;
  return grpc::CompositeChannelCredentials(tls, grpc::AccessTokenCredentials(security.token));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const ServerTls& tls) {
  RETURN_IF_ERROR(CheckPemFile(tls.cert, "--tls-cert", "CERTIFICATE"));
  RETURN_IF_ERROR(CheckPemFile(tls.key, "--tls-key", "PRIVATE KEY"));
  if (!tls.client_ca.empty()) {
    RETURN_IF_ERROR(CheckPemFile(tls.client_ca, "--tls-client-ca", "CERTIFICATE"));
  }
  const unsigned interval = ReloadSeconds(tls.reload_interval);
  auto provider = tls.client_ca.empty()
                      ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                            tls.key, tls.cert, interval)
                      : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                            tls.key, tls.cert, tls.client_ca, interval);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(tls.client_cert_optional
                                      ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
                                      : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

std::string ExplainSecurityFailure(const absl::Status& status, const ChannelSecurity& security,
                                   const std::string& address) {
  if (status.code() != absl::StatusCode::kUnavailable) return "";
  const absl::string_view m = status.message();
  const std::string at = absl::StrCat("the coordinator at ", address);
  // gRPC 1.51's words, by case: OpenSSL's reason for the handshake, its host name check, or a
  // peer that hung up during the handshake.
  if (absl::StrContains(m, "wrong version number") ||
      absl::StrContains(m, "packet length too long")) {
    return absl::StrCat(at,
                        " does not speak TLS (a plaintext port?): drop --tls-ca, or start it "
                        "with --tls-cert and --tls-key");
  }
  if (absl::StrContains(m, "certificate verify failed")) {
    return absl::StrCat(at, " presented a certificate that no CA in ", security.files.ca,
                        " signs: untrusted certificate");
  }
  if (absl::StrContains(m, "Hostname Verification Check failed")) {
    const size_t colon = address.rfind(':');
    std::string host = address.substr(0, colon == std::string::npos ? address.size() : colon);
    host = std::string(absl::StripPrefix(absl::StripSuffix(host, "]"), "["));
    return absl::StrCat(at, " presented a certificate that does not name \"", host,
                        "\": wrong host name (connect by a name or address its certificate "
                        "carries)");
  }
  if (absl::StrContains(m, "Socket closed") || absl::StrContains(m, "Connection reset")) {
    if (!security.tls()) {
      return absl::StrCat(at,
                          " closed the connection: if it serves TLS, pass --tls-ca (or set "
                          "TRAINSTEP_TLS_CA); a plaintext client cannot talk to a TLS port");
    }
    if (security.files.cert.empty()) {
      return absl::StrCat(at,
                          " closed the TLS connection: if it requires client certificates "
                          "(mTLS), pass --tls-cert and --tls-key");
    }
    return absl::StrCat(at,
                        " closed the TLS connection: if it requires client certificates, "
                        "it did not accept ",
                        security.files.cert, " (not signed by its --tls-client-ca?)");
  }
  return "";
}

}  // namespace trainstep
