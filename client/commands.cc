#include "client/commands.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/format.h"
#include "client/plot.h"
#include "client/progress.h"
#include "common/channel.h"
#include "common/fnv1a.h"
#include "common/grpc_status.h"
#include "common/proto_bytes.h"
#include "common/proto_json.h"
#include "common/record_position.h"
#include "core/job_state.h"
#include "core/spec.h"
#include "core/window_outcome.h"

namespace trainstep::client {
namespace {

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration d) {
  return std::chrono::system_clock::now() + std::chrono::microseconds(absl::ToInt64Microseconds(d));
}

// One unary call with the context's deadline.
template <typename Req, typename Resp, typename Method>
grpc::Status Call(const CommandContext& ctx, Method method, const Req& req, Resp* resp) {
  grpc::ClientContext call;
  call.set_deadline(DeadlineAfter(ctx.timeout));
  return (ctx.stub->*method)(&call, req, resp);
}

// Every page of a list call, merged into `all`: the server pages lists so that each response
// fits gRPC's message limit. A token that does not move is the server's bug, not a loop.
template <typename Req, typename Resp, typename Method>
grpc::Status CallAllPages(const CommandContext& ctx, Method method, Req req, Resp* all) {
  while (true) {
    Resp page;
    grpc::Status s = Call(ctx, method, req, &page);
    if (!s.ok()) return s;
    const std::string next = page.next_page_token();
    all->MergeFrom(page);
    all->clear_next_page_token();
    if (next.empty()) return grpc::Status::OK;
    if (next == req.page_token()) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          "the coordinator returned the same page token twice");
    }
    req.set_page_token(next);
  }
}

// The job's whole per-update log, oldest first, fetched a page (≤ 1000 records) at a time.
grpc::Status AllUpdates(const CommandContext& ctx, const std::string& job_id,
                        std::vector<v1::UpdateRecord>* records) {
  v1::ListUpdatesRequest req;
  req.set_job_id(job_id);
  req.set_page_size(1000);
  v1::ListUpdatesResponse all;
  grpc::Status s = CallAllPages(ctx, &v1::JobService::StubInterface::ListUpdates, req, &all);
  if (!s.ok()) return s;
  records->assign(std::make_move_iterator(all.mutable_updates()->begin()),
                  std::make_move_iterator(all.mutable_updates()->end()));
  return grpc::Status::OK;
}

void PrintError(const CommandContext& ctx, const std::string& message) {
  *ctx.err << Colorize("error:", Color::kRed, ctx.color_err) << " " << message << "\n";
}

std::string Json(const google::protobuf::Message& m, bool pretty) {
  std::string s = ToJson(m, pretty);
  absl::StripTrailingAsciiWhitespace(&s);
  return s;
}

template <typename Messages>
std::string JsonArray(const Messages& messages, bool pretty) {
  if (messages.empty()) return "[]\n";
  std::string s = "[";
  bool first = true;
  for (const auto& m : messages) {
    absl::StrAppend(&s, first ? "\n" : ",\n", Json(m, pretty));
    first = false;
  }
  absl::StrAppend(&s, "\n]\n");
  return s;
}

std::string MiB(size_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

int64_t UnixMinute(absl::Time now) { return absl::ToUnixSeconds(now) / 60; }

std::string TimeAndAge(int64_t unix_ms, absl::Time now) {
  if (unix_ms <= 0) return "-";
  const absl::Time t = absl::FromUnixMillis(unix_ms);
  return absl::StrCat(absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", t, absl::LocalTimeZone()), " (",
                      ShortDuration(now - t), " ago)");
}

std::string Age(int64_t unix_ms, absl::Time now) {
  return unix_ms > 0 ? ShortDuration(now - absl::FromUnixMillis(unix_ms)) : "-";
}

bool Ended(const v1::Job& job) { return IsTerminal(job.state()); }

std::string UpdatesOfMax(const v1::Job& job) {
  const int64_t max = MaxUpdates(job);
  return max > 0 ? absl::StrCat(job.progress().optimizer_update_id(), "/", max)
                 : absl::StrCat(job.progress().optimizer_update_id());
}

std::string Workers(const v1::Job& job) {
  return absl::StrCat(job.progress().world_size(), "/", job.spec().workers().count());
}

std::string LastLoss(const v1::Job& job) {
  return job.progress().optimizer_update_id() > 0 ? FormatLoss(job.progress().last_loss()) : "-";
}

std::string Unit(const v1::Job& job) { return IsTokenLevel(job.spec()) ? "tok" : "samples"; }

// "job-3 SUCCEEDED: 200 updates in 1m20s (200 windows, 2 skipped, 0 aborted), 1.2M tok, loss 2.314"
std::string Summary(const v1::Job& job, bool color) {
  const v1::JobProgress& p = job.progress();
  std::string s = absl::StrCat(job.job_id(), " ",
                               Colorize(JobStateName(job.state()), StateColor(job.state()), color),
                               ": ", p.optimizer_update_id(), " updates");
  if (job.start_time_ms() > 0 && job.end_time_ms() >= job.start_time_ms()) {
    absl::StrAppend(&s, " in ",
                    ShortDuration(absl::Milliseconds(job.end_time_ms() - job.start_time_ms())));
  }
  absl::StrAppend(&s, " (", p.window_id(), " windows, ", p.windows_skipped(), " skipped, ",
                  p.windows_aborted(), " aborted), ", FormatSi(p.cumulative_tokens()), " ",
                  Unit(job), ", loss ", LastLoss(job));
  if (!job.message().empty()) absl::StrAppend(&s, ": ", job.message());
  return s;
}

// The single progress line on a terminal, redrawn in place with \r (padding erases the
// tail of a longer previous line; no escape codes, so NO_COLOR terminals are safe too).
class LiveLine {
 public:
  LiveLine(std::ostream* err, bool enabled) : err_(err), enabled_(enabled) {}
  ~LiveLine() { End(); }

  // Redraws at most every 100 ms unless `force`: a replayed history is thousands of events.
  void Draw(const std::string& line, bool force) {
    if (!enabled_) return;
    const absl::Time now = absl::Now();
    if (!force && drawn_ && now - last_draw_ < absl::Milliseconds(100)) return;
    *err_ << '\r' << line;
    if (last_size_ > line.size()) *err_ << std::string(last_size_ - line.size(), ' ');
    err_->flush();
    last_size_ = line.size();
    last_draw_ = now;
    drawn_ = true;
  }
  // Leaves the line as drawn and moves to the next one.
  void End() {
    if (drawn_) *err_ << "\n";
    err_->flush();
    drawn_ = false;
    last_size_ = 0;
  }

 private:
  std::ostream* err_;
  bool enabled_;
  bool drawn_ = false;
  size_t last_size_ = 0;
  absl::Time last_draw_;
};

int ReadSpec(const CommandContext& ctx, const std::string& path, std::string* bytes) {
  if (path == "-") {
    if (ctx.in == nullptr) {
      PrintError(ctx, "cannot read the spec from stdin");
      return kExitUsage;
    }
    std::ostringstream buf;
    buf << ctx.in->rdbuf();
    if (ctx.in->bad()) {
      PrintError(ctx, "cannot read the spec from stdin");
      return kExitUsage;
    }
    *bytes = buf.str();
    return kExitOk;
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    PrintError(ctx, absl::StrCat("cannot read SPEC file \"", path, "\": it is a directory"));
    return kExitUsage;
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    PrintError(ctx, absl::StrCat("cannot read SPEC file \"", path, "\": ", std::strerror(errno)));
    return kExitUsage;
  }
  std::ostringstream buf;
  buf << f.rdbuf();
  if (f.bad()) {
    PrintError(ctx, absl::StrCat("cannot read SPEC file \"", path, "\": ", std::strerror(errno)));
    return kExitUsage;
  }
  *bytes = buf.str();
  return kExitOk;
}

}  // namespace

std::string DefaultRequestId(std::string_view spec_bytes, absl::Time now) {
  return absl::StrFormat("submit-%016x-%d", Fnv1a64(spec_bytes.data(), spec_bytes.size()),
                         UnixMinute(now));
}

int ExitCodeOfJob(const v1::Job& job) {
  switch (job.state()) {
    case v1::SUCCEEDED:
      return kExitOk;
    case v1::FAILED:
      return kExitJobFailed;
    case v1::CANCELLED:
      return kExitJobCancelled;
    default:
      return kExitError;
  }
}

int ReportRpcError(const CommandContext& ctx, const grpc::Status& status) {
  const std::string hint =
      absl::StrCat("start it with `trainstep-coordinator --listen ", ctx.coordinator,
                   "`, or pass --coordinator / set TRAINSTEP_COORDINATOR");
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::ALREADY_EXISTS:
      PrintError(ctx, status.error_message());
      return kExitUsage;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      // Not the coordinator's own limit (a full job table): gRPC's size limit on a message
      // ("Received message larger than max (5000123 vs. 4194304)"), invalid input.
      if (!IsCoordinatorError(status)) {
        PrintError(ctx, absl::StrCat("the request is larger than the coordinator accepts (bytes "
                                     "sent vs. its limit): ",
                                     status.error_message()));
        return kExitUsage;
      }
      PrintError(ctx, status.error_message());
      return kExitError;
    case grpc::StatusCode::NOT_FOUND:
      PrintError(ctx, status.error_message());
      return kExitNotFound;
    case grpc::StatusCode::UNAVAILABLE: {
      const std::string security = ExplainSecurityFailure(
          absl::Status(absl::StatusCode::kUnavailable, status.error_message()), ctx.security,
          ctx.coordinator);
      PrintError(ctx, security.empty() ? absl::StrCat("coordinator at ", ctx.coordinator,
                                                      " is not reachable: ", hint)
                                       : security);
      return kExitUnavailable;
    }
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      PrintError(ctx, absl::StrCat(status.error_code() == grpc::StatusCode::UNAUTHENTICATED
                                       ? "not authenticated: "
                                       : "permission denied: ",
                                   status.error_message()));
      return kExitDenied;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      PrintError(ctx, absl::StrCat("coordinator at ", ctx.coordinator, " did not answer within ",
                                   absl::FormatDuration(ctx.timeout),
                                   " (--timeout): is it running? ", hint));
      return kExitUnavailable;
    default:
      PrintError(ctx, status.error_message().empty()
                          ? absl::StrCat("call failed with gRPC code ", status.error_code())
                          : status.error_message());
      return kExitError;
  }
}

int JobSubmit(const CommandContext& ctx, const std::string& spec_path,
              const std::string& request_id, bool watch) {
  std::string bytes;
  if (int rc = ReadSpec(ctx, spec_path, &bytes); rc != kExitOk) return rc;
  v1::SubmitJobRequest req;
  req.set_request_id(request_id.empty() ? DefaultRequestId(bytes, ctx.clock->Now()) : request_id);
  // Sent as is: the coordinator parses it, so its errors name the field the user wrote.
  req.set_spec_json(bytes);
  if (req.ByteSizeLong() > static_cast<size_t>(kMaxMessageBytes)) {
    PrintError(ctx, absl::StrFormat(
                        "the spec %s is %d bytes (%s); the coordinator accepts "
                        "requests of at most %d bytes (%s): refer to large data by "
                        "path instead of inlining it",
                        spec_path == "-" ? "on stdin" : absl::StrCat("\"", spec_path, "\""),
                        bytes.size(), MiB(bytes.size()), kMaxMessageBytes, MiB(kMaxMessageBytes)));
    return kExitUsage;
  }
  v1::Job job;
  grpc::Status s = Call(ctx, &v1::JobService::StubInterface::SubmitJob, req, &job);
  if (!s.ok()) return ReportRpcError(ctx, s);
  if (ctx.output == Output::kJson) {
    // With --watch, the final Job is the one JSON document printed.
    if (!watch) *ctx.out << Json(job, true) << "\n";
  } else {
    *ctx.out << job.job_id() << "\n";
  }
  ctx.out->flush();
  if (job.state() == v1::PENDING) {
    *ctx.err << job.job_id() << " is PENDING until " << job.spec().workers().count()
             << " worker(s) join: trainstep-worker --coordinator " << ctx.coordinator << " --job "
             << job.job_id() << "\n";
  }
  if (watch) return JobWatch(ctx, job.job_id());
  return kExitOk;
}

int JobGet(const CommandContext& ctx, const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::Job job;
  grpc::Status s = Call(ctx, &v1::JobService::StubInterface::GetJob, req, &job);
  if (!s.ok()) return ReportRpcError(ctx, s);
  if (ctx.output == Output::kJson) {
    *ctx.out << Json(job, true) << "\n";
    return kExitOk;
  }
  const absl::Time now = ctx.clock->Now();
  const v1::JobProgress& p = job.progress();
  std::vector<std::pair<std::string, std::string>> kv = {
      {"id", job.job_id()},
      {"name", job.name().empty() ? "-" : job.name()},
      {"state", Colorize(JobStateName(job.state()), StateColor(job.state()), ctx.color_out)},
  };
  if (!job.message().empty()) kv.emplace_back("message", job.message());
  auto count_or_dash = [](int64_t v) { return v > 0 ? absl::StrCat(v) : std::string("-"); };
  const std::vector<std::pair<std::string, std::string>> rest = {
      {"request id", job.request_id().empty() ? "-" : job.request_id()},
      {"submitted", TimeAndAge(job.submit_time_ms(), now)},
      {"started", TimeAndAge(job.start_time_ms(), now)},
      {"ended", TimeAndAge(job.end_time_ms(), now)},
      {"updates", UpdatesOfMax(job)},
      {"windows", absl::StrCat(p.window_id(), " (committed ", p.windows_committed(), ", skipped ",
                               p.windows_skipped(), ", aborted ", p.windows_aborted(), ")")},
      {"scheduler step", absl::StrCat(p.scheduler_step())},
      {"epoch", absl::StrCat(p.epoch())},
      {"micro-step id", absl::StrCat(p.micro_step_id())},
      {"windows per epoch", count_or_dash(p.windows_per_epoch())},
      {"dataset samples", count_or_dash(p.dataset_samples())},
      {"generation", absl::StrCat(p.generation(),
                                  p.rollbacks() > 0 ? absl::StrCat(" (", p.rollbacks(),
                                                                   " rolled back to a checkpoint)")
                                                    : "")},
      {"world size", Workers(job)},
      {IsTokenLevel(job.spec()) ? "tokens" : "samples", absl::StrCat(p.cumulative_tokens())},
      {"loss", LastLoss(job)},
      {"eval loss", p.has_last_eval_loss() ? absl::StrCat(FormatLoss(p.last_eval_loss()),
                                                          " (update ", p.last_eval_update_id(), ")")
                                           : std::string("-")},
      {"throughput", ThroughputText(job)},
      {"loss scale", FormatLossScale(p.loss_scale())},
      {"learning rate", FormatLearningRate(p.learning_rate())},
      {"checkpoint",
       absl::StrCat(p.checkpoint_id(), " (durable: ",
                    p.durable_checkpoint_id() < 0 ? std::string("none")
                                                  : absl::StrCat(p.durable_checkpoint_id()),
                    ")")},
  };
  kv.insert(kv.end(), rest.begin(), rest.end());
  if (!p.waiting().empty()) kv.emplace_back("waiting", p.waiting());  // short of workers
  if (p.has_goodput()) {  // where the time went since the first commit
    const v1::Goodput& g = p.goodput();
    kv.emplace_back(
        "goodput", absl::StrFormat("%.2f%% of %.1fs (lost: re-forming %.1fs, rollbacks %.1fs, "
                                   "skips %.1fs, storage %.1fs)",
                                   100 * g.ratio(), g.wall_seconds(), g.reform_seconds(),
                                   g.rollback_seconds(), g.skipped_seconds(), g.storage_seconds()));
  }
  if (p.checkpoint_failures() > 0) {  // checkpoints that could not be written
    kv.emplace_back(
        "checkpoint failures",
        absl::StrCat(p.checkpoint_failures(), " (latest: ", p.last_checkpoint_failure(), ")"));
  }
  if (p.hangs() > 0) {  // ranks fenced as hung, and where the latest was stuck
    kv.emplace_back("hangs", absl::StrCat(p.hangs(), " (latest: ", p.last_hang(), ")"));
  }
  if (!job.spec().validate().rerun_on().empty()) {  // which windows were re-run, and why
    kv.emplace_back(
        "reruns",
        absl::StrCat(p.reruns(), " (", p.reruns_transient(), " transient: a fault on a rank; ",
                     p.reruns() - p.reruns_transient(), " persistent: the data or the model)"));
  }
  for (const v1::RankScore& score : p.rank_scores()) {  // which rank is slow, and where
    kv.emplace_back(absl::StrCat("rank ", score.rank()), RankScoreText(score));
  }
  if (job.spec().batch().tail() == v1::Batch::drop) {
    // Every epoch drops as many samples; the latest epoch's record names them.
    kv.emplace_back("dropped tail", p.has_last_dropped_tail()
                                        ? absl::StrCat(p.dropped_samples(), " samples so far; ",
                                                       DroppedTailText(p.last_dropped_tail()))
                                        : absl::StrCat(p.dropped_samples(), " samples so far"));
  }
  std::string spec = JobSpecToJson(job.spec(), /*pretty=*/true);
  absl::StripTrailingAsciiWhitespace(&spec);
  *ctx.out << RenderKeyValues(kv) << "spec:\n" << spec << "\n";
  if (job.model_config().fields_size() > 0) {  // model.llama: the config.json the workers read
    std::string config = ToJson(job.model_config(), /*pretty=*/true);
    absl::StripTrailingAsciiWhitespace(&config);
    *ctx.out << "model config:\n" << config << "\n";
  }
  return kExitOk;
}

int JobList(const CommandContext& ctx) {
  v1::ListJobsResponse resp;
  grpc::Status s =
      CallAllPages(ctx, &v1::JobService::StubInterface::ListJobs, v1::ListJobsRequest(), &resp);
  if (!s.ok()) return ReportRpcError(ctx, s);
  if (ctx.output == Output::kJson) {
    *ctx.out << JsonArray(resp.jobs(), /*pretty=*/true);
    return kExitOk;
  }
  if (resp.jobs().empty()) {
    *ctx.err << "no jobs (submit one with: trainstep job submit SPEC.json)\n";
    return kExitOk;
  }
  const absl::Time now = ctx.clock->Now();
  std::vector<std::vector<Cell>> rows;
  for (const v1::Job& job : resp.jobs()) {
    rows.push_back({job.job_id(), job.name().empty() ? "-" : job.name(),
                    Cell(JobStateName(job.state()), StateColor(job.state())), UpdatesOfMax(job),
                    LastLoss(job), FormatLossScale(job.progress().loss_scale()), Workers(job),
                    Age(job.submit_time_ms(), now)});
  }
  *ctx.out << RenderTable({"ID", "NAME", "STATE", "UPDATES/MAX", "LOSS", "SCALE", "WORKERS", "AGE"},
                          rows, ctx.color_out);
  return kExitOk;
}

int JobWatch(const CommandContext& ctx, const std::string& job_id) {
  ProgressTracker tracker;
  LiveLine line(ctx.err, ctx.live_progress);
  // The newest record handled: a resumed stream starts right after it. Records arrive in
  // log order, so one not after it (an older coordinator resends the log) is a duplicate.
  std::optional<v1::RecordPosition> last_record;
  v1::JobState shown_state = v1::JOB_STATE_UNSPECIFIED;
  int64_t shown_generation = -1;
  std::string shown_waiting;
  std::optional<absl::Time> broken_since;
  // --timeout: the stream's deadline is the moment the job has made no progress (a new state
  // or a new update) for that long; reaching it with progress since, the stream is resumed.
  std::string last_job_seen;
  absl::Time last_progress = absl::Now();
  while (true) {
    grpc::ClientContext call;  // without --timeout no deadline: it lasts as long as the job
    if (ctx.watch_no_progress_timeout.has_value()) {
      call.set_deadline(
          DeadlineAfter(last_progress + *ctx.watch_no_progress_timeout - absl::Now()));
    }
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    if (last_record.has_value()) *req.mutable_after() = *last_record;
    std::unique_ptr<grpc::ClientReaderInterface<v1::WatchJobEvent>> reader =
        ctx.stub->WatchJob(&call, req);
    v1::WatchJobEvent event;
    while (reader->Read(&event)) {
      broken_since.reset();
      const absl::Time now = ctx.clock->Now();
      if (event.has_job()) {
        std::string seen = ComparableBytes(event.job());
        if (seen != last_job_seen) {
          last_job_seen = std::move(seen);
          last_progress = absl::Now();
        }
        tracker.OnJob(event.job(), now);
        const v1::Job& job = event.job();
        if (!ctx.live_progress &&
            (job.state() != shown_state || job.progress().generation() != shown_generation ||
             job.progress().waiting() != shown_waiting)) {
          *ctx.err << "job " << job.job_id() << " " << JobStateName(job.state()) << " (generation "
                   << job.progress().generation() << ", world size " << Workers(job)
                   << (job.progress().waiting().empty() ? "" : "; ") << job.progress().waiting()
                   << ")\n";
          shown_state = job.state();
          shown_generation = job.progress().generation();
          shown_waiting = job.progress().waiting();
        }
      } else if (event.has_update()) {
        const v1::UpdateRecord& r = event.update();
        if (last_record.has_value() && !IsAfter(r, *last_record)) continue;
        last_record = PositionOf(r);
        last_progress = absl::Now();
        tracker.OnUpdate(r, now);
        if (!ctx.live_progress) *ctx.err << UpdateLine(r) << "\n";
      }
      if (tracker.has_job()) line.Draw(ProgressLine(tracker.View(now)), /*force=*/false);
    }
    grpc::Status s = reader->Finish();
    if (s.ok()) break;
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        ctx.watch_no_progress_timeout.has_value()) {
      if (absl::Now() - last_progress < *ctx.watch_no_progress_timeout) continue;  // resume
      line.End();
      PrintError(ctx,
                 absl::StrCat(job_id, " made no progress for ",
                              absl::FormatDuration(*ctx.watch_no_progress_timeout), " (--timeout)",
                              tracker.has_job()
                                  ? absl::StrCat(": it is ", JobStateName(tracker.job().state()),
                                                 ", ", Workers(tracker.job()), " workers, ",
                                                 UpdatesOfMax(tracker.job()), " updates")
                                  : ""));
      return kExitNoProgress;
    }
    // A coordinator restart breaks the stream (UNAVAILABLE, or CANCELLED as the server shuts
    // down: this client never cancels its call). The journal keeps the job, so reconnect for
    // up to --timeout and resume after the last record shown.
    const bool broken = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                        s.error_code() == grpc::StatusCode::CANCELLED;
    if (broken && tracker.has_job()) {
      if (!broken_since.has_value()) {
        broken_since = absl::Now();
        line.End();
        *ctx.err << "lost the coordinator at " << ctx.coordinator << "; reconnecting\n";
      }
      if (absl::Now() - *broken_since < ctx.timeout) {
        std::this_thread::sleep_for(
            std::chrono::microseconds(absl::ToInt64Microseconds(ctx.watch_retry_delay)));
        continue;
      }
    }
    line.End();
    return ReportRpcError(ctx, s);
  }
  if (tracker.has_job()) line.Draw(ProgressLine(tracker.View(ctx.clock->Now())), /*force=*/true);
  line.End();
  if (!tracker.has_job() || !Ended(tracker.job())) {
    PrintError(ctx, absl::StrCat("the watch of ", job_id, " ended before the job did"));
    return kExitError;
  }
  const v1::Job& job = tracker.job();
  if (ctx.output == Output::kJson) {
    *ctx.out << Json(job, true) << "\n";
  } else {
    *ctx.out << Summary(job, ctx.color_out) << "\n";
  }
  ctx.out->flush();
  return ExitCodeOfJob(job);
}

int JobCancel(const CommandContext& ctx, const std::string& job_id) {
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  req.set_request_id(absl::StrCat("cancel-", job_id, "-", UnixMinute(ctx.clock->Now())));
  v1::Job job;
  grpc::Status s = Call(ctx, &v1::JobService::StubInterface::CancelJob, req, &job);
  if (!s.ok()) return ReportRpcError(ctx, s);
  if (ctx.output == Output::kJson) {
    *ctx.out << Json(job, true) << "\n";
  } else {
    *ctx.out << job.job_id() << " "
             << Colorize(JobStateName(job.state()), StateColor(job.state()), ctx.color_out) << "\n";
  }
  return kExitOk;
}

int JobLogs(const CommandContext& ctx, const std::string& job_id) {
  std::vector<v1::UpdateRecord> records;
  if (grpc::Status s = AllUpdates(ctx, job_id, &records); !s.ok()) return ReportRpcError(ctx, s);

  switch (ctx.output) {
    case Output::kJsonl:
      for (const v1::UpdateRecord& r : records) *ctx.out << RecordToJson(r) << "\n";
      return kExitOk;
    case Output::kJson:
      *ctx.out << JsonArray(records, /*pretty=*/false);
      return kExitOk;
    case Output::kTable:
      break;
  }
  if (records.empty()) {
    *ctx.err << "no updates yet for " << job_id << "\n";
    return kExitOk;
  }
  // The scaled norm only for a job with a loss scaler (every commit of it has one).
  const bool scaled = std::any_of(records.begin(), records.end(), [](const v1::UpdateRecord& r) {
    return r.has_grad_norm_scaled();
  });
  std::vector<std::vector<Cell>> rows;
  for (const v1::UpdateRecord& r : records) {
    const v1::WindowOutcome outcome = OutcomeOf(r);
    const Color c = outcome == v1::ABORT  ? Color::kRed
                    : outcome == v1::SKIP ? Color::kYellow
                                          : Color::kNone;
    std::vector<Cell> row = {absl::StrCat(r.window_id()),
                             absl::StrCat(r.generation()),
                             absl::StrCat(r.world_size()),
                             Cell(r.outcome(), c),
                             r.reason().empty() ? "-" : r.reason(),
                             absl::StrCat(r.optimizer_update_id()),
                             absl::StrCat(r.micro_step_id()),
                             absl::StrFormat("%.5g", r.loss()),
                             absl::StrFormat("%g", r.learning_rate()),
                             FormatLossScale(r.loss_scale())};
    if (scaled) {
      row.push_back(r.has_grad_norm_scaled() ? absl::StrFormat("%.4g", r.grad_norm_scaled())
                                             : std::string("-"));
    }
    std::string note = r.tail_window() ? "tail window" : "";
    if (r.has_dropped_tail()) note = absl::StrCat("dropped ", DroppedTailText(r.dropped_tail()));
    const std::vector<Cell> rest = {
        absl::StrFormat("%.2f->%.2f", r.grad_norm_pre_clip(), r.grad_norm_post_clip()),
        absl::StrCat(r.global_valid_tokens()), absl::StrFormat("%.3f", r.window_seconds()),
        r.has_update_interval_seconds() ? absl::StrFormat("%.3f", r.update_interval_seconds())
                                        : std::string("-"),
        note};
    row.insert(row.end(), rest.begin(), rest.end());
    rows.push_back(std::move(row));
  }
  std::vector<std::string> header = {"WINDOW", "GEN",   "WORLD", "OUTCOME", "REASON",
                                     "UPDATE", "MICRO", "LOSS",  "LR",      "SCALE"};
  if (scaled) header.push_back("SCALED NORM");
  for (const char* h : {"NORM", "TOKENS", "SECONDS", "INTERVAL", "NOTE"}) header.push_back(h);
  *ctx.out << RenderTable(header, rows, ctx.color_out);
  return kExitOk;
}

int JobPlot(const CommandContext& ctx, const std::string& job_id, const std::string& out_path) {
  PlotInput input;
  {
    v1::GetJobRequest req;
    req.set_job_id(job_id);
    v1::Job job;
    grpc::Status s = Call(ctx, &v1::JobService::StubInterface::GetJob, req, &job);
    if (!s.ok()) return ReportRpcError(ctx, s);
    input.job_id = job.job_id();
    input.job_name = job.name();
  }
  if (grpc::Status s = AllUpdates(ctx, job_id, &input.records); !s.ok()) {
    return ReportRpcError(ctx, s);
  }

  const std::string svg = RenderPlotSvg(input);
  if (out_path == "-") {
    *ctx.out << svg;
    return kExitOk;
  }
  // Through a temporary file, so that FILE.svg is never half-written.
  const std::string tmp = out_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << svg;
    out.close();
    if (!out) {
      PrintError(ctx, absl::StrCat("cannot write \"", out_path, "\": ", std::strerror(errno)));
      std::filesystem::remove(tmp);
      return kExitError;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, out_path, ec);
  if (ec) {
    PrintError(ctx, absl::StrCat("cannot write \"", out_path, "\": ", ec.message()));
    std::filesystem::remove(tmp, ec);
    return kExitError;
  }
  *ctx.err << "wrote " << out_path << ": " << input.records.size() << " windows of " << job_id
           << "\n";
  return kExitOk;
}

int WorkerList(const CommandContext& ctx, const std::string& job_id) {
  v1::ListWorkersRequest req;
  req.set_job_id(job_id);
  v1::ListWorkersResponse resp;
  grpc::Status s = CallAllPages(ctx, &v1::JobService::StubInterface::ListWorkers, req, &resp);
  if (!s.ok()) return ReportRpcError(ctx, s);
  if (ctx.output == Output::kJson) {
    *ctx.out << JsonArray(resp.workers(), /*pretty=*/true);
    return kExitOk;
  }
  if (resp.workers().empty()) {
    *ctx.err << "no workers" << (job_id.empty() ? "" : absl::StrCat(" in ", job_id)) << "\n";
    return kExitOk;
  }
  const absl::Time now = ctx.clock->Now();
  std::vector<std::vector<Cell>> rows;
  for (const v1::WorkerInfo& w : resp.workers()) {
    const std::string state = WorkerStateText(w);
    const Color c = w.state() == v1::ACTIVE ? Color::kGreen
                    : w.state() == v1::LOST ? Color::kRed
                                            : Color::kNone;
    rows.push_back(
        {w.worker_id(), w.name().empty() ? "-" : w.name(), w.job_id(),
         w.host().empty() ? "-" : w.host(), Cell(state, c),
         w.rank() >= 0 ? absl::StrCat(w.rank()) : "-", absl::StrCat(w.generation()),
         // A straggler (under half the fastest's speed, as the alert rule says) stands out.
         Cell(ScoreCell(w),
              w.has_score() && w.score().relative() < 0.5 ? Color::kYellow : Color::kNone),
         w.last_heartbeat_ms() > 0 ? absl::StrCat(Age(w.last_heartbeat_ms(), now), " ago") : "-",
         Age(w.registered_ms(), now)});
  }
  *ctx.out << RenderTable(
      {"ID", "NAME", "JOB", "HOST", "STATE", "RANK", "GEN", "SCORE", "HEARTBEAT", "AGE"}, rows,
      ctx.color_out);
  return kExitOk;
}

int CheckpointExport(const CommandContext& ctx, const ExportOptions& options) {
  const absl::Status s = ExportCheckpoint(options, *ctx.out);
  if (!s.ok()) {
    PrintError(ctx, std::string(s.message()));
    return kExitError;
  }
  return kExitOk;
}

int RunCommand(const CommandContext& ctx, const Invocation& inv) {
  switch (inv.command) {
    case Command::kJobSubmit:
      return JobSubmit(ctx, inv.spec_path, inv.request_id, inv.watch);
    case Command::kJobGet:
      return JobGet(ctx, inv.job_id);
    case Command::kJobList:
      return JobList(ctx);
    case Command::kJobWatch:
      return JobWatch(ctx, inv.job_id);
    case Command::kJobCancel:
      return JobCancel(ctx, inv.job_id);
    case Command::kJobLogs:
      return JobLogs(ctx, inv.job_id);
    case Command::kJobPlot:
      return JobPlot(ctx, inv.job_id, inv.out_path);
    case Command::kWorkerList:
      return WorkerList(ctx, inv.job_id);
    case Command::kCheckpointExport:
      return CheckpointExport(ctx, inv.export_options);
  }
  return kExitError;
}

}  // namespace trainstep::client
