// trainstep-worker: flags → Worker. Nothing testable lives here.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/allowed_roots.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/port_file.h"
#include "common/status_macros.h"
#include "common/tls.h"
#include "worker/faults/fault_flags.h"
#include "worker/host/host_setup.h"
#include "worker/host/malloc_config.h"
#include "worker/link/compute_phase.h"
#include "worker/link/health_service.h"
#include "worker/metrics.h"
#include "worker/train/device.h"
#include "worker/train/generate.h"
#include "worker/worker.h"

ABSL_FLAG(std::string, coordinator, "",
          "coordinator address host:port (default: $TRAINSTEP_COORDINATOR, else 127.0.0.1:7070)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signs the coordinator's certificate: talk TLS to it (default: "
          "$TRAINSTEP_TLS_CA; none = plaintext)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate for mTLS (default: $TRAINSTEP_TLS_CERT; re-read when it "
          "changes)");
ABSL_FLAG(std::string, tls_key, "", "PEM key of --tls-cert (default: $TRAINSTEP_TLS_KEY)");
ABSL_FLAG(std::string, token_file, "",
          "file holding a bearer token sent on every call (default: $TRAINSTEP_TOKEN, the token "
          "itself); needs --tls-ca");
ABSL_FLAG(absl::Duration, tls_reload_interval, trainstep::kDefaultTlsReloadInterval,
          "how often the TLS files are checked for a rotated certificate");
ABSL_FLAG(std::string, allowed_roots, "",
          "DIR[,DIR…]: the only directories a job's data, model and checkpoint paths may be in "
          "(after resolving .. and symlinks); a component {owner} is the job's owner, "
          "percent-encoded (/data/{owner}: one subtree per tenant). Required with --tls-ca "
          "(/ allows every path); empty = any path the worker's user can reach. The worker's "
          "own TLS files, token file, service-account token and /proc are refused whatever "
          "the roots");
ABSL_FLAG(std::string, job, "", "job id to join (default: the oldest job that needs workers)");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Minutes(2),
          "how long to keep trying to register with a coordinator that does not answer (e.g. "
          "30s, 5m; 0 = forever); each failed attempt is logged, then the worker exits 1");
ABSL_FLAG(std::string, name, "", "name shown in `trainstep worker list` (default: host-pid)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "Prometheus /metrics address (host:port; empty disables; port 0 picks a free one)");
ABSL_FLAG(std::string, collective_host, "",
          "address peers reach this worker's collective at (default: 127.0.0.1 when the "
          "coordinator is on loopback, else this host's name)");
ABSL_FLAG(std::string, device, "auto",
          "auto | cpu | cuda | cuda:N. auto: cuda:$LOCAL_RANK (or cuda:0) when built with CUDA "
          "and a GPU is visible, else cpu; cuda: cuda:$LOCAL_RANK or cuda:0. N counts the "
          "devices CUDA_VISIBLE_DEVICES leaves visible");
ABSL_FLAG(int64_t, collective_timeout_ms, 120000,
          "rendezvous and all-reduce timeout; a dead peer is noticed within this");
ABSL_FLAG(bool, overlap_allreduce, true,
          "start each gradient bucket's all-reduce during the window's last backward, once its "
          "gradients are final (CPU workers; the same buckets and sums as after backward). "
          "false: all-reduce after backward, e.g. to compare or to rule it out");
ABSL_FLAG(bool, pipeline_begin, true,
          "send the next window's BeginWindow (its token count needs no weights) with this "
          "window's CompleteWindow, so that its answer comes with this window's decision: one "
          "call per window. false: each window's BeginWindow is sent when the window starts, "
          "e.g. to compare or rule it out");
ABSL_FLAG(std::string, log_format, "text", "stderr log lines: text | json");
ABSL_FLAG(std::string, health_listen, "",
          "gRPC health service address for a liveness probe (host:port; empty disables; port 0 "
          "picks a free one): NOT_SERVING once the compute thread is stuck in a step of its own "
          "work past the coordinator's hang deadline (spec.hang)");
ABSL_FLAG(std::string, port_file, "",
          "write {\"metrics_port\": N, \"health_port\": N} here once they listen");
ABSL_FLAG(bool, generate, false,
          "do not train: print text sampled from --checkpoint (a ckpt-<id> directory) and exit");
ABSL_FLAG(std::string, checkpoint, "", "with --generate: the ckpt-<id> directory to load");
ABSL_FLAG(std::string, prompt, "The ", "with --generate: the text to continue");
ABSL_FLAG(int32_t, tokens, 200, "with --generate: how many bytes to sample");
ABSL_FLAG(double, temperature, 0.8, "with --generate: sampling temperature");
ABSL_FLAG(int32_t, threads, 0,
          "compute threads (LibTorch intra-op and the BLAS); 0: $OMP_NUM_THREADS if set, else "
          "this process's cores / $LOCAL_WORLD_SIZE (workers on this host, default 1)");
ABSL_FLAG(bool, host_info, false,
          "do not train: print this host's CPU, native bf16, BLAS and threads as JSON and exit");

namespace trainstep {
namespace {

// --help: every flag above belongs to one group (help_process_test checks it).
BinaryHelp WorkerHelp() {
  BinaryHelp h;
  h.summary = "trainstep-worker: trains one data-parallel replica of a job for the coordinator.";
  h.usage =
      "  trainstep-worker [--coordinator HOST:PORT] [--job ID] [flags]\n"
      "  trainstep-worker --generate --checkpoint DIR/ckpt-<id> [--prompt TEXT]\n"
      "  trainstep-worker --host-info\n";
  h.groups = {
      {"Connection",
       {"coordinator", "job", "name", "connect_timeout", "collective_host",
        "collective_timeout_ms"}},
      {"Compute", {"device", "threads", "overlap_allreduce", "pipeline_begin"}},
      {"Data paths", {"allowed_roots"}},
      {"Metrics", {"metrics_listen", "health_listen", "port_file"}},
      {"Logging", {"log_format"}},
      {"Security", {"tls_ca", "tls_cert", "tls_key", "token_file", "tls_reload_interval"}},
      {"Other modes (print, then exit; no training)",
       {"host_info", "generate", "checkpoint", "prompt", "tokens", "temperature"}},
  };
  for (FlagGroup& g : TestFlagGroups()) h.groups.push_back(std::move(g));
  h.environment =
      "  TRAINSTEP_COORDINATOR   default for --coordinator\n"
      "  TRAINSTEP_TLS_CA, TRAINSTEP_TLS_CERT, TRAINSTEP_TLS_KEY\n"
      "                          defaults for --tls-ca, --tls-cert, --tls-key\n"
      "  TRAINSTEP_TOKEN         the bearer token, when --token-file is not given\n"
      "  LOCAL_RANK              --device auto|cuda: which GPU (cuda:$LOCAL_RANK)\n"
      "  CUDA_VISIBLE_DEVICES    the GPUs cuda:N counts\n"
      "  OMP_NUM_THREADS         --threads 0: the compute threads\n"
      "  LOCAL_WORLD_SIZE        --threads 0: workers on this host, sharing its cores\n";
  h.exit_codes =
      "  0  the job ended (done, cancelled, or failed by another rank: nothing to\n"
      "     restart), the coordinator drained this worker as a straggler (a standby\n"
      "     took its rank), or --generate / --host-info printed their output\n"
      "  1  this worker failed: no coordinator within --connect-timeout, an error in\n"
      "     its data, model, collective or checkpoint; also an unknown flag\n"
      "  2  refused to start: a flag or environment variable with a bad value\n";
  h.example =
      "  trainstep-worker --coordinator 10.0.0.5:7070 --job job-1 --allowed-roots /data\n"
      "  trainstep-worker --tls-ca ca.crt --tls-cert w.crt --tls-key w.key \\\n"
      "      --allowed-roots /data/shared,/data/{owner},/checkpoints/{owner}\n";
  return h;
}

// Every refusal to start: the reason on stderr, exit code 2.
int Fail(absl::string_view message) {
  LogError(message);
  return 2;
}

// --generate: prints text sampled from --checkpoint instead of training.
int RunGenerate() {
  GenerateOptions g;
  g.checkpoint = absl::GetFlag(FLAGS_checkpoint);
  g.prompt = absl::GetFlag(FLAGS_prompt);
  g.tokens = absl::GetFlag(FLAGS_tokens);
  g.temperature = absl::GetFlag(FLAGS_temperature);
  if (g.checkpoint.empty()) return Fail("--generate needs --checkpoint DIR/ckpt-<id>");
  absl::StatusOr<std::string> text = Generate(g);
  if (!text.ok()) {
    LogError(text.status().message());
    return 1;
  }
  std::cout << *text << std::endl;
  return 0;
}

// --coordinator, else $TRAINSTEP_COORDINATOR, else the default.
std::string CoordinatorFromFlags() {
  const std::string flag = absl::GetFlag(FLAGS_coordinator);
  if (!flag.empty()) return flag;
  const char* env = std::getenv("TRAINSTEP_COORDINATOR");
  return env != nullptr && *env != '\0' ? env : kDefaultCoordinator;
}

// --allowed-roots, with this worker's own secret files, and a word on stderr about what it
// allows. A TLS worker without roots is refused (RequireRootsWithTls).
absl::StatusOr<AllowedRoots> AllowedRootsFromFlags(const ChannelSecurity& security,
                                                   const std::string& token_file) {
  std::vector<Secret> secrets = ProcessSecrets();
  secrets.push_back({"TLS CA (--tls-ca)", security.files.ca});
  secrets.push_back({"TLS certificate (--tls-cert)", security.files.cert});
  secrets.push_back({"TLS key (--tls-key)", security.files.key});
  secrets.push_back({"token file (--token-file)", token_file});
  ASSIGN_OR_RETURN(AllowedRoots roots,
                   AllowedRoots::Parse(absl::GetFlag(FLAGS_allowed_roots), std::move(secrets)));
  RETURN_IF_ERROR(RequireRootsWithTls(security.tls(), roots));
  if (!roots.restricted()) {
    LogWarning(
        "no --allowed-roots: a job spec may make this worker read any file and write checkpoints "
        "anywhere its user can (its own secrets excepted); pass --allowed-roots DIR[,DIR…] "
        "outside a trusted setting");
  } else {
    LogInfo(absl::StrCat("job paths are limited to --allowed-roots ", roots.ToString()));
  }
  return roots;
}

// Everything but the endpoints, which StartEndpoints adds.
absl::StatusOr<WorkerOptions> OptionsFromFlags(const HostSetup& host, const TestHooks& hooks) {
  WorkerOptions options;
  options.cpu = host.cpu;
  options.faults = hooks.faults;
  options.coordinator = CoordinatorFromFlags();
  ChannelSecurityFlags security;
  security.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  security.tls_key = absl::GetFlag(FLAGS_tls_key);
  security.token_file = absl::GetFlag(FLAGS_token_file);
  ASSIGN_OR_RETURN(options.coordinator_security, ResolveChannelSecurity(security, ProcessEnv()));
  options.coordinator_security.reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  options.job_id = absl::GetFlag(FLAGS_job);
  options.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  if (options.connect_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--connect-timeout must be ≥ 0 (0 = forever)");
  }
  options.name = absl::GetFlag(FLAGS_name);
  ASSIGN_OR_RETURN(options.allowed_roots,
                   AllowedRootsFromFlags(options.coordinator_security, security.token_file));
  options.overlap_allreduce = absl::GetFlag(FLAGS_overlap_allreduce);
  options.pipeline_begin = absl::GetFlag(FLAGS_pipeline_begin);
  options.collective.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_collective_timeout_ms));
  options.collective.host = absl::GetFlag(FLAGS_collective_host);
  if (options.collective.host.empty()) {
    options.collective.host =
        IsLoopbackAddress(options.coordinator) ? "127.0.0.1" : LocalHostName();
  }
  ASSIGN_OR_RETURN(options.collective.device,
                   ChooseDevice(absl::GetFlag(FLAGS_device), DeviceEnvFromProcess()));
  LogInfo(absl::StrCat("device ", options.collective.device.str()));
  return options;
}

struct Endpoints {
  std::unique_ptr<WorkerMetrics> metrics;  // null without --metrics-listen
  std::unique_ptr<WorkerHealth> health;    // null without --health-listen
};

// The /metrics endpoint and the health service, then --port-file.
absl::StatusOr<Endpoints> StartEndpoints(const ComputePhase* phase) {
  Endpoints e;
  const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
  if (!listen.empty()) {
    ASSIGN_OR_RETURN(e.metrics, WorkerMetrics::Start(listen));
    LogInfo(absl::StrCat("metrics on http://", listen.substr(0, listen.rfind(':')), ":",
                         e.metrics->port(), "/metrics"));
  }
  const std::string health = absl::GetFlag(FLAGS_health_listen);
  if (!health.empty()) {
    ASSIGN_OR_RETURN(e.health, WorkerHealth::Start(health, phase));
    LogInfo(absl::StrCat("health on ", health.substr(0, health.rfind(':')), ":", e.health->port()));
  }
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    RETURN_IF_ERROR(WritePortFile(absl::GetFlag(FLAGS_port_file),
                                  {{"metrics_port", e.metrics ? e.metrics->port() : 0},
                                   {"health_port", e.health ? e.health->port() : 0}}));
  }
  return e;
}

// Trains until the job ends or this worker fails. Returns the exit code.
int RunWorker(WorkerOptions options) {
  Worker worker(std::move(options));
  WorkerExit exit;
  try {
    exit = worker.Run();
  } catch (const std::exception& e) {  // the last edge: never `terminate`, always a message
    exit = {1, absl::StrCat("unexpected error: ", e.what())};
  }
  if (exit.code == 0) {
    LogInfo(exit.message);
  } else {
    LogError(exit.message);
  }
  return exit.code;
}

int Main(int argc, char** argv) {
  // Before the first tensor: steady-state micro-steps then reuse heap memory (malloc_config.h).
  ConfigureMallocForTraining();
  if (absl::Status s = RefuseTestFlagsUnlessTesting(argc, argv); !s.ok()) return Fail(s.message());
  if (absl::Status s = ParseCommandLineAndLogFormat(argc, argv, WorkerHelp(), FLAGS_log_format);
      !s.ok()) {
    return Fail(s.message());
  }
  absl::StatusOr<TestHooks> hooks = TestHooksFromFlags();
  if (!hooks.ok()) return Fail(hooks.status().message());
  absl::StatusOr<HostSetup> host = SetUpHost(absl::GetFlag(FLAGS_threads), hooks->cpuinfo_file);
  if (!host.ok()) return Fail(host.status().message());
  if (absl::GetFlag(FLAGS_host_info)) {
    std::cout << HostJson(*host) << std::endl;
    return 0;
  }
  if (absl::GetFlag(FLAGS_generate)) return RunGenerate();

  LogInfo(DescribeHost(*host));
  for (const std::string& w : HostWarnings(*host)) LogWarning(w);
  absl::StatusOr<WorkerOptions> options = OptionsFromFlags(*host, *hooks);
  if (!options.ok()) return Fail(options.status().message());
  ComputePhase phase;  // outlives the worker and the health service
  absl::StatusOr<Endpoints> endpoints = StartEndpoints(&phase);
  if (!endpoints.ok()) return Fail(endpoints.status().message());
  options->metrics = endpoints->metrics.get();
  options->compute_phase = &phase;
  return RunWorker(*std::move(options));
}

}  // namespace
}  // namespace trainstep

int main(int argc, char** argv) { return trainstep::Main(argc, argv); }
