#include "coordinator/auth.h"

#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "coordinator/rpc_table.h"

namespace trainstep {
namespace {

constexpr struct {
  Role role;
  const char* name;
} kRoles[] = {
    {kRoleViewer, "viewer"},
    {kRoleSubmitter, "submitter"},
    {kRoleAdmin, "admin"},
    {kRoleWorker, "worker"},
};

// The SAN types gRPC reports for a verified certificate (rpc_auth.cc reads them).
constexpr const char* kSanTypes[] = {"DNS:", "URI:", "email:", "IP:"};

// Every method of JobService and WorkerService, and what it needs (rpc_table.h).
#define TRAINSTEP_UNARY_ACCESS(Method, Req, Resp, access) {#Method, Access::access},
#define TRAINSTEP_STREAM_ACCESS(Method, access) {#Method, Access::access},
constexpr struct {
  const char* method;
  Access access;
} kMethods[] = {TRAINSTEP_JOB_SERVICE_UNARY(TRAINSTEP_UNARY_ACCESS) TRAINSTEP_WORKER_SERVICE_UNARY(
    TRAINSTEP_UNARY_ACCESS) TRAINSTEP_STREAMS(TRAINSTEP_STREAM_ACCESS)};
#undef TRAINSTEP_UNARY_ACCESS
#undef TRAINSTEP_STREAM_ACCESS

// The roles that grant `access` (a submitter's cancel is narrowed to its own jobs later).
uint8_t RolesFor(Access access) {
  switch (access) {
    case Access::kView:
      return kRoleViewer | kRoleSubmitter | kRoleAdmin;
    case Access::kSubmit:
    case Access::kCancel:
      return kRoleSubmitter | kRoleAdmin;
    case Access::kWorker:
      return kRoleWorker | kRoleAdmin;
  }
  return 0;
}

// Compares every byte whatever the first difference, so that the time a lookup takes says
// nothing about how much of a guessed token was right.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The lines of an auth file that say something, with their numbers, split on whitespace.
std::vector<std::pair<int, std::vector<absl::string_view>>> Lines(absl::string_view text) {
  std::vector<std::pair<int, std::vector<absl::string_view>>> out;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    out.emplace_back(number, std::vector<absl::string_view>(
                                 absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty())));
  }
  return out;
}

absl::Status LineError(int number, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("line ", number, ": ", problem));
}

}  // namespace

absl::StatusOr<Grant> ParseRoles(absl::string_view text) {
  Grant grant;
  bool worker_seen = false;
  for (absl::string_view word : absl::StrSplit(text, ',')) {
    std::string job;
    if (absl::StartsWith(word, "worker:")) {
      job = std::string(word.substr(7));
      word = "worker";
      if (job.empty()) return absl::InvalidArgumentError("worker: needs a job id (worker:job-3)");
    }
    bool known = false;
    for (const auto& r : kRoles) {
      if (word != r.name) continue;
      known = true;
      grant.roles |= r.role;
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown role \"", word, "\" (roles: viewer, submitter, admin, worker, worker:JOB)"));
    }
    if (word == "worker") {
      if (worker_seen) {
        return absl::InvalidArgumentError(
            "the worker role is given twice (a worker principal "
            "is limited to at most one job)");
      }
      worker_seen = true;
      grant.worker_job = job;
    }
  }
  return grant;
}

std::string RolesText(const Grant& grant) {
  std::vector<std::string> names;
  for (const auto& r : kRoles) {
    if ((grant.roles & r.role) == 0) continue;
    names.push_back(r.role == kRoleWorker && !grant.worker_job.empty()
                        ? absl::StrCat("worker:", grant.worker_job)
                        : std::string(r.name));
  }
  return names.empty() ? "none" : absl::StrJoin(names, ",");
}

absl::StatusOr<std::vector<CertRule>> ParseAuthCerts(absl::string_view text) {
  std::vector<CertRule> rules;
  for (const auto& [number, words] : Lines(text)) {
    if (words.size() != 2) return LineError(number, "expected \"SAN ROLE[,ROLE...]\"");
    bool typed = false;
    for (const char* type : kSanTypes) typed = typed || absl::StartsWith(words[0], type);
    if (!typed || words[0].find(':') + 1 == words[0].size()) {
      return LineError(number, absl::StrCat("\"", words[0],
                                            "\" is not a SAN: DNS:name, URI:uri, email:address "
                                            "or IP:address (as openssl x509 -text prints them)"));
    }
    absl::StatusOr<Grant> grant = ParseRoles(words[1]);
    if (!grant.ok()) return LineError(number, grant.status().message());
    rules.push_back({std::string(words[0]), std::move(*grant)});
  }
  return rules;
}

absl::StatusOr<std::vector<TokenRule>> ParseAuthTokens(absl::string_view text) {
  std::vector<TokenRule> rules;
  for (const auto& [number, words] : Lines(text)) {
    if (words.size() != 3) return LineError(number, "expected \"TOKEN PRINCIPAL ROLE[,ROLE...]\"");
    if (words[0].size() < kMinTokenBytes) {
      return LineError(
          number, absl::StrCat("the token is ", words[0].size(), " bytes; at least ",
                               kMinTokenBytes, " are needed (openssl rand -hex 32 makes one)"));
    }
    for (const TokenRule& r : rules) {
      if (r.token == words[0]) {
        return LineError(number, absl::StrCat("this token is also the token of ", r.principal));
      }
    }
    absl::StatusOr<Grant> grant = ParseRoles(words[2]);
    if (!grant.ok()) return LineError(number, grant.status().message());
    rules.push_back({std::string(words[0]), std::string(words[1]), std::move(*grant)});
  }
  return rules;
}

absl::StatusOr<std::optional<Principal>> Identify(const CallCredentials& call,
                                                  const AuthTables& tables) {
  if (call.authorization.has_value()) {
    absl::string_view header = absl::StripAsciiWhitespace(*call.authorization);
    if (!absl::StartsWithIgnoreCase(header, "bearer ")) {
      return absl::UnauthenticatedError(
          "the authorization header is not \"Bearer TOKEN\" (a token from --token-file or "
          "TRAINSTEP_TOKEN)");
    }
    const absl::string_view token = absl::StripLeadingAsciiWhitespace(header.substr(7));
    if (!tables.tokens_enabled) {
      return absl::UnauthenticatedError(
          "a bearer token was sent, but this coordinator takes none (it was started without "
          "--auth-tokens): authenticate with a client certificate");
    }
    const TokenRule* found = nullptr;
    for (const TokenRule& r : tables.tokens) {
      if (ConstantTimeEquals(r.token, token)) found = &r;
    }
    if (found == nullptr) {
      return absl::UnauthenticatedError(
          "the bearer token is not one this coordinator knows (not in its --auth-tokens)");
    }
    return Principal{found->principal, "token", found->grant};
  }
  if (!call.has_certificate) return std::optional<Principal>();
  const std::string name = call.certificate_sans.empty() ? absl::StrCat("CN:", call.certificate_cn)
                                                         : call.certificate_sans.front();
  if (!tables.certs_mapped) {
    // Without --auth-certs, the CA of --tls-client-ca is the authority: it signs admins.
    return Principal{name, "certificate", Grant{kRoleAdmin, ""}};
  }
  for (const CertRule& r : tables.certs) {
    for (const std::string& san : call.certificate_sans) {
      if (san == r.san) return Principal{san, "certificate", r.grant};
    }
  }
  return Principal{name, "certificate", Grant{}};
}

std::optional<Access> AccessOf(absl::string_view method) {
  for (const auto& m : kMethods) {
    if (method == m.method) return m.access;
  }
  return std::nullopt;
}

absl::StatusOr<Caller> Authorize(absl::string_view method,
                                 const absl::StatusOr<std::optional<Principal>>& who,
                                 absl::string_view job_id) {
  if (!who.ok()) return who.status();
  if (!who->has_value()) {
    return absl::UnauthenticatedError(
        absl::StrCat(method,
                     " needs a credential: a client certificate (--tls-cert and --tls-key) or a "
                     "bearer token (--token-file or TRAINSTEP_TOKEN)"));
  }
  const Principal& p = **who;
  const std::optional<Access> access = AccessOf(method);
  const auto denied = [&](absl::string_view why) {
    return absl::PermissionDeniedError(absl::StrCat(p.source, " principal \"", p.name, "\" (roles ",
                                                    RolesText(p.grant), ") may not call ", method,
                                                    ": ", why));
  };
  if (!access.has_value()) return denied("no role may (the method has no rule)");
  const uint8_t allowed = RolesFor(*access);
  if ((p.grant.roles & allowed) == 0) {
    std::vector<std::string> needs;
    for (const auto& r : kRoles) {
      if ((allowed & r.role) != 0) needs.push_back(r.name);
    }
    return denied(absl::StrCat("it needs the role ", absl::StrJoin(needs, " or ")));
  }
  Caller caller;
  caller.principal = p.name;
  const bool admin = (p.grant.roles & kRoleAdmin) != 0;
  if (*access == Access::kCancel && !admin) caller.own_jobs_only = true;
  if (*access == Access::kWorker && !admin && !p.grant.worker_job.empty() &&
      job_id != p.grant.worker_job) {
    return denied(
        job_id.empty()
            ? absl::StrCat("it is a worker of ", p.grant.worker_job,
                           " only, and the call names no job (start the worker with "
                           "--job ",
                           p.grant.worker_job, ")")
            : absl::StrCat("it is a worker of ", p.grant.worker_job, " only, not of ", job_id));
  }
  return caller;
}

}  // namespace trainstep
