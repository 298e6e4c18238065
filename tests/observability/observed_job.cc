#include "tests/observability/observed_job.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/grpc_status.h"

namespace trainstep::obs {
namespace {

using ::trainstep::testing::SimReport;
using ::trainstep::testing::SimulatedWorker;

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ObservedJob>> ObservedJob::Start(const std::string& dir,
                                                                ObservedJobOptions options) {
  std::unique_ptr<ObservedJob> j(new ObservedJob());
  j->options_ = options;
  j->dir_ = dir;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string port_file = dir + "/ports.json";
  absl::StatusOr<std::unique_ptr<ChildProcess>> c = ChildProcess::Start(
      {BinDir() + "/trainstep-coordinator", "--listen", "127.0.0.1:0", "--state-dir",
       dir + "/state", "--metrics-listen", "127.0.0.1:0", "--port-file", port_file, "--log-format",
       options.log_format, "--shutdown-grace-ms=200"},
      dir + "/coordinator.log");
  if (!c.ok()) return c.status();
  j->coordinator_ = std::move(*c);
  std::map<std::string, int64_t> ports;
  const bool listening = WaitFor(
      [&] {
        ports = ParsePortFile(ReadFileOrEmpty(port_file));
        return ports.count("grpc_port") > 0 || !j->coordinator_->running();
      },
      absl::Seconds(30));
  if (!listening || ports.count("grpc_port") == 0) {
    return absl::DeadlineExceededError(
        absl::StrCat("the coordinator did not start:\n", j->coordinator_->LogTail()));
  }
  j->address_ = absl::StrCat("127.0.0.1:", ports["grpc_port"]);
  j->metrics_port_ = static_cast<int>(ports["metrics_port"]);
  j->jobs_ = v1::JobService::NewStub(MakeChannel(j->address_));
  for (int i = 0; i < options.workers; ++i) {
    absl::StatusOr<std::unique_ptr<WorkerMetrics>> m = WorkerMetrics::Start("127.0.0.1:0");
    if (!m.ok()) return m.status();
    j->worker_metrics_.push_back(std::move(*m));
  }
  return j;
}

ObservedJob::~ObservedJob() {
  Resume();
  for (auto& w : workers_) w->Crash();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  for (auto& w : workers_) w->StopHeartbeats();
  // Each prometheus-cpp exposer (in-process here, and the coordinator's) takes about 2 s to
  // stop: stop them side by side.
  std::vector<std::thread> stopping;
  if (coordinator_) stopping.emplace_back([this] { coordinator_->Stop(); });
  for (auto& m : worker_metrics_) stopping.emplace_back([&m] { m.reset(); });
  for (std::thread& t : stopping) t.join();
}

std::string ObservedJob::spec() const {
  const int64_t w = options_.windows;
  return absl::StrCat(
      R"({"name":"observability <demo> & co","model":{"mlp":{}},)",
      R"("data":{"synthetic_regression":{"samples":)", options_.workers * w, R"(}},)",
      R"("batch":{"micro_batch_size":1,"accumulation_steps":1},)",
      R"("optimizer":{"sgd":{"lr":0.1}},)",
      R"("schedule":{"warmup_cosine":{"warmup_updates":5,"total_updates":)", w,
      R"(,"min_lr_ratio":0.1}},)", R"("clip":{"max_grad_norm":1.0},)",
      R"("loss_scaler":{"enabled":true,"init_scale":1024,"growth_interval":4},)",
      R"("checkpoint":{"dir":")", dir_, R"(/checkpoints","every_updates":10},)",
      R"("eval":{"data":{"synthetic_regression":{"samples":8}},"every_updates":5},)",
      R"("workers":{"count":)", options_.workers, "}}");
}

SimReport ObservedJob::Report(int worker, int64_t window, int rank) {
  if (options_.pause_at_window > 0 && window == options_.pause_at_window &&
      !resume_.HasBeenNotified()) {
    ++paused_;
    resume_.WaitForNotification();
  }
  SimReport r;
  // Every 13th window trains nothing (EMPTY_WINDOW); every 7th overflows (OVERFLOW, the
  // scaler backs off); the norm is above the clip threshold on even windows. Every rank
  // reports the same norm, as replicas in sync do.
  r.units = window % 13 == 0 ? 0 : 8 + rank;
  r.loss_sum = static_cast<double>(r.units) * (0.5 + 3.0 * std::exp(-0.05 * window));
  r.grad_norm = window % 2 == 0 ? 2.5 : 0.75;
  r.found_inf = window % 7 == 0;
  r.scaled_norm = true;  // the spec has a loss scaler
  WorkerMetrics& m = *worker_metrics_[worker];
  m.AddMicroSteps(1);
  m.AddAllReduce(1, 4096);
  m.AddTokens(r.units);
  m.ObservePhase("forward", 0.002);
  m.ObservePhase("backward", 0.004);
  m.ObservePhase("allreduce", 0.001);
  m.ObservePhase("optimizer", 0.0005);
  return r;
}

absl::Status ObservedJob::SubmitAndRun() {
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(10)));
    v1::SubmitJobRequest req;
    req.set_request_id("observability-test");
    req.set_spec_json(spec());
    v1::Job job;
    grpc::Status s = jobs_->SubmitJob(&ctx, req, &job);
    if (!s.ok()) return FromGrpcStatus(s);
    job_id_ = job.job_id();
  }
  const int64_t samples = options_.workers * options_.windows;
  for (int i = 0; i < options_.workers; ++i) {
    worker_metrics_[i]->SetJob(job_id_);
    workers_.push_back(std::make_unique<SimulatedWorker>(
        address_, job_id_, samples,
        [this, i](int64_t window, int rank) { return Report(i, window, rank); }));
    if (absl::Status s = workers_.back()->Register(absl::StrCat("sim-", i)); !s.ok()) return s;
  }
  {
    absl::MutexLock lock(&mu_);
    results_.assign(workers_.size(), absl::OkStatus());
  }
  for (size_t i = 0; i < workers_.size(); ++i) {
    threads_.emplace_back([this, i] {
      absl::Status s = workers_[i]->Run();
      absl::MutexLock lock(&mu_);
      results_[i] = s;
    });
  }
  return absl::OkStatus();
}

bool ObservedJob::WaitUntilPaused(absl::Duration timeout) {
  return WaitFor([this] { return paused_.load() >= options_.workers; }, timeout);
}

void ObservedJob::Resume() {
  if (!resume_.HasBeenNotified()) resume_.Notify();
}

absl::StatusOr<v1::Job> ObservedJob::GetJob() {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  v1::GetJobRequest req;
  req.set_job_id(job_id_);
  v1::Job job;
  grpc::Status s = jobs_->GetJob(&ctx, req, &job);
  if (!s.ok()) return FromGrpcStatus(s);
  return job;
}

absl::StatusOr<v1::Job> ObservedJob::WaitForEnd(absl::Duration timeout) {
  Resume();
  const absl::Time give_up = absl::Now() + timeout;
  absl::StatusOr<v1::Job> job;
  const bool ended = WaitFor(
      [&] {
        job = GetJob();
        return job.ok() && (job->state() == v1::SUCCEEDED || job->state() == v1::FAILED ||
                            job->state() == v1::CANCELLED);
      },
      give_up - absl::Now());
  if (!ended) {
    return absl::DeadlineExceededError(absl::StrCat(
        "job ", job_id_, " did not end within ", absl::FormatDuration(timeout), ": ",
        job.ok() ? v1::JobState_Name(job->state()) : job.status().ToString(), "\n", Logs()));
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  for (auto& w : workers_) w->StopHeartbeats();
  absl::MutexLock lock(&mu_);
  for (const absl::Status& s : results_) {
    if (!s.ok())
      return absl::InternalError(absl::StrCat("a simulated worker failed: ", s.ToString()));
  }
  return job;
}

absl::StatusOr<std::vector<v1::UpdateRecord>> ObservedJob::Updates() {
  std::vector<v1::UpdateRecord> out;
  std::string token;
  do {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(10)));
    v1::ListUpdatesRequest req;
    req.set_job_id(job_id_);
    req.set_page_token(token);
    v1::ListUpdatesResponse resp;
    grpc::Status s = jobs_->ListUpdates(&ctx, req, &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    for (const auto& r : resp.updates()) out.push_back(r);
    token = resp.next_page_token();
  } while (!token.empty());
  return out;
}

std::vector<int> ObservedJob::worker_metrics_ports() const {
  std::vector<int> ports;
  for (const auto& m : worker_metrics_) ports.push_back(m->port());
  return ports;
}

}  // namespace trainstep::obs
