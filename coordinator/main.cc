// trainstep-coordinator: flags → objects → servers. Nothing testable lives here.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
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
#include "absl/synchronization/notification.h"
#include "common/flags.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "coordinator/event_log.h"
#include "coordinator/job_service.h"
#include "coordinator/prometheus_metrics.h"
#include "coordinator/worker_service.h"

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
  absl::SetProgramUsageMessage(
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
  absl::StatusOr<std::unique_ptr<Coordinator>> opened = Coordinator::Open(options);
  if (!opened.ok()) {
    return Fail(absl::StrCat("cannot open the journal in ", options.state_dir, ": ",
                             opened.status().message()));
  }
  std::unique_ptr<Coordinator> coordinator = std::move(*opened);
  for (const std::string& w : coordinator->recovery_warnings()) LogWarning(w);

  WorkerServiceImpl worker_service(coordinator.get());
  JobServiceImpl job_service(coordinator.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&worker_service);
  builder.RegisterService(&job_service);
  // Long-lived worker channels ping every 30 s; accept pings down to 10 s without calls.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return Fail(absl::StrCat("cannot listen on ", listen, " (in use, or not host:port?)"));
  }
  const std::string host = listen.substr(0, listen.rfind(':'));
  const int metrics_port = prometheus ? prometheus->port() : 0;
  LogInfo(absl::StrCat("trainstep-coordinator listening on ", host, ":", port, " (state in ",
                       options.state_dir, ")",
                       prometheus ? absl::StrCat(", metrics on http://", prometheus->host(), ":",
                                                 metrics_port, "/metrics")
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

  absl::Notification stop;
  std::thread driver([&] {
    while (!stop.HasBeenNotified()) {
      const absl::Time next = coordinator->Tick();
      if (!coordinator->healthy()) {
        LogError("the journal cannot be written; stopping (nothing unacknowledged was answered)");
        kill(getpid(), SIGTERM);
        return;
      }
      stop.WaitForNotificationWithDeadline(std::min(next, absl::Now() + absl::Seconds(1)));
    }
  });

  int signal = 0;
  sigwait(&signals, &signal);
  LogInfo(absl::StrCat("received ", signal == SIGTERM ? "SIGTERM" : "SIGINT", "; draining"));
  server->GetHealthCheckService()->SetServingStatus(false);
  coordinator->Shutdown();
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  stop.Notify();
  driver.join();
  const bool healthy = coordinator->healthy();
  coordinator.reset();  // flushes the journal
  LogInfo("stopped");
  return healthy ? 0 : 1;
}

}  // namespace
}  // namespace trainstep

int main(int argc, char** argv) { return trainstep::Main(argc, argv); }
