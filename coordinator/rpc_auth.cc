#include "coordinator/rpc_auth.h"

#include <grpc/grpc_security_constants.h>
#include <sys/stat.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/address.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace trainstep {
namespace {

constexpr int kLogBurst = 10;  // refusal lines per second

FileStamp StampOf(const std::string& path) {
  struct stat st;
  if (path.empty() || stat(path.c_str(), &st) != 0) return FileStamp{};
  return FileStamp{static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                   static_cast<int64_t>(st.st_size), static_cast<uint64_t>(st.st_ino)};
}

// The file's bytes and, first, its stamp (a change after the stamp is seen at the next check).
absl::StatusOr<std::string> ReadAuthFile(const std::string& path, const char* flag,
                                         FileStamp* stamp) {
  *stamp = StampOf(path);
  return ReadNamedFile(path, flag);
}

// "unauthenticated" | "permission_denied": the metric's code label.
std::string CodeLabel(absl::StatusCode code) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

}  // namespace

absl::StatusOr<ServerSecurity> ResolveServerSecurity(const ServerSecurityFlags& f) {
  ServerSecurity s;
  const bool any_tls = !f.tls_cert.empty() || !f.tls_key.empty() || !f.tls_client_ca.empty() ||
                       !f.auth_certs.empty() || !f.auth_tokens.empty();
  if (!any_tls) {
    if (!IsLoopbackAddress(f.listen)) {
      if (!f.insecure) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--listen ", f.listen,
            " is not a loopback address and gRPC here is plaintext: secure it with --tls-cert "
            "and --tls-key (and --tls-client-ca or --auth-tokens), or pass --insecure to serve "
            "it unauthenticated on a private network"));
      }
      s.warnings.push_back(absl::StrCat(
          "serving plaintext gRPC without authentication on ", f.listen,
          " (--insecure): anyone who reaches this port can submit and cancel jobs and act as a "
          "worker"));
    }
    return s;
  }
  if (f.insecure) {
    return absl::InvalidArgumentError(
        "--insecure contradicts the TLS and auth flags given: drop it (a secured port is not "
        "plaintext)");
  }
  if (f.tls_cert.empty() || f.tls_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.tls_cert.empty() ? "--tls-key" : "--tls-cert",
        f.tls_cert.empty() == f.tls_key.empty() ? " and the others" : "",
        " need TLS: give the coordinator's certificate and key with --tls-cert and --tls-key"));
  }
  if (!f.auth_certs.empty() && f.tls_client_ca.empty()) {
    return absl::InvalidArgumentError(
        "--auth-certs maps client certificates to roles: it needs --tls-client-ca, the CA "
        "that signs them");
  }
  if (f.tls_client_ca.empty() && f.auth_tokens.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert alone authenticates nobody, and a secured coordinator serves nothing "
        "unauthenticated but health: add --tls-client-ca (client certificates, mTLS) and/or "
        "--auth-tokens (bearer tokens)");
  }
  ServerTls tls;
  tls.cert = f.tls_cert;
  tls.key = f.tls_key;
  tls.client_ca = f.tls_client_ca;
  // With tokens a client may come without a certificate; one it presents is still verified.
  tls.client_cert_optional = !f.auth_tokens.empty();
  tls.reload_interval = f.reload_interval;
  s.tls = tls;
  s.authenticate = true;
  s.auth_certs = f.auth_certs;
  s.auth_tokens = f.auth_tokens;
  if (!f.tls_client_ca.empty() && f.auth_certs.empty()) {
    s.warnings.push_back(absl::StrCat(
        "no --auth-certs: every client certificate that ", f.tls_client_ca,
        " (--tls-client-ca) signs is an admin (map SANs to roles with --auth-certs to narrow)"));
  }
  return s;
}

absl::StatusOr<std::unique_ptr<RpcAuthorizer>> RpcAuthorizer::Create(Options options) {
  std::unique_ptr<RpcAuthorizer> a(new RpcAuthorizer(std::move(options)));
  absl::MutexLock lock(&a->mu_);
  auto tables = std::make_shared<AuthTables>();
  RETURN_IF_ERROR(a->LoadCerts(tables.get(), &a->certs_stamp_));
  RETURN_IF_ERROR(a->LoadTokens(tables.get(), &a->tokens_stamp_));
  a->tables_ = std::move(tables);
  a->next_check_ = absl::Now() + a->options_.check_every;
  return a;
}

absl::Status RpcAuthorizer::LoadCerts(AuthTables* tables, FileStamp* stamp) const {
  if (options_.auth_certs.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::string text,
                   ReadAuthFile(options_.auth_certs, "--auth-certs", stamp));
  absl::StatusOr<std::vector<CertRule>> rules = ParseAuthCerts(text);
  if (!rules.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth-certs ", options_.auth_certs, ": ", rules.status().message()));
  }
  tables->certs_mapped = true;
  tables->certs = std::move(*rules);
  return absl::OkStatus();
}

absl::Status RpcAuthorizer::LoadTokens(AuthTables* tables, FileStamp* stamp) const {
  if (options_.auth_tokens.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::string text,
                   ReadAuthFile(options_.auth_tokens, "--auth-tokens", stamp));
  absl::StatusOr<std::vector<TokenRule>> rules = ParseAuthTokens(text);
  if (!rules.ok()) {
    // The message names the line, never its token.
    return absl::InvalidArgumentError(
        absl::StrCat("--auth-tokens ", options_.auth_tokens, ": ", rules.status().message()));
  }
  tables->tokens_enabled = true;
  tables->tokens = std::move(*rules);
  return absl::OkStatus();
}

std::shared_ptr<const AuthTables> RpcAuthorizer::Tables() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now < next_check_) return tables_;
  next_check_ = now + options_.check_every;
  const bool certs_changed = !(StampOf(options_.auth_certs) == certs_stamp_);
  const bool tokens_changed = !(StampOf(options_.auth_tokens) == tokens_stamp_);
  if (!certs_changed && !tokens_changed) return tables_;
  auto tables = std::make_shared<AuthTables>(*tables_);
  bool replaced = false;
  // A stamp is taken whether or not its file parses (ReadAuthFile), so a bad file is reported
  // once, and read again when it changes again.
  for (const auto& [changed, load, stamp] :
       {std::make_tuple(certs_changed, &RpcAuthorizer::LoadCerts, &certs_stamp_),
        std::make_tuple(tokens_changed, &RpcAuthorizer::LoadTokens, &tokens_stamp_)}) {
    if (!changed) continue;
    AuthTables loaded = *tables;
    const absl::Status s = (this->*load)(&loaded, stamp);
    if (!s.ok()) {
      LogError(absl::StrCat("keeping the previous roles: ", s.message()));
      continue;
    }
    *tables = std::move(loaded);
    replaced = true;
  }
  if (!replaced) return tables_;
  tables_ = std::move(tables);
  LogInfo(absl::StrCat("re-read the roles: ",
                       tables_->certs_mapped ? absl::StrCat(tables_->certs.size(), " SANs (",
                                                            options_.auth_certs, ")")
                                             : "",
                       tables_->certs_mapped && tables_->tokens_enabled ? ", " : "",
                       tables_->tokens_enabled ? absl::StrCat(tables_->tokens.size(), " tokens (",
                                                              options_.auth_tokens, ")")
                                               : ""));
  return tables_;
}

CallCredentials CallCredentialsOf(const grpc::ServerContextBase& ctx) {
  CallCredentials c;
  const auto& md = ctx.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    c.authorization = std::string(it->second.data(), it->second.size());
  }
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr) return c;
  // Only a verified certificate is there: the port asks for none or verifies what it gets.
  c.has_certificate = !auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty();
  if (!c.has_certificate) return c;
  constexpr std::pair<const char*, const char*> kSans[] = {
      {GRPC_PEER_DNS_PROPERTY_NAME, "DNS:"},
      {GRPC_PEER_URI_PROPERTY_NAME, "URI:"},
      {GRPC_PEER_EMAIL_PROPERTY_NAME, "email:"},
      {GRPC_PEER_IP_PROPERTY_NAME, "IP:"},
  };
  for (const auto& [property, prefix] : kSans) {
    for (const grpc::string_ref& v : auth->FindPropertyValues(property)) {
      c.certificate_sans.push_back(absl::StrCat(prefix, absl::string_view(v.data(), v.size())));
    }
  }
  for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
    c.certificate_cn = std::string(v.data(), v.size());
  }
  return c;
}

absl::StatusOr<Caller> RpcAuthorizer::Check(const grpc::ServerContextBase& ctx,
                                            absl::string_view method, absl::string_view job_id) {
  const std::shared_ptr<const AuthTables> tables = Tables();
  const absl::StatusOr<std::optional<Principal>> who = Identify(CallCredentialsOf(ctx), *tables);
  absl::StatusOr<Caller> caller = Authorize(method, who, job_id);
  if (!caller.ok()) {
    std::string name = "anonymous";
    if (who.ok() && who->has_value())
      name = absl::StrCat((*who)->source, " \"", (*who)->name, "\"");
    if (!who.ok()) name = "a bad credential";
    Refused(method, absl::StrCat(name, " at ", ctx.peer()), caller.status());
  }
  return caller;
}

void RpcAuthorizer::Refused(absl::string_view method, absl::string_view who,
                            const absl::Status& status) {
  if (options_.metrics != nullptr)
    options_.metrics->OnAuthFailure(method, CodeLabel(status.code()));
  std::string line;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - log_window_ >= absl::Seconds(1)) {
      if (not_logged_ > 0) {
        line = absl::StrCat(not_logged_, " more refused calls were not logged (at most ", kLogBurst,
                            " lines a second); the metric counts them all\n");
      }
      log_window_ = now;
      logged_in_window_ = 0;
      not_logged_ = 0;
    }
    if (logged_in_window_ >= kLogBurst) {
      ++not_logged_;
      return;
    }
    ++logged_in_window_;
  }
  if (!line.empty()) LogWarning(absl::StripTrailingAsciiWhitespace(line));
  LogWarning(absl::StrCat("refused ", method, " from ", who, ": ",
                          absl::StatusCodeToString(status.code()), ": ", status.message()));
}

}  // namespace trainstep
