// The coordinator's security, between its flags and gRPC: which port setup the flags ask for
// (ResolveServerSecurity), and RpcAuthorizer, the one check every RPC adapter makes
// (grpc_adapters.h): it reads a call's bearer token and verified client certificate, asks
// auth.h's Authorize, and counts and logs every refusal with its principal. The
// --auth-certs and --auth-tokens files are re-read when they change.
#ifndef TRAINSTEP_COORDINATOR_RPC_AUTH_H_
#define TRAINSTEP_COORDINATOR_RPC_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "coordinator/auth.h"
#include "coordinator/metrics.h"

namespace trainstep {

// The coordinator's security flags as given ("" = not given).
struct ServerSecurityFlags {
  std::string listen;
  bool insecure = false;
  std::string tls_cert, tls_key, tls_client_ca;
  std::string auth_certs, auth_tokens;
  absl::Duration reload_interval = kDefaultTlsReloadInterval;
};

// What the gRPC port serves.
struct ServerSecurity {
  std::optional<ServerTls> tls;  // nullopt: plaintext
  bool authenticate = false;     // every call but health needs a principal (any flag given)
  std::string auth_certs, auth_tokens;
  std::vector<std::string> warnings;  // to log at start
};

// INVALID_ARGUMENT naming the flags when they do not fit together: a certificate without its
// key, a client CA or an auth file without TLS, --auth-certs without --tls-client-ca, TLS that
// authenticates nobody (neither --tls-client-ca nor --auth-tokens), --insecure beside TLS, and
// plaintext on a non-loopback address without --insecure (which then warns).
absl::StatusOr<ServerSecurity> ResolveServerSecurity(const ServerSecurityFlags& flags);

// A file re-read when it changes (mtime, size or inode: a Kubernetes Secret's atomic swap).
struct FileStamp {
  int64_t mtime_ns = 0;
  int64_t size = -1;
  uint64_t inode = 0;
  bool operator==(const FileStamp& o) const {
    return std::tie(mtime_ns, size, inode) == std::tie(o.mtime_ns, o.size, o.inode);
  }
};

// Thread-safe.
class RpcAuthorizer {
 public:
  struct Options {
    std::string auth_certs;   // "" = none: every certificate --tls-client-ca signs is admin
    std::string auth_tokens;  // "" = no bearer tokens
    absl::Duration check_every = absl::Seconds(1);  // how often the files' stamps are looked at
    CoordinatorMetrics* metrics = nullptr;          // may be null
  };
  // Reads the files: an unreadable or invalid one refuses to start (INVALID_ARGUMENT naming it
  // and the line). A file that later turns invalid is logged and the previous tables kept.
  static absl::StatusOr<std::unique_ptr<RpcAuthorizer>> Create(Options options);

  // The check: the Caller for the handler, or UNAUTHENTICATED / PERMISSION_DENIED (counted
  // and logged).
  absl::StatusOr<Caller> Check(const grpc::ServerContextBase& ctx, absl::string_view method,
                               absl::string_view job_id);
  // A refusal the coordinator made itself (CancelJob of another principal's job).
  void Refused(absl::string_view method, absl::string_view who, const absl::Status& status);

  // The tables in force (re-read first if a file changed and `check_every` passed).
  std::shared_ptr<const AuthTables> Tables();

 private:
  explicit RpcAuthorizer(Options options) : options_(std::move(options)) {}
  // Reads and parses one file into `tables` (its half), stamping it.
  absl::Status LoadCerts(AuthTables* tables, FileStamp* stamp) const;
  absl::Status LoadTokens(AuthTables* tables, FileStamp* stamp) const;

  const Options options_;
  absl::Mutex mu_;
  // Each file's half is replaced only by a valid new version of that file.
  std::shared_ptr<const AuthTables> tables_ ABSL_GUARDED_BY(mu_);
  FileStamp certs_stamp_ ABSL_GUARDED_BY(mu_);
  FileStamp tokens_stamp_ ABSL_GUARDED_BY(mu_);
  absl::Time next_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Refusal lines: at most kLogBurst a second, then one line saying how many were not logged.
  absl::Time log_window_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int logged_in_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t not_logged_ ABSL_GUARDED_BY(mu_) = 0;
};

// What a call brought, read from gRPC: the "authorization" header and the verified client
// certificate's SANs (peer_dns, peer_uri, peer_email, peer_ip) and CN.
CallCredentials CallCredentialsOf(const grpc::ServerContextBase& ctx);

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_RPC_AUTH_H_
