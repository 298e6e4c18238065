// A real trainstep cluster on 127.0.0.1 for tests: the coordinator binary and worker
// binaries as separate processes (posix_spawn), free ports from --port-file, a JobService
// stub, and bounded waits. Everything it started is killed in the destructor.
#ifndef TRAINSTEP_TESTS_INTEGRATION_PROCESS_CLUSTER_H_
#define TRAINSTEP_TESTS_INTEGRATION_PROCESS_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "trainstep/v1/job_service.grpc.pb.h"

namespace trainstep::testing {

// Where the binaries are (build/bin), set by CMake.
std::string BinDir();
// A file's content; "" if it cannot be read.
std::string ReadFile(const std::string& path);
// /tmp/trainstep-<name>-<pid>: a test's directory (not created).
std::string TempDir(const std::string& name);

// Runs `argv` to its end with stdout and stderr in `log`, as user `uid` when set (root drops
// its privileges, so that file permissions apply). Returns the exit code, 128 + the signal
// if a signal ended it, or -2 if it had to be killed after `timeout`.
absl::StatusOr<int> RunToExit(const std::vector<std::string>& argv, const std::string& log,
                              absl::Duration timeout, std::optional<uid_t> uid = std::nullopt);

// A copy of `binary` in `dir` (created; it and the copy mode 0755) for RunToExit as another
// user: the build's own is out of that user's reach when the checkout is in a folder only its
// owner may enter (cloned under /root, or into a `mktemp -d`). Its shared libraries come from
// system paths, which everyone can read.
absl::StatusOr<std::string> CopyForOtherUsers(const std::string& binary, const std::string& dir);

class ProcessCluster {
 public:
  // Starts trainstep-coordinator with its state in `dir` (created, emptied first unless
  // `keep_state`: a restart over the same journal), with extra coordinator flags (later ones
  // win: "--listen=0.0.0.0:0" replaces the default). jobs() connects with `security`.
  static absl::StatusOr<std::unique_ptr<ProcessCluster>> Start(
      const std::string& dir, absl::Duration worker_lease = absl::Seconds(10),
      const std::vector<std::string>& coordinator_flags = {}, bool keep_state = false,
      const ChannelSecurity& security = {});
  ~ProcessCluster();

  const std::string& address() const { return address_; }
  int metrics_port() const { return metrics_port_; }
  int health_port() const { return health_port_; }  // 0 without --health-listen
  pid_t coordinator_pid() const { return coordinator_; }
  const std::string& dir() const { return dir_; }
  v1::JobService::Stub* jobs() { return jobs_.get(); }

  absl::StatusOr<std::string> Submit(const std::string& spec_json);
  // Starts one worker process for `job_id` with extra flags; its log goes to dir/worker-N.log.
  // A --debug-* flag (a test hook) starts the testing build, bin/testing/trainstep-worker.
  absl::StatusOr<pid_t> StartWorker(const std::string& job_id,
                                    const std::vector<std::string>& extra_flags = {});
  // Waits until the job is in a terminal state.
  absl::StatusOr<v1::Job> WaitForJob(const std::string& job_id, absl::Duration timeout);
  absl::StatusOr<std::vector<v1::UpdateRecord>> Updates(const std::string& job_id);
  // Waits for every started worker to exit; returns their exit codes in start order.
  std::vector<int> WaitForWorkers(absl::Duration timeout);
  void Kill(pid_t pid);
  // SIGTERM to the coordinator; its exit code (-2 if it had to be killed after `timeout`).
  int TerminateCoordinator(absl::Duration timeout);
  // The last `lines` lines of every log, for failure messages.
  std::string Logs(int lines = 30) const;

 private:
  ProcessCluster() = default;
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log);

  std::string dir_;
  std::string address_;
  int metrics_port_ = 0;
  int health_port_ = 0;
  pid_t coordinator_ = -1;
  std::vector<pid_t> workers_;
  std::vector<std::string> logs_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

}  // namespace trainstep::testing

#endif  // TRAINSTEP_TESTS_INTEGRATION_PROCESS_CLUSTER_H_
