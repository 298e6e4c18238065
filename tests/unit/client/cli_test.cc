// `trainstep` end to end: RunCli against an in-process coordinator on 127.0.0.1, with
// simulated workers (threads speaking WorkerService) to make jobs actually run.
#include "client/cli.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/commands.h"
#include "common/clock.h"
#include "common/grpc_status.h"
#include "coordinator/coordinator.h"
#include "coordinator/server.h"
#include "core/spec.h"
#include "tests/integration/simulated_worker.h"
#include "trainstep/v1/job_service.grpc.pb.h"
#include "worker/link/worker_client.h"

namespace trainstep::client {
namespace {

using ::trainstep::testing::SimReport;
using ::trainstep::testing::SimulatedWorker;

// `windows` windows per epoch for `workers` ranks: one sample per rank per window.
std::string Spec(int workers, int64_t windows, int accumulation_steps = 1) {
  return absl::StrCat(R"({"name":"cli","model":{"mlp":{}},)",
                      R"("data":{"synthetic_regression":{"samples":)", workers * windows, R"(}},)",
                      R"("batch":{"micro_batch_size":1,"accumulation_steps":)", accumulation_steps,
                      "},", R"("workers":{"count":)", workers, "}}");
}

struct CliResult {
  int rc = -1;
  std::string out, err;
};

std::vector<std::string> Lines(const std::string& s) {
  return absl::StrSplit(s, '\n', absl::SkipEmpty());
}

size_t CountLinesStartingWith(const std::string& s, const std::string& prefix) {
  size_t n = 0;
  for (const std::string& l : Lines(s)) n += absl::StartsWith(l, prefix);
  return n;
}

template <typename Message>
Message ParseJson(const std::string& json) {
  Message m;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &m);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return m;
}

class CliE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("trainstep-client-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    StartCoordinator(0);
  }
  void TearDown() override {
    server_.reset();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartCoordinator(int port) {
    CoordinatorOptions options;
    options.state_dir = (dir_ / "state").string();
    options.machine.worker_lease = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Open(options);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> s =
        CoordinatorServer::Start(coordinator_.get(), absl::StrCat("127.0.0.1:", port));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  void RestartCoordinator() {
    const int port = server_->port();
    server_->Shutdown(absl::ZeroDuration());
    server_.reset();
    coordinator_.reset();
    StartCoordinator(port);
  }

  // The coordinator comes from $TRAINSTEP_COORDINATOR, as users set it.
  CliResult Cli(const std::vector<std::string>& args, const std::string& stdin_text = "") {
    std::istringstream in(stdin_text);
    std::ostringstream out, err;
    ProcessEnvironment env;
    env.coordinator = address_;
    CliResult r;
    r.rc = RunCli(args, env, in, out, err);
    r.out = out.str();
    r.err = err.str();
    return r;
  }

  std::future<CliResult> CliAsync(std::vector<std::string> args) {
    return std::async(std::launch::async, [this, args] { return Cli(args); });
  }

  // Waits (bounded) for a background command; cancels the job to unblock a stuck watch.
  CliResult Await(std::future<CliResult>& f, const std::string& job) {
    if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      ADD_FAILURE() << "the command did not end within 60 s; cancelling " << job;
      Cli({"job", "cancel", job});
    }
    return f.get();
  }

  std::string WriteFile(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << content;
    return path;
  }

  std::vector<std::unique_ptr<SimulatedWorker>> Workers(
      const std::string& job, int count, int64_t samples,
      testing::ReportFn report = [](int64_t, int) { return SimReport{}; }) {
    std::vector<std::unique_ptr<SimulatedWorker>> workers;
    for (int i = 0; i < count; ++i) {
      workers.push_back(std::make_unique<SimulatedWorker>(address_, job, samples, report));
      const absl::Status s = workers.back()->Register(absl::StrCat("sim-", i));
      EXPECT_TRUE(s.ok()) << s;
    }
    return workers;
  }

  static void RunAll(std::vector<std::unique_ptr<SimulatedWorker>>& workers) {
    std::vector<std::thread> threads;
    for (auto& w : workers) {
      threads.emplace_back([&w] {
        const absl::Status s = w->Run();
        EXPECT_TRUE(s.ok()) << s;
      });
    }
    for (std::thread& t : threads) t.join();
    for (auto& w : workers) w->StopHeartbeats();
  }

  // Waits (bounded) until the coordinator knows `job`.
  void AwaitJob(const std::string& job) {
    for (int i = 0; i < 500; ++i) {
      if (Cli({"job", "get", job, "-o", "json"}).rc == kExitOk) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL() << job << " never appeared";
  }

  std::filesystem::path dir_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string address_;
};

// Catches: a submit that prints nothing usable, or prints more than the id on stdout.
TEST_F(CliE2eTest, SubmitValidSpecPrintsTheId) {
  const CliResult r = Cli({"job", "submit", WriteFile("spec.json", Spec(2, 10))});
  EXPECT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_EQ(r.out, "job-1\n");
  EXPECT_NE(r.err.find(absl::StrCat("trainstep-worker --coordinator ", address_, " --job job-1")),
            std::string::npos)
      << r.err;
}

// Catches: a spec read from stdin ("-") taken for a file name.
TEST_F(CliE2eTest, SubmitFromStdin) {
  const CliResult r = Cli({"job", "submit", "-"}, Spec(1, 5));
  EXPECT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_EQ(r.out, "job-1\n");
}

// Catches: a default request id that is random (a double submit makes two jobs) or ignores
// the time (the same file can never be submitted again).
TEST_F(CliE2eTest, DoubleSubmitWithinAMinuteReturnsTheSameJob) {
  const std::string spec = WriteFile("spec.json", Spec(2, 10));
  std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(MakeChannel(address_));
  FakeClock clock(absl::FromUnixSeconds(1'699'999'980));  // the start of a minute
  std::ostringstream out, err;
  CommandContext ctx;
  ctx.stub = stub.get();
  ctx.coordinator = address_;
  ctx.out = &out;
  ctx.err = &err;
  ctx.clock = &clock;
  EXPECT_EQ(JobSubmit(ctx, spec, "", false), kExitOk) << err.str();
  clock.Advance(absl::Seconds(59));
  EXPECT_EQ(JobSubmit(ctx, spec, "", false), kExitOk) << err.str();
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(JobSubmit(ctx, spec, "", false), kExitOk) << err.str();
  EXPECT_EQ(out.str(), "job-1\njob-1\njob-2\n");

  // The same file twice through the real command line, with an explicit request id.
  EXPECT_EQ(Cli({"job", "submit", spec, "--request-id", "r-7"}).out, "job-3\n");
  EXPECT_EQ(Cli({"job", "submit", "--request-id=r-7", spec}).out, "job-3\n");
}

// Catches the probe's finding: a request id reused with a different spec silently returned
// the first job. It must be refused (ALREADY_EXISTS → exit 2, "invalid input") naming the id,
// also after a coordinator restart; the same spec under the same id still returns the job.
TEST_F(CliE2eTest, ReusedRequestIdWithAnotherSpecExits2) {
  const std::string first = WriteFile("first.json", Spec(2, 10));
  const std::string other = WriteFile("other.json", Spec(2, 20));
  ASSERT_EQ(Cli({"job", "submit", first, "--request-id", "r-1"}).out, "job-1\n");
  for (int restart = 0; restart < 2; ++restart) {
    SCOPED_TRACE(restart == 0 ? "before a restart" : "after a restart");
    CliResult r = Cli({"job", "submit", other, "--request-id", "r-1"});
    EXPECT_EQ(r.rc, kExitUsage) << r.err;
    EXPECT_NE(r.err.find("request_id \"r-1\" was already used for job-1 with a different spec"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(Cli({"job", "submit", first, "--request-id", "r-1"}).out, "job-1\n");
    RestartCoordinator();
  }
  EXPECT_EQ(Cli({"job", "get", "job-2"}).rc, kExitNotFound);  // no second job
}

// Catches the probe's finding: a spec over the coordinator's message limit exited 1 with
// gRPC's text; it is invalid input (exit 2), refused before sending, with the size and the
// limit. A server-side refusal for size maps to exit 2 too.
TEST_F(CliE2eTest, SpecLargerThanTheMessageLimitExits2WithSizeAndLimit) {
  const std::string base = Spec(2, 10);
  const std::string big =
      base.substr(0, base.size() - 1) + R"(,"name":")" + std::string(5 << 20, 'x') + "\"}";
  CliResult r = Cli({"job", "submit", WriteFile("big.json", big)});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find(absl::StrCat("is ", big.size(), " bytes")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("at most 4194304 bytes (4.0 MiB)"), std::string::npos) << r.err;
  EXPECT_EQ(Cli({"job", "list", "-o", "json"}).out, "[]\n");

  std::ostringstream out, err;
  CommandContext ctx;
  ctx.coordinator = address_;
  ctx.out = &out;
  ctx.err = &err;
  EXPECT_EQ(ReportRpcError(ctx, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                             "Received message larger than max (5243000 vs. "
                                             "4194304)")),
            kExitUsage);
  EXPECT_NE(err.str().find("5243000 vs. 4194304"), std::string::npos) << err.str();
  // Told apart by the coordinator's detail, never by the words: gRPC's limit in other words is
  // still invalid input, and the coordinator's own limit in gRPC's words is not.
  EXPECT_EQ(ReportRpcError(ctx, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "too big")),
            kExitUsage);
  EXPECT_EQ(ReportRpcError(ctx, ToGrpcStatus(absl::ResourceExhaustedError("quota"))), kExitError);
  EXPECT_EQ(ReportRpcError(ctx, ToGrpcStatus(absl::ResourceExhaustedError("larger than max"))),
            kExitError);
}

// Catches the probe's finding: `job watch ID --timeout 2s` on a PENDING job sat for over 10
// minutes. --timeout bounds the time without progress (exit 7, saying where the job stands);
// a job that keeps making progress is followed past it to the end.
TEST_F(CliE2eTest, WatchTimeoutIsTheTimeWithoutProgress) {
  ASSERT_EQ(Cli({"job", "submit", WriteFile("spec.json", Spec(2, 10))}).out, "job-1\n");
  std::future<CliResult> watch = CliAsync({"job", "watch", "job-1", "--timeout", "300ms"});
  const CliResult r = Await(watch, "job-1");
  EXPECT_EQ(r.rc, kExitNoProgress) << r.err;
  EXPECT_NE(r.err.find("job-1 made no progress for 300ms (--timeout): it is PENDING, 0/2 workers"),
            std::string::npos)
      << r.err;

  // Windows that each take longer than nothing but far less than the timeout: the watch
  // outlives several timeouts' worth of time and ends with the job.
  ASSERT_EQ(Cli({"job", "submit", WriteFile("slow.json", Spec(1, 30))}).out, "job-2\n");
  std::future<CliResult> follow = CliAsync({"job", "watch", "job-2", "--timeout", "2s"});
  auto workers = Workers("job-2", 1, 30, [](int64_t, int) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return SimReport{};
  });
  RunAll(workers);
  const CliResult done = Await(follow, "job-2");
  EXPECT_EQ(done.rc, kExitOk) << done.err;
}

// Catches: the client rewriting or pre-parsing the spec and losing the coordinator's
// field-level message, or exiting 1 instead of 2.
TEST_F(CliE2eTest, InvalidSpecsExit2WithTheCoordinatorsMessage) {
  CliResult r =
      Cli({"job", "submit",
           WriteFile("unknown.json", R"({"name":"x","model":{"mlp":{}},"workers":{"cont":2}})")});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find("workers.cont: unknown field"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");

  r = Cli({"job", "submit", WriteFile("zero.json", Spec(2, 10, /*accumulation_steps=*/0))});
  EXPECT_EQ(r.rc, kExitUsage) << r.out;
  EXPECT_NE(r.err.find("batch.accumulation_steps must be ≥ 1, got 0"), std::string::npos) << r.err;

  r = Cli({"job", "submit", "-"}, R"({"batch":{"accumulation_steps":0}})");
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find("error: "), std::string::npos);

  r = Cli({"job", "submit", WriteFile("broken.json", "{\"name\": ")});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;
  EXPECT_EQ(Cli({"job", "list", "-o", "json"}).out, "[]\n");  // nothing was created
}

// Catches: an unreadable file sent as an empty spec, or reported as a server error.
TEST_F(CliE2eTest, UnreadableSpecExits2) {
  const std::string missing = (dir_ / "missing.json").string();
  CliResult r = Cli({"job", "submit", missing});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("No such file"), std::string::npos) << r.err;
  r = Cli({"job", "submit", dir_.string()});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find("directory"), std::string::npos) << r.err;
}

// Catches: get/list/cancel printing the wrong job or state, a get without the resolved
// spec, and -o json that is not the message's JSON.
TEST_F(CliE2eTest, GetListCancel) {
  const std::string spec = WriteFile("spec.json", Spec(2, 10));
  ASSERT_EQ(Cli({"job", "submit", spec}).out, "job-1\n");
  ASSERT_EQ(Cli({"job", "submit", spec, "--request-id", "other"}).out, "job-2\n");

  CliResult r = Cli({"job", "get", "job-1"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_TRUE(absl::StartsWith(r.out, "id:")) << r.out;
  for (const char* want : {"job-1", "state:", "PENDING", "updates:", "world size:", "0/2",
                           "loss scale:", "learning rate:", "checkpoint:"}) {
    EXPECT_NE(r.out.find(want), std::string::npos) << want << " in\n" << r.out;
  }
  const size_t spec_at = r.out.find("\nspec:\n");
  ASSERT_NE(spec_at, std::string::npos) << r.out;
  absl::StatusOr<v1::JobSpec> printed = ParseJobSpecJson(r.out.substr(spec_at + 7));
  ASSERT_TRUE(printed.ok()) << printed.status();
  EXPECT_EQ(printed->workers().count(), 2);
  EXPECT_TRUE(printed->batch().has_accumulation_steps());  // resolved: defaults filled in

  r = Cli({"job", "list"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_TRUE(absl::StartsWith(
      lines[0], "ID      NAME   STATE     UPDATES/MAX   LOSS   SCALE   WORKERS   AGE"))
      << lines[0];
  EXPECT_TRUE(absl::StartsWith(lines[1], "job-1   cli    PENDING   0 ")) << lines[1];
  EXPECT_TRUE(absl::StartsWith(lines[2], "job-2   cli    PENDING")) << lines[2];

  r = Cli({"job", "cancel", "job-1"});
  EXPECT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_EQ(r.out, "job-1 CANCELLED\n");
  // Cancelling twice is an error, not a silent success or a crash.
  r = Cli({"job", "cancel", "job-1"});
  EXPECT_EQ(r.rc, kExitError);
  EXPECT_NE(r.err.find("already ended"), std::string::npos) << r.err;

  r = Cli({"-o", "json", "job", "get", "job-1"});
  ASSERT_EQ(r.rc, kExitOk);
  const v1::Job job = ParseJson<v1::Job>(r.out);
  EXPECT_EQ(job.job_id(), "job-1");
  EXPECT_EQ(job.state(), v1::CANCELLED);
  EXPECT_EQ(job.message(), "cancelled by a client");

  r = Cli({"job", "list", "-o", "json"});
  ASSERT_EQ(r.rc, kExitOk);
  const v1::ListJobsResponse list =
      ParseJson<v1::ListJobsResponse>(absl::StrCat("{\"jobs\":", r.out, "}"));
  ASSERT_EQ(list.jobs_size(), 2);
  EXPECT_EQ(list.jobs(0).state(), v1::CANCELLED);
  EXPECT_EQ(list.jobs(1).state(), v1::PENDING);
}

// Catches: colour codes written to a pipe, or NO_COLOR ignored on a terminal.
TEST_F(CliE2eTest, ColoursOnlyOnATerminalWithoutNoColor) {
  ASSERT_EQ(Cli({"job", "submit", WriteFile("spec.json", Spec(2, 10))}).rc, kExitOk);
  ASSERT_EQ(Cli({"job", "cancel", "job-1"}).rc, kExitOk);
  auto list = [&](bool tty, bool no_color) {
    std::istringstream in;
    std::ostringstream out, err;
    ProcessEnvironment env;
    env.coordinator = address_;
    env.stdout_tty = env.stderr_tty = tty;
    env.no_color = no_color;
    EXPECT_EQ(RunCli({"job", "list"}, env, in, out, err), kExitOk) << err.str();
    return out.str();
  };
  EXPECT_NE(list(/*tty=*/true, /*no_color=*/false).find("\033[33mCANCELLED"), std::string::npos);
  EXPECT_EQ(list(/*tty=*/true, /*no_color=*/true).find('\033'), std::string::npos);
  EXPECT_EQ(list(/*tty=*/false, /*no_color=*/false).find('\033'), std::string::npos);
}

// Catches: NOT_FOUND mapped to a generic error, or the coordinator's hint lost.
TEST_F(CliE2eTest, UnknownJobExits4) {
  CliResult r = Cli({"job", "get", "job-9"});
  EXPECT_EQ(r.rc, kExitNotFound);
  EXPECT_NE(r.err.find("no job job-9 (trainstep job list shows them)"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  for (const char* verb : {"cancel", "watch", "logs"}) {
    EXPECT_EQ(Cli({"job", verb, "job-9"}).rc, kExitNotFound) << verb;
  }
  EXPECT_EQ(Cli({"worker", "list", "--job", "job-9"}).rc, kExitNotFound);
}

// Catches: an unreachable coordinator reported as a generic failure without what to do,
// the --coordinator flag losing to $TRAINSTEP_COORDINATOR, or a hang.
TEST_F(CliE2eTest, UnreachableCoordinatorExits3WithTheHint) {
  const absl::Time start = absl::Now();
  const CliResult r = Cli({"job", "list", "--coordinator", "127.0.0.1:1"});
  EXPECT_EQ(r.rc, kExitUnavailable);
  EXPECT_NE(r.err.find("coordinator at 127.0.0.1:1 is not reachable: start it with "
                       "`trainstep-coordinator --listen 127.0.0.1:1`, or pass --coordinator / "
                       "set TRAINSTEP_COORDINATOR"),
            std::string::npos)
      << r.err;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // The watch stream has no deadline, but an unreachable coordinator still ends it.
  EXPECT_EQ(Cli({"job", "watch", "job-1", "--coordinator", "127.0.0.1:1"}).rc, kExitUnavailable);
}

// Catches: a unary call without a deadline hanging on a peer that accepts but never answers.
TEST_F(CliE2eTest, SilentCoordinatorHitsTheDeadline) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);  // never accepted: the HTTP/2 handshake never completes
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string silent = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));

  const absl::Time start = absl::Now();
  const CliResult r = Cli({"job", "get", "job-1", "--coordinator", silent, "--timeout", "300ms"});
  close(fd);
  EXPECT_EQ(r.rc, kExitUnavailable);
  EXPECT_NE(r.err.find("did not answer within 300ms"), std::string::npos) << r.err;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Catches: logs that stop after the first page, lines that are not one JSON object each,
// or field names that are not the .proto names.
TEST_F(CliE2eTest, LogsJsonlAfterTheJobRan) {
  constexpr int64_t kWindows = 1005;  // more than one page of 1000
  ASSERT_EQ(Cli({"job", "submit", WriteFile("spec.json", Spec(1, kWindows))}).out, "job-1\n");
  auto workers = Workers("job-1", 1, kWindows);
  RunAll(workers);

  CliResult r = Cli({"job", "logs", "job-1", "-o", "jsonl"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), static_cast<size_t>(kWindows));
  for (size_t i = 0; i < lines.size(); ++i) {
    const v1::UpdateRecord rec = ParseJson<v1::UpdateRecord>(lines[i]);  // unknown fields fail
    EXPECT_EQ(rec.window_id(), static_cast<int64_t>(i + 1));
    EXPECT_EQ(rec.outcome(), "commit");
  }
  EXPECT_NE(lines[0].find("\"global_valid_tokens\":"), std::string::npos) << lines[0];

  r = Cli({"job", "logs", "job-1", "-o", "json"});
  ASSERT_EQ(r.rc, kExitOk);
  EXPECT_EQ(
      ParseJson<v1::ListUpdatesResponse>(absl::StrCat("{\"updates\":", r.out, "}")).updates_size(),
      kWindows);

  r = Cli({"job", "logs", "job-1"});
  ASSERT_EQ(r.rc, kExitOk);
  EXPECT_EQ(Lines(r.out).size(), static_cast<size_t>(kWindows + 1));  // header + rows
  EXPECT_TRUE(absl::StartsWith(r.out, "WINDOW   GEN   WORLD   OUTCOME")) << r.out.substr(0, 200);
}

// Catches: the log contract's fields missing from `job logs` (table and jsonl) or `job get`:
// the cumulative micro-step id, the update interval, and the samples batch.tail drop left out.
TEST_F(CliE2eTest, LogsAndGetShowMicroStepsIntervalsAndDroppedTails) {
  std::string spec = Spec(2, 5);  // 10 samples, B = 2
  spec.insert(spec.find("\"accumulation_steps\""), R"("tail":"drop",)");
  ASSERT_EQ(Cli({"job", "submit", WriteFile("spec.json", spec)}).out, "job-1\n");
  auto workers = Workers("job-1", 2, 11);  // 11 samples: 5 windows, sample 10 left out
  RunAll(workers);

  CliResult r = Cli({"job", "logs", "job-1"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;
  for (const char* column : {"UPDATE   MICRO", "INTERVAL", "NOTE"}) {
    EXPECT_NE(lines[0].find(column), std::string::npos) << column << " in " << lines[0];
  }
  EXPECT_TRUE(absl::EndsWith(lines[5], "dropped epoch 0: 1 samples, positions 10-10, ids 10"))
      << lines[5];
  EXPECT_EQ(lines[4].find("dropped"), std::string::npos) << lines[4];

  r = Cli({"job", "logs", "job-1", "-o", "jsonl"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 5u);
  const v1::UpdateRecord last = ParseJson<v1::UpdateRecord>(lines[4]);
  EXPECT_EQ(last.micro_step_id(), 10);  // SimulatedWorker: one micro-step per rank and window
  EXPECT_TRUE(last.has_update_interval_seconds());
  EXPECT_EQ(last.dropped_tail().samples(), 1);
  EXPECT_NE(lines[4].find(R"("dropped_tail":{"epoch":0,"samples":1,"first_position":10,)"
                          R"("sample_ids":[10]})"),
            std::string::npos)
      << lines[4];
  EXPECT_NE(lines[0].find(R"("dropped_tail":null)"), std::string::npos) << lines[0];

  r = Cli({"job", "get", "job-1"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_NE(r.out.find("micro-step id:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dropped tail:      1 samples so far; epoch 0: 1 samples, positions "
                       "10-10, ids 10\n"),
            std::string::npos)
      << r.out;
}

// Catches: a watch that does not end with the job, a wrong exit code, lost or duplicated
// per-update lines, or no summary.
TEST_F(CliE2eTest, WatchRunsToSuccess) {
  constexpr int64_t kWindows = 30;
  ASSERT_EQ(Cli({"job", "submit", WriteFile("spec.json", Spec(2, kWindows))}).out, "job-1\n");
  std::future<CliResult> watch = CliAsync({"job", "watch", "job-1"});
  auto workers = Workers("job-1", 2, 2 * kWindows);
  RunAll(workers);
  const CliResult r = Await(watch, "job-1");
  EXPECT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_TRUE(absl::StartsWith(r.out, "job-1 SUCCEEDED: 30 updates")) << r.out;
  EXPECT_EQ(Lines(r.out).size(), 1u) << r.out;
  EXPECT_EQ(CountLinesStartingWith(r.err, "window "), static_cast<size_t>(kWindows)) << r.err;
  EXPECT_EQ(CountLinesStartingWith(r.err, "window 30 commit update=30 "), 1u) << r.err;
  EXPECT_NE(r.err.find("job job-1 SUCCEEDED"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos);  // not a terminal: no live line

  // Watching a job that already ended replays it and ends at once.
  const CliResult again = Cli({"job", "watch", "job-1", "-o", "json"});
  EXPECT_EQ(again.rc, kExitOk);
  EXPECT_EQ(ParseJson<v1::Job>(again.out).state(), v1::SUCCEEDED);
}

// The simulated workers report a held-out loss of 1 / (1 + update) (simulated_worker.h).
// Catches: `job watch` printing an evaluated update's line before (or without) its eval_loss,
// or lines for updates that were not evaluated carrying one; `job get` without the eval loss
// and the throughput line.
TEST_F(CliE2eTest, WatchAndGetShowTheEvalLossAndThroughput) {
  constexpr int64_t kWindows = 6;
  std::string spec = Spec(2, kWindows);
  spec.insert(spec.size() - 1, R"(,"eval":{"data":{"synthetic_regression":{"samples":4}},)"
                               R"("every_updates":2})");
  ASSERT_EQ(Cli({"job", "submit", WriteFile("spec.json", spec)}).out, "job-1\n");
  std::future<CliResult> watch = CliAsync({"job", "watch", "job-1"});
  auto workers = Workers("job-1", 2, 2 * kWindows);
  RunAll(workers);
  const CliResult r = Await(watch, "job-1");
  EXPECT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_EQ(CountLinesStartingWith(r.err, "window "), static_cast<size_t>(kWindows)) << r.err;
  for (const std::string& line : Lines(r.err)) {
    if (!absl::StartsWith(line, "window ")) continue;
    const bool evaluated = absl::StartsWith(line, "window 2 ") ||
                           absl::StartsWith(line, "window 4 ") ||
                           absl::StartsWith(line, "window 6 ");
    EXPECT_EQ(absl::StrContains(line, " eval_loss="), evaluated) << line;
  }
  EXPECT_TRUE(absl::StrContains(r.err, "window 2 commit update=2 ")) << r.err;
  // 1 / (1 + 2), at the end of window 2's line (after the micro_step and interval).
  EXPECT_TRUE(absl::StrContains(r.err, " eval_loss=0.33333\nwindow 3 ")) << r.err;
  // The job's end is reported after the last record (released with its evaluation).
  EXPECT_LT(r.err.find("window 6 commit"), r.err.find("job job-1 SUCCEEDED")) << r.err;

  const CliResult get = Cli({"job", "get", "job-1"});
  EXPECT_EQ(get.rc, kExitOk) << get.err;
  EXPECT_TRUE(absl::StrContains(get.out, "eval loss") &&
              absl::StrContains(get.out, "(update 6)"))  // 1 / 7 after the last update
      << get.out;
  EXPECT_TRUE(absl::StrContains(get.out, "updates/s (last ")) << get.out;
}

// Catches: per-update lines spilling onto a terminal, a live line that is not redrawn in
// place, or a final line that does not show the job complete.
TEST_F(CliE2eTest, WatchOnATerminalDrawsOneLiveLine) {
  constexpr int64_t kWindows = 30;
  ASSERT_EQ(Cli({"job", "submit", WriteFile("spec.json", Spec(2, kWindows))}).out, "job-1\n");
  std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(MakeChannel(address_));
  std::ostringstream out, err;
  CommandContext ctx;
  ctx.stub = stub.get();
  ctx.coordinator = address_;
  ctx.out = &out;
  ctx.err = &err;
  ctx.live_progress = true;
  std::future<int> watch = std::async(std::launch::async, [&] { return JobWatch(ctx, "job-1"); });
  auto workers = Workers("job-1", 2, 2 * kWindows);
  RunAll(workers);
  if (watch.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "the watch did not end";
    Cli({"job", "cancel", "job-1"});
  }
  EXPECT_EQ(watch.get(), kExitOk) << err.str();
  const std::string e = err.str();
  EXPECT_EQ(e.find("window 1 commit"), std::string::npos) << e;
  EXPECT_EQ(e.find('\033'), std::string::npos);  // colours are off: color_err is false
  ASSERT_NE(e.rfind('\r'), std::string::npos) << e;
  // Bounded by one epoch: the line counts windows against windows_per_epoch × epochs.
  const std::string last = e.substr(e.rfind('\r') + 1);
  EXPECT_TRUE(absl::StartsWith(last, "window 30/30 [############] ")) << last;
  // The coordinator's rates over the job's last minute (Job.throughput).
  EXPECT_NE(last.find(" samples/s  "), std::string::npos) << last;
  EXPECT_NE(last.find(" upd/s  loss 2  scale 1  lr 1.0e-03  skipped 0"), std::string::npos) << last;
  EXPECT_TRUE(absl::EndsWith(last, "\n")) << last;  // the summary starts on its own line
  EXPECT_TRUE(absl::StartsWith(out.str(), "job-1 SUCCEEDED")) << out.str();
}

// Catches: --watch ignored after submit, or the id missing from stdout when watching.
TEST_F(CliE2eTest, SubmitAndWatch) {
  constexpr int64_t kWindows = 20;
  std::future<CliResult> submit =
      CliAsync({"job", "submit", "--watch", WriteFile("spec.json", Spec(2, kWindows))});
  AwaitJob("job-1");
  auto workers = Workers("job-1", 2, 2 * kWindows);
  RunAll(workers);
  const CliResult r = Await(submit, "job-1");
  EXPECT_EQ(r.rc, kExitOk) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_EQ(lines[0], "job-1");
  EXPECT_TRUE(absl::StartsWith(lines[1], "job-1 SUCCEEDED: 20 updates")) << lines[1];
}

// Catches: a cancelled job reported as success, or the watch not ending on cancellation.
TEST_F(CliE2eTest, WatchOfCancelledJobExits6) {
  ASSERT_EQ(Cli({"job", "submit", WriteFile("spec.json", Spec(2, 10))}).out, "job-1\n");
  std::future<CliResult> watch = CliAsync({"job", "watch", "job-1"});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // usually attached by now
  ASSERT_EQ(Cli({"job", "cancel", "job-1"}).rc, kExitOk);
  const CliResult r = Await(watch, "job-1");
  EXPECT_EQ(r.rc, kExitJobCancelled) << r.err;
  EXPECT_NE(r.out.find("job-1 CANCELLED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cancelled by a client"), std::string::npos) << r.out;
  EXPECT_EQ(Cli({"job", "watch", "job-1"}).rc, kExitJobCancelled);  // already ended
}

// Catches: a failed job exiting 0 or without the job's message.
TEST_F(CliE2eTest, WatchOfFailedJobExits5WithTheMessage) {
  ASSERT_EQ(Cli({"job", "submit", WriteFile("spec.json", Spec(1, 10))}).out, "job-1\n");
  auto workers = Workers("job-1", 1, 10);
  WorkerClient client(MakeChannel(address_));
  v1::ReportFailureRequest req;
  req.set_job_id("job-1");
  req.set_worker_id(workers[0]->worker_id());
  req.set_message("CUDA out of memory");
  ASSERT_TRUE(client.ReportFailure(req).ok());
  workers[0]->StopHeartbeats();
  const CliResult r = Cli({"job", "watch", "job-1"});
  EXPECT_EQ(r.rc, kExitJobFailed) << r.err;
  EXPECT_NE(r.out.find("job-1 FAILED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CUDA out of memory"), std::string::npos) << r.out;
}

// Catches: worker list dropping the --job filter or printing a misaligned table.
TEST_F(CliE2eTest, WorkerList) {
  ASSERT_EQ(Cli({"job", "submit", WriteFile("spec.json", Spec(2, 10))}).out, "job-1\n");
  auto workers = Workers("job-1", 2, 20);
  CliResult r = Cli({"worker", "list"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_TRUE(absl::StartsWith(lines[0], "ID ")) << lines[0];
  const size_t name_col = lines[0].find("NAME");
  EXPECT_EQ(lines[1].substr(name_col, 5), "sim-0") << r.out;
  EXPECT_EQ(lines[2].substr(name_col, 5), "sim-1") << r.out;

  r = Cli({"worker", "list", "--job", "job-1", "-o", "json"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  const auto list = ParseJson<v1::ListWorkersResponse>(absl::StrCat("{\"workers\":", r.out, "}"));
  ASSERT_EQ(list.workers_size(), 2);
  EXPECT_EQ(list.workers(0).job_id(), "job-1");
  for (auto& w : workers) w->StopHeartbeats();
}

// Catches: a watch that dies when the coordinator restarts, or prints records twice after
// resuming.
TEST_F(CliE2eTest, WatchSurvivesACoordinatorRestart) {
  constexpr int64_t kWindows = 150;
  ASSERT_EQ(Cli({"job", "submit", WriteFile("spec.json", Spec(2, kWindows))}).out, "job-1\n");
  std::future<CliResult> watch = CliAsync({"job", "watch", "job-1", "--timeout", "20s"});
  auto workers = Workers("job-1", 2, 2 * kWindows);
  std::thread restarter([&] {
    for (int i = 0; i < 2000 && workers[0]->decisions().size() < 40; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    RestartCoordinator();
  });
  RunAll(workers);
  restarter.join();
  const CliResult r = Await(watch, "job-1");
  EXPECT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_TRUE(absl::StartsWith(r.out, "job-1 SUCCEEDED: 150 updates")) << r.out;
  EXPECT_NE(r.err.find("reconnecting"), std::string::npos) << r.err;  // the restart hit mid-run
  for (int64_t w = 1; w <= kWindows; ++w) {
    EXPECT_EQ(CountLinesStartingWith(r.err, absl::StrCat("window ", w, " commit ")), 1u) << w;
  }
}

}  // namespace
}  // namespace trainstep::client
