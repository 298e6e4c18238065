// The JobService calls' bodies (rpc_table.h), run under the Coordinator's lock.
#include <algorithm>

#include "common/proto_bytes.h"
#include "common/status_macros.h"
#include "coordinator/coordinator.h"

namespace trainstep {
namespace {

constexpr size_t kWatchBatchLimit = 1000;

// A job as clients see it: with its throughput as of `now` (not part of the machine's state,
// which must not change with time alone).
void AddThroughput(const JobRegistry& registry, absl::Time now, v1::Job* job) {
  absl::StatusOr<const StepMachine*> m = registry.Machine(job->job_id());
  if (m.ok()) *job->mutable_throughput() = (*m)->Throughput(now);
}

}  // namespace

absl::StatusOr<Answer<v1::Job>> Coordinator::AnswerSubmitJob(const v1::SubmitJobRequest& req,
                                                             const CallContext& ctx,
                                                             absl::Time now) {
  ASSIGN_OR_RETURN(v1::Job job, registry_.Submit(req, now, ctx.caller));
  return Ready(std::move(job));
}

absl::StatusOr<Answer<v1::Job>> Coordinator::AnswerGetJob(const v1::GetJobRequest& req,
                                                          const CallContext&, absl::Time now) {
  ASSIGN_OR_RETURN(v1::Job job, registry_.Get(req.job_id()));
  AddThroughput(registry_, now, &job);
  return Ready(std::move(job));
}

absl::StatusOr<Answer<v1::ListJobsResponse>> Coordinator::AnswerListJobs(
    const v1::ListJobsRequest& req, const CallContext&, absl::Time now) {
  ASSIGN_OR_RETURN(v1::ListJobsResponse resp, registry_.ListJobs(req));
  for (v1::Job& j : *resp.mutable_jobs()) AddThroughput(registry_, now, &j);
  return Ready(std::move(resp));
}

absl::StatusOr<Answer<v1::Job>> Coordinator::AnswerCancelJob(const v1::CancelJobRequest& req,
                                                             const CallContext& ctx,
                                                             absl::Time now) {
  ASSIGN_OR_RETURN(v1::Job job, registry_.Cancel(req, now, ctx.caller));
  AddThroughput(registry_, now, &job);
  return Ready(std::move(job));
}

absl::StatusOr<Answer<v1::ListUpdatesResponse>> Coordinator::AnswerListUpdates(
    const v1::ListUpdatesRequest& req, const CallContext&, absl::Time) {
  ASSIGN_OR_RETURN(v1::ListUpdatesResponse resp, registry_.ListUpdates(req));
  return Ready(std::move(resp));
}

absl::StatusOr<Answer<v1::ListWorkersResponse>> Coordinator::AnswerListWorkers(
    const v1::ListWorkersRequest& req, const CallContext&, absl::Time now) {
  ASSIGN_OR_RETURN(v1::ListWorkersResponse resp, registry_.ListWorkersPage(req, now));
  return Ready(std::move(resp));
}

absl::StatusOr<Answer<WatchBatch>> Coordinator::NextWatchBatch(const std::string& job_id,
                                                               const WatchCursor& cursor,
                                                               absl::Time now) {
  ASSIGN_OR_RETURN(StepMachine * m, registry_.Machine(job_id));
  WatchBatch b;
  b.cursor = cursor;
  v1::Job job = m->Job();
  std::string serialized = ComparableBytes(job);
  if (serialized != cursor.last_job_state) {
    b.job = std::move(job);
    AddThroughput(registry_, now, &*b.job);  // after the comparison: time alone is no news
    b.cursor.last_job_state = std::move(serialized);
  }
  const std::vector<v1::UpdateRecord>& updates = m->updates();
  const size_t end = std::min(m->WatchableUpdates(), cursor.next_update + kWatchBatchLimit);
  for (size_t i = cursor.next_update; i < end; ++i) b.updates.push_back(updates[i]);
  b.cursor.next_update = std::max(cursor.next_update, end);
  b.end = m->terminal() && b.cursor.next_update >= updates.size();
  Answer<WatchBatch> a;
  a.ready = b.job.has_value() || !b.updates.empty() || b.end;
  a.response = std::move(b);
  return a;
}

}  // namespace trainstep
