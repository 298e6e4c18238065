// `job watch` against a fake coordinator: an in-process JobService on 127.0.0.1 that serves a
// fixed per-update log and drops the first stream after a chosen record, so that where the
// resumed stream starts is exercised exactly.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/commands.h"
#include "client/format.h"
#include "common/channel.h"
#include "trainstep/v1/job_service.grpc.pb.h"

namespace trainstep::client {
namespace {

v1::Job Job(v1::JobState state) {
  v1::Job job;
  job.set_job_id("job-7");
  job.set_state(state);
  return job;
}

v1::UpdateRecord Record(int64_t generation, int64_t window, const std::string& outcome,
                        int64_t update) {
  v1::UpdateRecord r;
  r.set_generation(generation);
  r.set_window_id(window);
  r.set_outcome(outcome);
  if (outcome == "abort") r.set_reason("WORKER_LOST");
  r.set_optimizer_update_id(update);
  r.set_loss(1.0 + static_cast<double>(window));
  return r;
}

// Every rank of generation 1 is lost in window 3: generation 2 rolls back to the checkpoint of
// update 1, so its window ids restart below the last one seen. Update 2 is evaluated in both
// generations: its record is sent only once it carries its eval_loss.
std::vector<v1::UpdateRecord> RollbackLog() {
  std::vector<v1::UpdateRecord> log = {Record(1, 1, "commit", 1), Record(1, 2, "commit", 2),
                                       Record(1, 3, "abort", 2), Record(2, 2, "commit", 2),
                                       Record(2, 3, "commit", 3)};
  log[1].set_eval_loss(2.5);
  log[3].set_eval_loss(2.25);
  return log;
}

// Serves `log` as the coordinator does: the records after the request's `after`, or those from
// its from_window_id on (written out here, independently of the code under test), between the
// job's state and its end; as an older coordinator, which does not know `after`, when
// `knows_after` is false. The first stream breaks (UNAVAILABLE, as on a coordinator restart)
// right after sending record `drop_after`.
class FakeWatchService final : public v1::JobService::Service {
 public:
  FakeWatchService(std::vector<v1::UpdateRecord> log, size_t drop_after, bool knows_after)
      : log_(std::move(log)), drop_after_(drop_after), knows_after_(knows_after) {}

  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::WatchJobEvent>* writer) override {
    bool first;
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*req);
      first = requests_.size() == 1;
    }
    v1::WatchJobEvent event;
    *event.mutable_job() = Job(v1::RUNNING);
    writer->Write(event);
    const bool exact = knows_after_ && req->has_after();
    size_t start = 0;
    if (exact) {
      while (start < log_.size() && (log_[start].generation() != req->after().generation() ||
                                     log_[start].window_id() != req->after().window_id())) {
        ++start;
      }
      if (start == log_.size()) return grpc::Status(grpc::INVALID_ARGUMENT, "no such record");
      ++start;
    }
    for (size_t i = start; i < log_.size(); ++i) {
      if (!exact && log_[i].window_id() < req->from_window_id()) continue;
      *event.mutable_update() = log_[i];
      writer->Write(event);
      if (first && i == drop_after_) return grpc::Status(grpc::UNAVAILABLE, "restarting");
    }
    *event.mutable_job() = Job(v1::SUCCEEDED);
    writer->Write(event);
    return grpc::Status::OK;
  }

  std::vector<v1::WatchJobRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  const std::vector<v1::UpdateRecord> log_;
  const size_t drop_after_;
  const bool knows_after_;
  absl::Mutex mu_;
  std::vector<v1::WatchJobRequest> requests_ ABSL_GUARDED_BY(mu_);
};

struct Watched {
  int rc = -1;
  std::vector<std::string> update_lines;  // the per-update lines `job watch` printed
  std::vector<v1::WatchJobRequest> requests;
  std::string err;
};

Watched WatchAgainst(FakeWatchService* service) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  Watched w;
  if (server == nullptr) {
    ADD_FAILURE() << "the fake coordinator did not start";
    return w;
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(MakeChannel(address));
  std::ostringstream out, err;
  CommandContext ctx;
  ctx.stub = stub.get();
  ctx.coordinator = address;
  ctx.out = &out;
  ctx.err = &err;
  ctx.watch_retry_delay = absl::Milliseconds(1);
  ctx.watch_no_progress_timeout = absl::Seconds(30);  // bounds a watch that would hang
  w.rc = JobWatch(ctx, "job-7");
  server->Shutdown();
  w.err = err.str();
  for (absl::string_view line : absl::StrSplit(w.err, '\n')) {
    if (absl::StartsWith(line, "window ")) w.update_lines.emplace_back(line);
  }
  w.requests = service->requests();
  return w;
}

// Catches: a watch that resumes by window id alone (`from_window_id` = the last window shown)
// and so skips the records of a rollback, whose window ids restart below it (dropped after the
// abort, the evaluated update 2 of generation 2 was lost), or that prints a record twice (an
// older coordinator replays the log from the start).
TEST(WatchResumeTest, EveryRecordOnceInOrderWhereverTheStreamBreaks) {
  const std::vector<v1::UpdateRecord> log = RollbackLog();
  std::vector<std::string> expected;
  for (const v1::UpdateRecord& r : log) expected.push_back(UpdateLine(r));
  ASSERT_TRUE(absl::StrContains(expected[3], "eval_loss=2.25")) << expected[3];
  for (const bool knows_after : {true, false}) {
    for (size_t drop_after = 0; drop_after < log.size(); ++drop_after) {
      SCOPED_TRACE(absl::StrCat(knows_after ? "" : "an older coordinator; ",
                                "the first stream breaks after record ", drop_after));
      FakeWatchService service(log, drop_after, knows_after);
      const Watched w = WatchAgainst(&service);
      EXPECT_EQ(w.rc, kExitOk) << w.err;
      EXPECT_EQ(w.update_lines, expected) << w.err;
      EXPECT_TRUE(absl::StrContains(w.err, "reconnecting")) << w.err;
      ASSERT_EQ(w.requests.size(), 2u);
      EXPECT_FALSE(w.requests[0].has_after());
      EXPECT_EQ(w.requests[0].from_window_id(), 0);
      // The reconnection asks for what follows the last record shown, by generation and window.
      EXPECT_TRUE(w.requests[1].has_after());
      EXPECT_EQ(w.requests[1].after().generation(), log[drop_after].generation());
      EXPECT_EQ(w.requests[1].after().window_id(), log[drop_after].window_id());
      EXPECT_EQ(w.requests[1].from_window_id(), 0);
    }
  }
}

}  // namespace
}  // namespace trainstep::client
