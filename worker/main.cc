// trainstep-worker: flags → Worker. Nothing testable lives here.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/allowed_roots.h"
#include "common/flags.h"
#include "common/log.h"
#include "worker/device.h"
#include "worker/generate.h"
#include "worker/host_setup.h"
#include "worker/malloc_config.h"
#include "worker/metrics.h"
#include "worker/worker.h"

ABSL_FLAG(std::string, coordinator, "",
          "coordinator address host:port (default: $TRAINSTEP_COORDINATOR, else 127.0.0.1:7070)");
ABSL_FLAG(std::string, allowed_roots, "",
          "DIR[,DIR…]: the only directories a job's data, model and checkpoint paths may be in "
          "(after resolving .. and symlinks); empty = any path the worker's user can reach");
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
ABSL_FLAG(std::string, log_format, "text", "stderr log lines: text | json");
ABSL_FLAG(int64_t, debug_perturb_grad_window, 0,
          "TEST ONLY: perturb this worker's gradient in that window so replicas desync");
ABSL_FLAG(int64_t, debug_exit_in_eval, 0,
          "TEST ONLY: exit (code 3) during the evaluation of that update, after computing the "
          "held-out loss and before reporting it: a rank lost during an evaluation");
ABSL_FLAG(std::string, port_file, "",
          "write {\"metrics_port\": N} here once the metrics endpoint listens");
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
ABSL_FLAG(std::string, debug_cpuinfo, "",
          "TEST ONLY: read the CPU's description from this file instead of /proc/cpuinfo");

namespace trainstep {
namespace {

int Main(int argc, char** argv) {
  // Before the first tensor: steady-state micro-steps then reuse heap memory (malloc_config.h).
  ConfigureMallocForTraining();
  ConfigureUsage(
      "A trainstep worker: trains one data-parallel replica for the coordinator.\n"
      "Usage: trainstep-worker --coordinator HOST:PORT [--job ID] [--metrics-listen ADDR]");
  std::vector<char*> args;
  std::vector<std::string> storage = NormalizeFlagNames(argc, argv, &args);
  absl::ParseCommandLine(static_cast<int>(args.size()) - 1, args.data());

  LogFormat format;
  if (!ParseLogFormat(absl::GetFlag(FLAGS_log_format), &format)) {
    LogError("--log-format must be text or json");
    return 2;
  }
  SetLogFormat(format);

  absl::StatusOr<HostSetup> host =
      SetUpHost(absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_debug_cpuinfo));
  if (!host.ok()) {
    LogError(std::string(host.status().message()));
    return 2;
  }
  if (absl::GetFlag(FLAGS_host_info)) {
    std::cout << HostJson(*host) << std::endl;
    return 0;
  }

  if (absl::GetFlag(FLAGS_generate)) {
    GenerateOptions g;
    g.checkpoint = absl::GetFlag(FLAGS_checkpoint);
    g.prompt = absl::GetFlag(FLAGS_prompt);
    g.tokens = absl::GetFlag(FLAGS_tokens);
    g.temperature = absl::GetFlag(FLAGS_temperature);
    if (g.checkpoint.empty()) {
      LogError("--generate needs --checkpoint DIR/ckpt-<id>");
      return 2;
    }
    absl::StatusOr<std::string> text = Generate(g);
    if (!text.ok()) {
      LogError(std::string(text.status().message()));
      return 1;
    }
    std::cout << *text << std::endl;
    return 0;
  }

  LogInfo(DescribeHost(*host));
  for (const std::string& w : HostWarnings(*host)) LogWarning(w);

  WorkerOptions options;
  options.cpu = host->cpu;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (options.coordinator.empty()) {
    const char* env = std::getenv("TRAINSTEP_COORDINATOR");
    options.coordinator = env != nullptr && *env != '\0' ? env : "127.0.0.1:7070";
  }
  options.job_id = absl::GetFlag(FLAGS_job);
  options.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  if (options.connect_timeout < absl::ZeroDuration()) {
    LogError("--connect-timeout must be ≥ 0 (0 = forever)");
    return 2;
  }
  options.name = absl::GetFlag(FLAGS_name);
  absl::StatusOr<AllowedRoots> roots = AllowedRoots::Parse(absl::GetFlag(FLAGS_allowed_roots));
  if (!roots.ok()) {
    LogError(std::string(roots.status().message()));
    return 2;
  }
  options.allowed_roots = std::move(*roots);
  if (!options.allowed_roots.restricted()) {
    LogWarning(
        "no --allowed-roots: a job spec may make this worker read any file and write checkpoints "
        "anywhere its user can; pass --allowed-roots DIR[,DIR…] outside a trusted setting");
  } else {
    LogInfo(absl::StrCat("job paths are limited to --allowed-roots ",
                         options.allowed_roots.ToString()));
  }
  options.perturb_grad_window = absl::GetFlag(FLAGS_debug_perturb_grad_window);
  options.exit_in_eval_update = absl::GetFlag(FLAGS_debug_exit_in_eval);
  options.collective.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_collective_timeout_ms));
  options.collective.host = absl::GetFlag(FLAGS_collective_host);
  if (options.collective.host.empty()) {
    const bool loopback = absl::StartsWith(options.coordinator, "127.") ||
                          absl::StartsWith(options.coordinator, "localhost:");
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    options.collective.host = loopback ? "127.0.0.1" : host;
  }
  absl::StatusOr<at::Device> device =
      ChooseDevice(absl::GetFlag(FLAGS_device), DeviceEnvFromProcess());
  if (!device.ok()) {
    LogError(std::string(device.status().message()));
    return 2;
  }
  options.collective.device = *device;
  LogInfo(absl::StrCat("device ", device->str()));

  std::unique_ptr<WorkerMetrics> metrics;
  const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (!metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<WorkerMetrics>> m = WorkerMetrics::Start(metrics_listen);
    if (!m.ok()) {
      LogError(std::string(m.status().message()));
      return 2;
    }
    metrics = std::move(*m);
    options.metrics = metrics.get();
    LogInfo(absl::StrCat("metrics on http://", metrics_listen.substr(0, metrics_listen.rfind(':')),
                         ":", metrics->port(), "/metrics"));
  }
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    const std::string path = absl::GetFlag(FLAGS_port_file);
    {
      std::ofstream out(path + ".tmp");
      out << "{\"metrics_port\": " << (metrics ? metrics->port() : 0) << "}\n";
    }
    std::rename((path + ".tmp").c_str(), path.c_str());
  }

  Worker worker(options);
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

}  // namespace
}  // namespace trainstep

int main(int argc, char** argv) { return trainstep::Main(argc, argv); }
