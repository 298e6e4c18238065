// trainstep-coordinator: flags → objects → servers. Nothing testable lives here.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/address.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/port_file.h"
#include "common/status_macros.h"
#include "common/tls.h"
#include "coordinator/coordinator.h"
#include "coordinator/event_log.h"
#include "coordinator/limits.h"
#include "coordinator/prometheus_metrics.h"
#include "coordinator/rpc_auth.h"
#include "coordinator/server.h"

ABSL_FLAG(std::string, listen, trainstep::kDefaultCoordinator,
          "gRPC address (host:port; port 0 picks a free one, see --port-file)");
ABSL_FLAG(std::string, state_dir, "trainstep-state",
          "directory of the journal (write-ahead log + snapshots); created if missing");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus /metrics address (host:port; empty disables; port 0 picks a free one)");
ABSL_FLAG(std::string, port_file, "",
          "write the chosen gRPC and metrics ports here as JSON once listening");
ABSL_FLAG(int64_t, worker_lease_ms, 10000,
          "a worker that sends no heartbeat for this long is lost and its window aborted");
ABSL_FLAG(int64_t, reconnect_grace_ms, 3000,
          "after a restart, a worker not heard from within this is lost (capped at the lease); "
          "live workers reconnect within a fraction of a second");
ABSL_FLAG(int64_t, detach_grace_ms, 300,
          "a worker whose Attach stream dropped (its process died) is lost this long after, "
          "unless it reconnects or heartbeats (capped at the lease)");
ABSL_FLAG(int64_t, snapshot_every, 10000, "snapshot the journal after this many records");
ABSL_FLAG(int64_t, shutdown_grace_ms, 5000,
          "on SIGTERM, how long in-flight calls may take before they are cancelled");
ABSL_FLAG(std::string, log_format, "text", "stderr log lines: text | json");
ABSL_FLAG(int64_t, max_request_id_bytes, trainstep::Limits().max_request_id_bytes,
          "longest request_id accepted (SubmitJob, CancelJob, RegisterWorker)");
ABSL_FLAG(int64_t, max_name_bytes, trainstep::Limits().max_name_bytes,
          "longest job name, worker name and worker host accepted");
ABSL_FLAG(int64_t, max_message_bytes, trainstep::Limits().max_message_bytes,
          "a worker's failure message is truncated to this many bytes");
ABSL_FLAG(int64_t, max_spec_bytes, trainstep::Limits().max_spec_bytes,
          "largest resolved job spec accepted (serialized protobuf bytes)");
ABSL_FLAG(int64_t, max_jobs, trainstep::Limits().max_jobs,
          "jobs retained; beyond it the oldest finished job is forgotten, and a submit is "
          "refused when every retained job is still live");
ABSL_FLAG(int64_t, store_max_keys, trainstep::Limits().store_max_keys,
          "keys one job's rendezvous key-value store may hold");
ABSL_FLAG(int64_t, store_max_bytes, trainstep::Limits().store_max_bytes,
          "bytes (keys + values) one job's rendezvous key-value store may hold");
ABSL_FLAG(absl::Duration, finished_worker_retention, trainstep::Limits().finished_worker_retention,
          "how long `trainstep worker list` still shows a worker after it was lost (or replaced) "
          "or its job ended; 0 hides it at once, inf keeps it");
ABSL_FLAG(bool, insecure, false,
          "allow plaintext gRPC without authentication on a non-loopback address (inside a "
          "private network only; logs a warning)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the gRPC port (TLS; re-read when the file changes)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA(s) whose client certificates are accepted, and required unless --auth-tokens "
          "is given (mTLS)");
ABSL_FLAG(std::string, auth_certs, "",
          "roles of client certificates: one \"SAN ROLE[,ROLE...]\" per line, e.g. "
          "\"DNS:worker.example worker\" (re-read when it changes; without it every certificate "
          "--tls-client-ca signs is admin)");
ABSL_FLAG(std::string, auth_tokens, "",
          "bearer tokens: one \"TOKEN PRINCIPAL ROLE[,ROLE...]\" per line (re-read when it "
          "changes). Roles: viewer, submitter, admin, worker, worker:JOB");
ABSL_FLAG(absl::Duration, tls_reload_interval, trainstep::kDefaultTlsReloadInterval,
          "how often the TLS files are checked for a rotated certificate");
ABSL_FLAG(std::string, health_listen, "",
          "also serve grpc.health.v1 alone, in plaintext, on this host:port (kubelet probes; "
          "port 0 picks a free one)");

namespace trainstep {
namespace {

// --help: every flag above belongs to one group (help_process_test checks it).
BinaryHelp CoordinatorHelp() {
  BinaryHelp h;
  h.summary = "trainstep-coordinator: owns every job's optimizer-step protocol and journal.";
  h.usage = "  trainstep-coordinator [--listen HOST:PORT] [--state-dir DIR] [flags]\n";
  h.groups = {
      {"Connection", {"listen", "health_listen", "port_file", "shutdown_grace_ms"}},
      {"State", {"state_dir", "snapshot_every"}},
      {"Worker leases",
       {"worker_lease_ms", "reconnect_grace_ms", "detach_grace_ms", "finished_worker_retention"}},
      {"Limits",
       {"max_request_id_bytes", "max_name_bytes", "max_message_bytes", "max_spec_bytes", "max_jobs",
        "store_max_keys", "store_max_bytes"}},
      {"Metrics", {"metrics_listen"}},
      {"Logging", {"log_format"}},
      {"Security",
       {"insecure", "tls_cert", "tls_key", "tls_client_ca", "auth_certs", "auth_tokens",
        "tls_reload_interval"}},
  };
  h.environment = "  none: every setting is a flag\n";
  h.exit_codes =
      "  0  stopped by SIGTERM or SIGINT after draining its calls\n"
      "  1  refused to start (a bad flag, a state directory it cannot open, a port in\n"
      "     use), or stopped because the journal could not be written\n";
  h.example =
      "  trainstep-coordinator --listen 0.0.0.0:7070 --state-dir /var/lib/trainstep \\\n"
      "    --tls-cert coordinator.crt --tls-key coordinator.key --tls-client-ca ca.crt\n";
  return h;
}

// Every refusal to start and every fatal error: the reason on stderr, exit code 1.
int Fail(absl::string_view message) {
  LogError(message);
  return 1;
}

// What the flags ask for, checked before anything starts.
struct ServeOptions {
  std::string listen;
  std::string health_listen;  // empty: no health-only port
  ServerSecurity security;
  std::string metrics_listen;  // empty: no Prometheus endpoint
  std::string port_file;       // empty: none written
  absl::Duration shutdown_grace;
  CoordinatorOptions coordinator;  // but its metrics, which Main starts
};

absl::StatusOr<Limits> LimitsFromFlags() {
  Limits limits;
  limits.max_request_id_bytes = absl::GetFlag(FLAGS_max_request_id_bytes);
  limits.max_name_bytes = absl::GetFlag(FLAGS_max_name_bytes);
  limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  limits.max_spec_bytes = absl::GetFlag(FLAGS_max_spec_bytes);
  limits.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  limits.store_max_keys = absl::GetFlag(FLAGS_store_max_keys);
  limits.store_max_bytes = absl::GetFlag(FLAGS_store_max_bytes);
  limits.finished_worker_retention = absl::GetFlag(FLAGS_finished_worker_retention);
  RETURN_IF_ERROR(ValidateLimits(limits));
  return limits;
}

absl::StatusOr<ServeOptions> OptionsFromFlags() {
  ServeOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.health_listen = absl::GetFlag(FLAGS_health_listen);
  ServerSecurityFlags security;
  security.listen = o.listen;
  security.insecure = absl::GetFlag(FLAGS_insecure);
  security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  security.tls_key = absl::GetFlag(FLAGS_tls_key);
  security.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  security.auth_certs = absl::GetFlag(FLAGS_auth_certs);
  security.auth_tokens = absl::GetFlag(FLAGS_auth_tokens);
  security.reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  ASSIGN_OR_RETURN(o.security, ResolveServerSecurity(security));
  if (absl::GetFlag(FLAGS_worker_lease_ms) < 100) {
    return absl::InvalidArgumentError("--worker_lease_ms must be ≥ 100");
  }
  if (absl::GetFlag(FLAGS_reconnect_grace_ms) < 100) {
    return absl::InvalidArgumentError("--reconnect_grace_ms must be ≥ 100");
  }
  if (absl::GetFlag(FLAGS_detach_grace_ms) < 0) {
    return absl::InvalidArgumentError("--detach_grace_ms must be ≥ 0");
  }
  if (absl::GetFlag(FLAGS_snapshot_every) < 1) {
    return absl::InvalidArgumentError("--snapshot_every must be ≥ 1");
  }
  ASSIGN_OR_RETURN(o.coordinator.limits, LimitsFromFlags());
  o.coordinator.state_dir = absl::GetFlag(FLAGS_state_dir);
  o.coordinator.machine.worker_lease = absl::Milliseconds(absl::GetFlag(FLAGS_worker_lease_ms));
  o.coordinator.machine.detach_grace = absl::Milliseconds(absl::GetFlag(FLAGS_detach_grace_ms));
  o.coordinator.machine.reconnect_grace =
      absl::Milliseconds(absl::GetFlag(FLAGS_reconnect_grace_ms));
  o.coordinator.snapshot_every_records = static_cast<uint64_t>(absl::GetFlag(FLAGS_snapshot_every));
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.port_file = absl::GetFlag(FLAGS_port_file);
  o.shutdown_grace = absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms));
  return o;
}

// Signals go to one thread, which starts the drain: blocked here, before any thread starts
// (threads inherit the mask), and waited for by WaitForStop.
sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Null without --metrics-listen.
absl::StatusOr<std::unique_ptr<PrometheusMetrics>> StartPrometheus(const std::string& listen) {
  if (listen.empty()) return std::unique_ptr<PrometheusMetrics>();
  return PrometheusMetrics::Start(listen);
}

// Once listening: the addresses on stderr, and the chosen ports in --port-file.
absl::Status AnnounceListening(const ServeOptions& o, const CoordinatorServer& server,
                               const PrometheusMetrics* prometheus) {
  const int port = server.port();
  const std::string host = o.listen.substr(0, o.listen.rfind(':'));
  const int metrics_port = prometheus ? prometheus->port() : 0;
  const int health_port = server.health_port();
  const std::string health_host = o.health_listen.substr(0, o.health_listen.rfind(':'));
  LogInfo(absl::StrCat(
      "trainstep-coordinator listening on ", host, ":", port,
      o.security.tls.has_value()
          ? (o.security.tls->client_ca.empty()
                 ? " (TLS, bearer tokens)"
                 : (o.security.auth_tokens.empty() ? " (mTLS)" : " (mTLS or bearer tokens)"))
          : " (plaintext)",
      " (state in ", o.coordinator.state_dir, ")",
      health_port != 0 ? absl::StrCat(", health on ", health_host, ":", health_port) : "",
      prometheus
          ? absl::StrCat(", metrics on http://", prometheus->host(), ":", metrics_port, "/metrics")
          : ""));
  if (o.port_file.empty()) return absl::OkStatus();
  return WritePortFile(
      o.port_file,
      {{"grpc_port", port}, {"metrics_port", metrics_port}, {"health_port", health_port}});
}

// Returns on SIGTERM or SIGINT. A journal that cannot be written does not stop the process:
// the coordinator holds its decisions and resumes by itself (a restart would not help, and
// would drop the reads it still serves).
void WaitForStop(sigset_t* signals) {
  siginfo_t info;
  while (sigwaitinfo(signals, &info) < 0) {
    // EINTR: another signal's handler ran; keep waiting for ours.
  }
  LogInfo(absl::StrCat("received ", info.si_signo == SIGTERM ? "SIGTERM" : "SIGINT", "; draining"));
}

// Opens the journal, serves until WaitForStop returns, then drains. Returns the exit code.
int Serve(const ServeOptions& o, const PrometheusMetrics* prometheus, sigset_t* signals) {
  absl::StatusOr<std::unique_ptr<Coordinator>> opened = Coordinator::Open(o.coordinator);
  if (!opened.ok()) {
    return Fail(absl::StrCat("cannot open the journal in ", o.coordinator.state_dir, ": ",
                             opened.status().message()));
  }
  std::unique_ptr<Coordinator> coordinator = std::move(*opened);
  for (const std::string& w : coordinator->recovery_warnings()) LogWarning(w);

  for (const std::string& w : o.security.warnings) LogWarning(w);
  ServerOptions server_options;
  server_options.address = o.listen;
  server_options.health_address = o.health_listen;
  std::unique_ptr<RpcAuthorizer> auth;
  if (o.security.tls.has_value()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        ServerCredentials(*o.security.tls);
    if (!credentials.ok()) return Fail(credentials.status().message());
    server_options.credentials = *credentials;
  }
  if (o.security.authenticate) {
    RpcAuthorizer::Options auth_options;
    auth_options.auth_certs = o.security.auth_certs;
    auth_options.auth_tokens = o.security.auth_tokens;
    auth_options.metrics = o.coordinator.metrics;
    absl::StatusOr<std::unique_ptr<RpcAuthorizer>> created =
        RpcAuthorizer::Create(std::move(auth_options));
    if (!created.ok()) return Fail(created.status().message());
    auth = std::move(*created);
    server_options.auth = auth.get();
  }
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> started =
      CoordinatorServer::Start(coordinator.get(), server_options);
  if (!started.ok()) return Fail(started.status().message());
  std::unique_ptr<CoordinatorServer> server = std::move(*started);
  if (absl::Status s = AnnounceListening(o, *server, prometheus); !s.ok()) {
    return Fail(s.message());
  }

  WaitForStop(signals);
  server->Shutdown(o.shutdown_grace);
  server.reset();
  // Stopped while holding: what was not durable is lost with the process (none was answered).
  const bool deciding = coordinator->deciding();
  coordinator.reset();  // flushes the journal
  LogInfo("stopped");
  return deciding ? 0 : 1;
}

int Main(int argc, char** argv) {
  if (absl::Status s =
          ParseCommandLineAndLogFormat(argc, argv, CoordinatorHelp(), FLAGS_log_format);
      !s.ok()) {
    return Fail(s.message());
  }
  absl::StatusOr<ServeOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(options.status().message());
  sigset_t signals = BlockStopSignals();

  EventLog event_log;
  absl::StatusOr<std::unique_ptr<PrometheusMetrics>> prometheus =
      StartPrometheus(options->metrics_listen);
  if (!prometheus.ok()) return Fail(prometheus.status().message());
  std::vector<CoordinatorMetrics*> sinks = {&event_log};
  if (*prometheus) sinks.push_back(prometheus->get());
  FanoutMetrics metrics(sinks);
  options->coordinator.metrics = &metrics;
  return Serve(*options, prometheus->get(), &signals);
}

}  // namespace
}  // namespace trainstep

int main(int argc, char** argv) { return trainstep::Main(argc, argv); }
