// trainstep-coordinator: flags → objects → servers. Nothing testable lives here.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "coordinator/event_log.h"
#include "coordinator/limits.h"
#include "coordinator/prometheus_metrics.h"
#include "coordinator/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "gRPC address (host:port; port 0 picks a free one, see --port-file)");
ABSL_FLAG(std::string, state_dir, "trainstep-state",
          "directory of the journal (write-ahead log + snapshots); created if missing");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus /metrics address (host:port; empty disables; port 0 picks a free one)");
ABSL_FLAG(std::string, port_file, "",
          "write the chosen gRPC and metrics ports here as JSON once listening");
ABSL_FLAG(int64_t, worker_lease_ms, 10000,
          "a worker that sends no heartbeat for this long is lost and its window aborted");
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
ABSL_FLAG(bool, insecure, false,
          "allow plaintext gRPC on a non-loopback address (inside a private network only)");

namespace trainstep {
namespace {

bool IsLoopback(const std::string& address) {
  return absl::StartsWith(address, "127.") || absl::StartsWith(address, "localhost:") ||
         absl::StartsWith(address, "[::1]:");
}

int Fail(const std::string& message) {
  LogError(message);
  return 1;
}

int Main(int argc, char** argv) {
  ConfigureUsage(
      "The trainstep coordinator: owns every job's optimizer-step protocol.\n"
      "Usage: trainstep-coordinator [--listen 127.0.0.1:7070] [--state-dir DIR] "
      "[--metrics-listen 127.0.0.1:9464]");
  std::vector<char*> args;
  std::vector<std::string> storage = NormalizeFlagNames(argc, argv, &args);
  absl::ParseCommandLine(static_cast<int>(args.size()) - 1, args.data());

  LogFormat format;
  if (!ParseLogFormat(absl::GetFlag(FLAGS_log_format), &format)) {
    return Fail(absl::StrCat("--log_format must be text or json, got \"",
                             absl::GetFlag(FLAGS_log_format), "\""));
  }
  SetLogFormat(format);
  const std::string listen = absl::GetFlag(FLAGS_listen);
  if (!IsLoopback(listen) && !absl::GetFlag(FLAGS_insecure)) {
    return Fail(absl::StrCat("--listen ", listen,
                             " is not a loopback address and gRPC here is plaintext; pass "
                             "--insecure to serve it on a private network"));
  }
  if (absl::GetFlag(FLAGS_worker_lease_ms) < 100) {
    return Fail("--worker_lease_ms must be ≥ 100");
  }
  if (absl::GetFlag(FLAGS_snapshot_every) < 1) return Fail("--snapshot_every must be ≥ 1");
  Limits limits;
  limits.max_request_id_bytes = absl::GetFlag(FLAGS_max_request_id_bytes);
  limits.max_name_bytes = absl::GetFlag(FLAGS_max_name_bytes);
  limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  limits.max_spec_bytes = absl::GetFlag(FLAGS_max_spec_bytes);
  limits.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  limits.store_max_keys = absl::GetFlag(FLAGS_store_max_keys);
  limits.store_max_bytes = absl::GetFlag(FLAGS_store_max_bytes);
  if (absl::Status s = ValidateLimits(limits); !s.ok()) return Fail(std::string(s.message()));

  // Signals go to one thread, which starts the drain.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  EventLog event_log;
  std::unique_ptr<PrometheusMetrics> prometheus;
  const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (!metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<PrometheusMetrics>> p = PrometheusMetrics::Start(metrics_listen);
    if (!p.ok()) return Fail(std::string(p.status().message()));
    prometheus = std::move(*p);
  }
  std::vector<CoordinatorMetrics*> sinks = {&event_log};
  if (prometheus) sinks.push_back(prometheus.get());
  FanoutMetrics metrics(sinks);

  CoordinatorOptions options;
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.machine.worker_lease = absl::Milliseconds(absl::GetFlag(FLAGS_worker_lease_ms));
  options.snapshot_every_records = static_cast<uint64_t>(absl::GetFlag(FLAGS_snapshot_every));
  options.metrics = &metrics;
  options.limits = limits;
  absl::StatusOr<std::unique_ptr<Coordinator>> opened = Coordinator::Open(options);
  if (!opened.ok()) {
    return Fail(absl::StrCat("cannot open the journal in ", options.state_dir, ": ",
                             opened.status().message()));
  }
  std::unique_ptr<Coordinator> coordinator = std::move(*opened);
  for (const std::string& w : coordinator->recovery_warnings()) LogWarning(w);

  absl::StatusOr<std::unique_ptr<CoordinatorServer>> started =
      CoordinatorServer::Start(coordinator.get(), listen);
  if (!started.ok()) return Fail(std::string(started.status().message()));
  std::unique_ptr<CoordinatorServer> server = std::move(*started);
  const int port = server->port();
  const std::string host = listen.substr(0, listen.rfind(':'));
  const int metrics_port = prometheus ? prometheus->port() : 0;
  LogInfo(absl::StrCat(
      "trainstep-coordinator listening on ", host, ":", port, " (state in ", options.state_dir, ")",
      prometheus
          ? absl::StrCat(", metrics on http://", prometheus->host(), ":", metrics_port, "/metrics")
          : ""));
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    const std::string path = absl::GetFlag(FLAGS_port_file);
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp);
      out << "{\"grpc_port\": " << port << ", \"metrics_port\": " << metrics_port << "}\n";
    }
    std::rename(tmp.c_str(), path.c_str());
  }

  // The journal failing is fatal: nothing more can be made durable. Watch for it.
  std::thread watchdog([&coordinator, &signals] {
    while (coordinator->healthy()) {
      timespec timeout{1, 0};
      siginfo_t info;
      if (sigtimedwait(&signals, &info, &timeout) > 0) {
        LogInfo(absl::StrCat("received ", info.si_signo == SIGTERM ? "SIGTERM" : "SIGINT",
                             "; draining"));
        return;
      }
    }
    LogError("the journal cannot be written; stopping (nothing unacknowledged was answered)");
  });
  watchdog.join();
  server->Shutdown(absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  server.reset();
  const bool healthy = coordinator->healthy();
  coordinator.reset();  // flushes the journal
  LogInfo("stopped");
  return healthy ? 0 : 1;
}

}  // namespace
}  // namespace trainstep

int main(int argc, char** argv) { return trainstep::Main(argc, argv); }
