// Credentials for every gRPC port and channel: TLS from PEM files that gRPC re-reads when they
// change (a certificate rotated on disk, as cert-manager does it, is used for the next
// handshake without a restart), mutual TLS, and a bearer token per call. The flags and their
// TRAINSTEP_TLS_* / TRAINSTEP_TOKEN fallbacks are resolved here, once, for the worker, the CLI
// and the tests; errors name the flag or the variable and the file.
#ifndef TRAINSTEP_COMMON_TLS_H_
#define TRAINSTEP_COMMON_TLS_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainstep {

// How often gRPC looks at the certificate files for a change.
inline constexpr absl::Duration kDefaultTlsReloadInterval = absl::Seconds(60);

// PEM files; "" = not given.
struct TlsFiles {
  std::string ca;    // certificates that may sign the peer's certificate
  std::string cert;  // this side's certificate chain
  std::string key;   // its private key
};

// How a client (worker, CLI, test) reaches the coordinator. Plaintext unless `files.ca` is set.
struct ChannelSecurity {
  TlsFiles files;     // ca set: TLS, the coordinator verified against it (and its host name)
  std::string token;  // sent as "authorization: Bearer TOKEN" on every call; needs TLS
  absl::Duration reload_interval = kDefaultTlsReloadInterval;

  bool tls() const { return !files.ca.empty(); }
};

// What the command line gave, before the environment fills the gaps ("" = not given).
struct ChannelSecurityFlags {
  std::string tls_ca, tls_cert, tls_key, token_file;
};

// getenv, injectable for tests ("" = unset).
using EnvLookup = std::function<std::string(const char* name)>;
EnvLookup ProcessEnv();

// Each flag, else its variable: --tls-ca / TRAINSTEP_TLS_CA, --tls-cert / TRAINSTEP_TLS_CERT,
// --tls-key / TRAINSTEP_TLS_KEY, --token-file FILE / TRAINSTEP_TOKEN (the token itself).
// INVALID_ARGUMENT naming the flag or variable: a file that cannot be read or holds no PEM
// block of its kind, a certificate without its key (or the reverse), a client certificate or a
// token without --tls-ca (a token must not cross the network in plaintext), an empty token.
absl::StatusOr<ChannelSecurity> ResolveChannelSecurity(const ChannelSecurityFlags& flags,
                                                       const EnvLookup& env);

// Plaintext, or TLS whose files are watched for rotation, plus the bearer token.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const ChannelSecurity& security);

// The coordinator's side: TLS with `cert` and `key`; with `client_ca`, clients' certificates
// are verified against it, and required unless `client_cert_optional` (bearer tokens are the
// other way in, so a client may come without one).
struct ServerTls {
  std::string cert, key, client_ca;
  bool client_cert_optional = false;
  absl::Duration reload_interval = kDefaultTlsReloadInterval;
};

// INVALID_ARGUMENT naming the flag (--tls-cert, --tls-key, --tls-client-ca) and the file
// for a file that cannot be read or is not PEM of its kind.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const ServerTls& tls);

// A file a flag or variable names: its bytes, or INVALID_ARGUMENT "SOURCE PATH: cannot read
// it (why)".
absl::StatusOr<std::string> ReadNamedFile(const std::string& path, const std::string& source);

// Reads `path`, given as `source` ("--tls-ca" or "TRAINSTEP_TLS_CA"), and checks that it holds
// a PEM block whose label ends in `label_suffix` ("CERTIFICATE", "PRIVATE KEY").
absl::Status CheckPemFile(const std::string& path, const std::string& source,
                          const std::string& label_suffix);

// A sentence for a failed call that says what went wrong with the connection's security, when
// the status shows one: plaintext against a TLS port, TLS against a plaintext one, a
// coordinator certificate the CA does not sign, a host name the certificate does not carry, a
// client certificate the coordinator refused. "" when the status is about something else.
std::string ExplainSecurityFailure(const absl::Status& status, const ChannelSecurity& security,
                                   const std::string& address);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_TLS_H_
