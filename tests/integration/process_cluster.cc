#include "tests/integration/process_cluster.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/grpc_status.h"

extern char** environ;

namespace trainstep::testing {
namespace {

void Nap(absl::Duration d) {
  std::this_thread::sleep_for(std::chrono::microseconds(absl::ToInt64Microseconds(d)));
}

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

}  // namespace

std::string BinDir() { return TRAINSTEP_TEST_BIN_DIR; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TempDir(const std::string& name) {
  return (std::filesystem::temp_directory_path() / absl::StrCat("trainstep-", name, "-", getpid()))
      .string();
}

absl::StatusOr<int> RunToExit(const std::vector<std::string>& argv, const std::string& log,
                              absl::Duration timeout, std::optional<uid_t> uid) {
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", log));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {  // the child: only async-signal-safe calls until exec
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    if (uid.has_value() && (setgroups(0, nullptr) != 0 || setgid(*uid) != 0 || setuid(*uid) != 0)) {
      _exit(126);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  close(fd);
  const absl::Time give_up = absl::Now() + timeout;
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0) return absl::InternalError("waitpid failed");
    if (absl::Now() > give_up) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -2;
    }
    Nap(absl::Milliseconds(10));
  }
}

absl::StatusOr<std::string> CopyForOtherUsers(const std::string& binary, const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::perms open_to_all = fs::perms::owner_all | fs::perms::group_read |
                                fs::perms::group_exec | fs::perms::others_read |
                                fs::perms::others_exec;
  const std::string copy = (fs::path(dir) / fs::path(binary).filename()).string();
  std::error_code error;
  fs::create_directories(dir, error);
  if (!error) fs::permissions(dir, open_to_all, error);
  if (!error) fs::copy_file(binary, copy, fs::copy_options::overwrite_existing, error);
  if (!error) fs::permissions(copy, open_to_all, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot copy ", binary, " to ", copy, ": ", error.message()));
  }
  return copy;
}

absl::StatusOr<pid_t> ProcessCluster::Spawn(const std::vector<std::string>& argv,
                                            const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", strerror(rc)));
  logs_.push_back(log);
  return pid;
}

absl::StatusOr<std::unique_ptr<ProcessCluster>> ProcessCluster::Start(
    const std::string& dir, absl::Duration worker_lease,
    const std::vector<std::string>& coordinator_flags, bool keep_state,
    const ChannelSecurity& security) {
  std::unique_ptr<ProcessCluster> c(new ProcessCluster());
  c->dir_ = dir;
  if (!keep_state) std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string ports = dir + "/ports.json";
  std::filesystem::remove(ports);
  std::vector<std::string> argv = {
      BinDir() + "/trainstep-coordinator",
      "--listen",
      "127.0.0.1:0",
      "--state-dir",
      dir + "/state",
      "--metrics-listen",
      "127.0.0.1:0",
      "--port-file",
      ports,
      absl::StrCat("--worker-lease-ms=", absl::ToInt64Milliseconds(worker_lease)),
      "--shutdown-grace-ms=200"};
  argv.insert(argv.end(), coordinator_flags.begin(), coordinator_flags.end());
  absl::StatusOr<pid_t> pid = c->Spawn(argv, dir + "/coordinator.log");
  if (!pid.ok()) return pid.status();
  c->coordinator_ = *pid;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  int port = 0;
  // {"grpc_port": 43387, "metrics_port": 40741}
  const auto field = [](const std::string& text, const std::string& name) {
    int value = 0;
    const size_t at = text.find(absl::StrCat("\"", name, "\": "));
    if (at == std::string::npos) return 0;
    std::string digits;
    for (size_t i = at + name.size() + 4; i < text.size() && isdigit(text[i]); ++i) {
      digits += text[i];
    }
    (void)absl::SimpleAtoi(digits, &value);
    return value;
  };
  while (absl::Now() < give_up && port == 0) {
    const std::string text = ReadFile(ports);
    port = field(text, "grpc_port");
    c->metrics_port_ = field(text, "metrics_port");
    c->health_port_ = field(text, "health_port");
    if (port == 0) Nap(absl::Milliseconds(20));
  }
  if (port == 0) {
    return absl::DeadlineExceededError(absl::StrCat("the coordinator did not start:\n", c->Logs()));
  }
  c->address_ = absl::StrCat("127.0.0.1:", port);
  c->jobs_ = v1::JobService::NewStub(MakeChannel(c->address_, security));
  return c;
}

ProcessCluster::~ProcessCluster() {
  for (pid_t p : workers_) Kill(p);
  TerminateCoordinator(absl::Seconds(10));
}

int ProcessCluster::TerminateCoordinator(absl::Duration timeout) {
  if (coordinator_ <= 0) return -1;
  kill(coordinator_, SIGTERM);
  const absl::Time give_up = absl::Now() + timeout;
  int status = 0;
  int code = -2;
  while (true) {
    const pid_t r = waitpid(coordinator_, &status, WNOHANG);
    if (r == coordinator_) {
      code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (r < 0) break;
    if (absl::Now() > give_up) {
      kill(coordinator_, SIGKILL);
      waitpid(coordinator_, &status, 0);
      break;
    }
    Nap(absl::Milliseconds(10));
  }
  coordinator_ = -1;
  return code;
}

void ProcessCluster::Kill(pid_t pid) {
  if (pid <= 0) return;
  if (kill(pid, SIGKILL) == 0) waitpid(pid, nullptr, 0);
}

absl::StatusOr<std::string> ProcessCluster::Submit(const std::string& spec_json) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  v1::SubmitJobRequest req;
  req.set_spec_json(spec_json);
  v1::Job job;
  grpc::Status s = jobs_->SubmitJob(&ctx, req, &job);
  if (!s.ok()) return FromGrpcStatus(s);
  return job.job_id();
}

absl::StatusOr<pid_t> ProcessCluster::StartWorker(const std::string& job_id,
                                                  const std::vector<std::string>& extra_flags) {
  // CPU unless a test asks for a device (a later --device wins): the suite's references are
  // CPU runs, and on a GPU machine --device auto would put every worker on cuda:0.
  // The shipped worker, unless a flag is a test hook: only the testing build takes those.
  const bool hooks = std::any_of(extra_flags.begin(), extra_flags.end(), [](const std::string& f) {
    return absl::StartsWith(f, "--debug");
  });
  std::vector<std::string> argv = {BinDir() + (hooks ? "/testing" : "") + "/trainstep-worker",
                                   "--coordinator",
                                   address_,
                                   "--job",
                                   job_id,
                                   "--name",
                                   absl::StrCat("worker-", workers_.size()),
                                   "--device=cpu"};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  absl::StatusOr<pid_t> pid = Spawn(argv, absl::StrCat(dir_, "/worker-", workers_.size(), ".log"));
  if (pid.ok()) workers_.push_back(*pid);
  return pid;
}

absl::StatusOr<v1::Job> ProcessCluster::WaitForJob(const std::string& job_id,
                                                   absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(5)));
    v1::GetJobRequest req;
    req.set_job_id(job_id);
    v1::Job job;
    grpc::Status s = jobs_->GetJob(&ctx, req, &job);
    if (s.ok() && (job.state() == v1::SUCCEEDED || job.state() == v1::FAILED ||
                   job.state() == v1::CANCELLED)) {
      return job;
    }
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat("job ", job_id, " still ",
                                                      v1::JobState_Name(job.state()), " after ",
                                                      absl::FormatDuration(timeout), "\n", Logs()));
    }
    Nap(absl::Milliseconds(50));
  }
}

absl::StatusOr<std::vector<v1::UpdateRecord>> ProcessCluster::Updates(const std::string& job_id) {
  std::vector<v1::UpdateRecord> out;
  std::string token;
  do {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(10)));
    v1::ListUpdatesRequest req;
    req.set_job_id(job_id);
    req.set_page_token(token);
    v1::ListUpdatesResponse resp;
    grpc::Status s = jobs_->ListUpdates(&ctx, req, &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    for (const auto& r : resp.updates()) out.push_back(r);
    token = resp.next_page_token();
  } while (!token.empty());
  return out;
}

std::vector<int> ProcessCluster::WaitForWorkers(absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  std::vector<int> codes;
  for (pid_t& p : workers_) {
    int status = 0;
    while (p > 0) {
      const pid_t r = waitpid(p, &status, WNOHANG);
      if (r == p) {
        codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        p = -1;
        break;
      }
      if (r < 0) {
        codes.push_back(-1);
        p = -1;
        break;
      }
      if (absl::Now() > give_up) {
        Kill(p);
        codes.push_back(-2);  // had to be killed
        p = -1;
        break;
      }
      Nap(absl::Milliseconds(20));
    }
  }
  return codes;
}

std::string ProcessCluster::Logs(int lines) const {
  std::string out;
  for (const std::string& log : logs_) {
    std::vector<std::string> all = absl::StrSplit(ReadFile(log), '\n');
    absl::StrAppend(&out, "---- ", log, "\n");
    const size_t from = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
    for (size_t i = from; i < all.size(); ++i) absl::StrAppend(&out, all[i], "\n");
  }
  return out;
}

}  // namespace trainstep::testing
