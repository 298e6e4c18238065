// Who may call which coordinator method. Pure: the --auth-certs and --auth-tokens files come
// in as text, a call's credentials as plain values (rpc_auth.h takes them from gRPC and
// re-reads the files when they change), and Authorize is the one decision every RPC adapter
// asks for. Thread-compatible values and free functions.
//
// Roles: viewer (GetJob, ListJobs, WatchJob, ListUpdates, ListWorkers), submitter (viewer +
// SubmitJob, and CancelJob of its own jobs), admin (everything), worker (WorkerService, the
// key-value store included). "worker:JOB" is the worker role for job JOB only.
#ifndef TRAINSTEP_COORDINATOR_AUTH_H_
#define TRAINSTEP_COORDINATOR_AUTH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/job_registry.h"
#include "coordinator/rpc_table.h"

namespace trainstep {

enum Role : uint8_t {
  kRoleViewer = 1,
  kRoleSubmitter = 2,
  kRoleAdmin = 4,
  kRoleWorker = 8,
};

// What one line of an auth file grants.
struct Grant {
  uint8_t roles = 0;       // Role bits
  std::string worker_job;  // non-empty: the worker role is limited to this job
};

// "viewer,worker:job-3" → roles and limit; INVALID_ARGUMENT naming the bad role.
absl::StatusOr<Grant> ParseRoles(absl::string_view text);
// "submitter,worker:job-3": the grant written as a roles field is.
std::string RolesText(const Grant& grant);

// One line of --auth-certs: `SAN ROLE[,ROLE…]`, SAN as openssl prints it (DNS:name, URI:uri,
// email:address, IP:address).
struct CertRule {
  std::string san;
  Grant grant;
};
// One line of --auth-tokens: `TOKEN PRINCIPAL ROLE[,ROLE…]`.
struct TokenRule {
  std::string token;
  std::string principal;
  Grant grant;
};

// Blank lines and lines starting with # are skipped. INVALID_ARGUMENT "line N: …" for a line
// of the wrong shape, an unknown role, a SAN of an unknown type, a token shorter than
// kMinTokenBytes or given twice.
inline constexpr size_t kMinTokenBytes = 16;
absl::StatusOr<std::vector<CertRule>> ParseAuthCerts(absl::string_view text);
absl::StatusOr<std::vector<TokenRule>> ParseAuthTokens(absl::string_view text);

// How this coordinator authenticates callers.
struct AuthTables {
  bool tokens_enabled = false;  // --auth-tokens given
  std::vector<TokenRule> tokens;
  bool certs_mapped = false;    // --auth-certs given: only the SANs listed have roles
  std::vector<CertRule> certs;  // (without it every verified certificate is admin)
};

// What one call brought: its "authorization" header and its verified client certificate.
struct CallCredentials {
  std::optional<std::string> authorization;
  bool has_certificate = false;
  std::vector<std::string> certificate_sans;  // "DNS:…", "URI:…", "email:…", "IP:…"
  std::string certificate_cn;
};

struct Principal {
  std::string name;    // the token's PRINCIPAL, or the certificate's SAN (CN:… without one)
  std::string source;  // "token" | "certificate"
  Grant grant;
};

// The caller: a bearer token when the call carries one (whatever certificate it also has),
// else its certificate: the first --auth-certs line naming one of its SANs (a certificate
// listed nowhere is a principal without roles). nullopt: no credential. UNAUTHENTICATED for a
// header that is not "Bearer TOKEN", a token not in --auth-tokens, or a token sent to a
// coordinator without --auth-tokens.
absl::StatusOr<std::optional<Principal>> Identify(const CallCredentials& call,
                                                  const AuthTables& tables);

// By method name ("SubmitJob", "StoreGet"): the two services' names are all distinct. nullopt
// for a method with no rule, which nobody may call.
std::optional<Access> AccessOf(absl::string_view method);

// The decision for a call of `method` (about job `job_id`, "" if its request names none) by
// `who` (Identify's answer): the Caller to pass on (its principal is recorded as a job's owner
// on SubmitJob; own_jobs_only restricts CancelJob), or UNAUTHENTICATED (no credential, a bad
// one) or PERMISSION_DENIED (a role that does not allow it, or a worker limited to another
// job), its message naming the principal and what the method needs.
absl::StatusOr<Caller> Authorize(absl::string_view method,
                                 const absl::StatusOr<std::optional<Principal>>& who,
                                 absl::string_view job_id);

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_AUTH_H_
