#include "coordinator/job_registry.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "core/spec.h"
#include "google/protobuf/util/message_differencer.h"

namespace trainstep {
namespace {

constexpr char kJobPrefix[] = "job-";
constexpr char kWorkerPrefix[] = "w-";
constexpr int32_t kDefaultPageSize = 1000;
constexpr int32_t kMaxPageSize = 10000;

// A request id is its caller's: the same id (a spec's default hash) from two principals names
// two requests. A '\n' cannot be in a principal read from an auth file's line.
std::string RequestKey(const std::string& owner, const std::string& request_id) {
  return owner.empty() ? request_id : absl::StrCat(owner, "\n", request_id);
}

// The same directory however the spec spells it ("a/./b/" is "a/b"). The coordinator cannot
// see the workers' file systems, so symlinks are the workers' check (the claim marker).
std::string CheckpointDirKey(const std::string& dir) {
  std::string key = std::filesystem::path(dir).lexically_normal().string();
  while (key.size() > 1 && key.back() == '/') key.pop_back();
  return key;
}

// "job-12" -> 12; 0 when the id has another shape.
int64_t IdNumber(absl::string_view id, absl::string_view prefix) {
  int64_t n = 0;
  if (!absl::ConsumePrefix(&id, prefix) || !absl::SimpleAtoi(id, &n)) return 0;
  return n;
}

absl::Status CheckRequestId(const std::string& request_id, const Limits& limits) {
  return CheckSize("request_id", request_id, limits.max_request_id_bytes, "--max-request-id-bytes");
}

}  // namespace

std::string JobIdOf(const v1::JournalRecord& record) {
  switch (record.kind_case()) {
    case v1::JournalRecord::kJobSubmitted:
      return record.job_submitted().job().job_id();
    case v1::JournalRecord::kJobEnded:
      return record.job_ended().job_id();
    case v1::JournalRecord::kWorkerRegistered:
      return record.worker_registered().worker().job_id();
    case v1::JournalRecord::kDatasetAccepted:
      return record.dataset_accepted().job_id();
    case v1::JournalRecord::kWorkerLost:
      return record.worker_lost().job_id();
    case v1::JournalRecord::kGenerationFormed:
      return record.generation_formed().job_id();
    case v1::JournalRecord::kWindowEnded:
      return record.window_ended().job_id();
    case v1::JournalRecord::kCheckpointDurable:
      return record.checkpoint_durable().job_id();
    case v1::JournalRecord::kEvalEnded:
      return record.eval_ended().job_id();
    case v1::JournalRecord::kJobForgotten:
      return record.job_forgotten().job_id();
    case v1::JournalRecord::kGenerationEnded:
      return record.generation_ended().job_id();
    case v1::JournalRecord::KIND_NOT_SET:
      break;
  }
  return "";
}

std::string JobRegistry::NewJobId() { return absl::StrCat(kJobPrefix, next_job_number_); }

absl::StatusOr<v1::Job> JobRegistry::Submit(const v1::SubmitJobRequest& req, absl::Time now,
                                            const Caller& caller) {
  RETURN_IF_ERROR(CheckRequestId(req.request_id(), limits_));
  v1::JobSpec resolved;
  switch (req.source_case()) {
    case v1::SubmitJobRequest::kSpecJson: {
      ASSIGN_OR_RETURN(resolved, ParseAndResolveJobSpec(req.spec_json()));
      break;
    }
    case v1::SubmitJobRequest::kSpec: {
      ASSIGN_OR_RETURN(resolved, ResolveJobSpec(req.spec()));
      break;
    }
    default:
      return absl::InvalidArgumentError("spec_json or spec is required");
  }
  if (!req.request_id().empty()) {
    auto it = job_by_request_.find(RequestKey(caller.principal, req.request_id()));
    if (it != job_by_request_.end()) {
      // AIP-155: a retry of the same request gets the earlier result; another request under
      // the same id is an error. Same = the same resolved spec (the journaled one).
      v1::Job earlier = jobs_.at(it->second)->Job();
      if (!google::protobuf::util::MessageDifferencer::Equals(earlier.spec(), resolved)) {
        return absl::AlreadyExistsError(absl::StrCat(
            "request_id \"", req.request_id(), "\" was already used for ", earlier.job_id(),
            " with a different spec; a request id may only be reused to retry the same request "
            "(submit another job under a new request id)"));
      }
      return earlier;
    }
  }
  RETURN_IF_ERROR(CheckSize("name", resolved.name(), limits_.max_name_bytes, "--max-name-bytes"));
  if (const int64_t bytes = static_cast<int64_t>(resolved.ByteSizeLong());
      bytes > limits_.max_spec_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the resolved spec is ", bytes,
                                                   " bytes; the limit is ", limits_.max_spec_bytes,
                                                   " (--max-spec-bytes): refer to data by path"));
  }
  if (!resolved.checkpoint().dir().empty()) {
    const std::string dir = CheckpointDirKey(resolved.checkpoint().dir());
    for (const auto& [id, m] : jobs_) {
      if (m->terminal()) continue;
      const v1::Job other_job = m->Job();
      const std::string& other = other_job.spec().checkpoint().dir();
      if (!other.empty() && CheckpointDirKey(other) == dir) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint.dir \"", resolved.checkpoint().dir(), "\" is the checkpoint directory of ",
            id, ", which is still ", v1::JobState_Name(other_job.state()),
            "; two jobs in one directory would overwrite and prune each other's checkpoints "
            "(give this job its own directory)"));
      }
    }
  }
  const size_t keep = static_cast<size_t>(std::max<int64_t>(limits_.max_jobs, 1));
  if (!ForgetFinishedBeyond(keep)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator holds ", jobs_.size(), " jobs and none has finished; the limit is ",
        limits_.max_jobs, " (--max-jobs): wait for or cancel one"));
  }
  v1::Job job;
  job.set_job_id(NewJobId());
  job.set_name(resolved.name());
  job.set_state(v1::PENDING);
  *job.mutable_spec() = resolved;
  job.set_submit_time_ms(absl::ToUnixMillis(now));
  job.set_request_id(req.request_id());
  job.set_owner(caller.principal);
  std::unique_ptr<StepMachine> machine = StepMachine::Create(options_, job, now);
  for (v1::JournalRecord& r : machine->TakeRecords()) pending_.push_back(std::move(r));
  Index(*machine);
  const std::string id = job.job_id();
  jobs_[id] = std::move(machine);
  return jobs_[id]->Job();
}

void JobRegistry::Index(const StepMachine& machine) {
  const v1::Job job = machine.Job();
  job_order_.push_back(job.job_id());
  if (!job.request_id().empty()) {
    job_by_request_[RequestKey(job.owner(), job.request_id())] = job.job_id();
  }
  next_job_number_ = std::max(next_job_number_, IdNumber(job.job_id(), kJobPrefix) + 1);
}

absl::StatusOr<StepMachine*> JobRegistry::Machine(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", job_id, " (trainstep job list shows them)"));
  }
  return it->second.get();
}

absl::StatusOr<const StepMachine*> JobRegistry::Machine(const std::string& job_id) const {
  return const_cast<JobRegistry*>(this)->Machine(job_id);
}

absl::StatusOr<v1::Job> JobRegistry::Get(const std::string& job_id) const {
  ASSIGN_OR_RETURN(const StepMachine* m, Machine(job_id));
  return m->Job();
}

std::vector<v1::Job> JobRegistry::List() const {
  std::vector<v1::Job> out;
  for (const std::string& id : job_order_) out.push_back(jobs_.at(id)->Job());
  return out;
}

absl::StatusOr<v1::ListJobsResponse> JobRegistry::ListJobs(const v1::ListJobsRequest& req) const {
  ASSIGN_OR_RETURN(const PageRequest page, ParsePageRequest(req.page_size(), req.page_token(),
                                                            kDefaultPageSize, kMaxPageSize));
  v1::ListJobsResponse resp;
  int64_t bytes = 0;
  for (const std::string& id : job_order_) {
    if (IdNumber(id, kJobPrefix) <= page.token) continue;
    v1::Job job = jobs_.at(id)->Job();
    const int64_t size = static_cast<int64_t>(job.ByteSizeLong());
    if (!PageHasRoom(resp.jobs_size(), bytes, size, page, limits_.list_page_bytes)) {
      resp.set_next_page_token(absl::StrCat(IdNumber(resp.jobs().rbegin()->job_id(), kJobPrefix)));
      break;
    }
    bytes += size;
    *resp.add_jobs() = std::move(job);
  }
  return resp;
}

absl::StatusOr<v1::Job> JobRegistry::Cancel(const v1::CancelJobRequest& req, absl::Time now,
                                            const Caller& caller) {
  RETURN_IF_ERROR(CheckRequestId(req.request_id(), limits_));
  ASSIGN_OR_RETURN(StepMachine * m, Machine(req.job_id()));
  if (caller.own_jobs_only) {
    const std::string owner = m->Job().owner();
    if (owner != caller.principal) {
      return absl::PermissionDeniedError(
          absl::StrCat(req.job_id(), " was submitted by ",
                       owner.empty() ? "nobody known" : absl::StrCat("\"", owner, "\""), "; \"",
                       caller.principal, "\" may cancel only its own jobs (or ask an admin)"));
    }
  }
  RETURN_IF_ERROR(m->Cancel(now));
  return m->Job();
}

absl::StatusOr<v1::ListUpdatesResponse> JobRegistry::ListUpdates(
    const v1::ListUpdatesRequest& req) const {
  ASSIGN_OR_RETURN(const StepMachine* m, Machine(req.job_id()));
  ASSIGN_OR_RETURN(const PageRequest page, ParsePageRequest(req.page_size(), req.page_token(),
                                                            kDefaultPageSize, kMaxPageSize));
  const int64_t start = std::max<int64_t>(page.token, 0);
  const std::vector<v1::UpdateRecord>& updates = m->updates();
  v1::ListUpdatesResponse resp;
  const int64_t end = std::min<int64_t>(start + page.size, static_cast<int64_t>(updates.size()));
  for (int64_t i = start; i < end; ++i) *resp.add_updates() = updates[i];
  if (end < static_cast<int64_t>(updates.size())) resp.set_next_page_token(absl::StrCat(end));
  return resp;
}

std::vector<v1::WorkerInfo> JobRegistry::ListWorkers(const std::string& job_id,
                                                     std::optional<absl::Time> now) const {
  std::vector<v1::WorkerInfo> out;
  for (const std::string& id : job_order_) {
    if (!job_id.empty() && id != job_id) continue;
    const StepMachine& m = *jobs_.at(id);
    const int64_t job_end_ms = m.terminal() ? m.Job().end_time_ms() : 0;
    for (v1::WorkerInfo& w : m.Workers()) {
      if (now.has_value() && !StillListed(w, job_end_ms, *now)) continue;
      out.push_back(std::move(w));
    }
  }
  return out;
}

bool JobRegistry::StillListed(const v1::WorkerInfo& w, int64_t job_end_ms, absl::Time now) const {
  // A view, not a deletion: the rows stay in the state (the job's history, forgotten with the
  // job), so replay and restore have nothing more to agree on, and the times are journaled.
  if (w.state() != v1::LOST && job_end_ms == 0) return true;  // a live job's live worker
  // A LOST row without lost_ms predates the field: it was lost long ago.
  const int64_t finished_ms = w.state() == v1::LOST ? w.lost_ms() : job_end_ms;
  return now < absl::FromUnixMillis(finished_ms) + limits_.finished_worker_retention;
}

absl::StatusOr<v1::ListWorkersResponse> JobRegistry::ListWorkersPage(
    const v1::ListWorkersRequest& req, absl::Time now) const {
  if (!req.job_id().empty()) RETURN_IF_ERROR(Machine(req.job_id()).status());
  ASSIGN_OR_RETURN(const PageRequest page, ParsePageRequest(req.page_size(), req.page_token(),
                                                            kDefaultPageSize, kMaxPageSize));
  // The token is a position in the list: a job forgotten between pages can shift it (a
  // worker listed twice or skipped), which a listing for humans tolerates.
  std::vector<v1::WorkerInfo> all = ListWorkers(req.job_id(), now);
  v1::ListWorkersResponse resp;
  int64_t bytes = 0;
  for (int64_t i = std::max<int64_t>(page.token, 0); i < static_cast<int64_t>(all.size()); ++i) {
    const int64_t size = static_cast<int64_t>(all[i].ByteSizeLong());
    if (!PageHasRoom(resp.workers_size(), bytes, size, page, limits_.list_page_bytes)) {
      resp.set_next_page_token(absl::StrCat(i));
      break;
    }
    bytes += size;
    *resp.add_workers() = std::move(all[i]);
  }
  return resp;
}

bool JobRegistry::ForgetFinishedBeyond(size_t keep) {
  while (jobs_.size() >= keep) {
    auto oldest = std::find_if(job_order_.begin(), job_order_.end(),
                               [this](const std::string& id) { return jobs_.at(id)->terminal(); });
    if (oldest == job_order_.end()) return false;
    const std::string id = *oldest;
    // Records of it not yet taken go first, so the journal never names a forgotten job.
    for (v1::JournalRecord& r : jobs_.at(id)->TakeRecords()) pending_.push_back(std::move(r));
    v1::JournalRecord record;
    record.mutable_job_forgotten()->set_job_id(id);
    Forget(id);
    pending_.push_back(std::move(record));
  }
  return true;
}

void JobRegistry::Forget(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  const v1::Job job = it->second->Job();
  if (!job.request_id().empty()) job_by_request_.erase(RequestKey(job.owner(), job.request_id()));
  for (auto w = job_of_worker_.begin(); w != job_of_worker_.end();) {
    w = w->second == job_id ? job_of_worker_.erase(w) : std::next(w);
  }
  for (auto w = worker_by_request_.begin(); w != worker_by_request_.end();) {
    w = job_of_worker_.count(w->second) == 0 ? worker_by_request_.erase(w) : std::next(w);
  }
  job_order_.erase(std::find(job_order_.begin(), job_order_.end(), job_id));
  jobs_.erase(it);
}

absl::StatusOr<v1::RegisterWorkerResponse> JobRegistry::RegisterWorker(
    const v1::RegisterWorkerRequest& req, absl::Time now) {
  RETURN_IF_ERROR(CheckRequestId(req.request_id(), limits_));
  RETURN_IF_ERROR(CheckSize("name", req.name(), limits_.max_name_bytes, "--max-name-bytes"));
  RETURN_IF_ERROR(CheckSize("host", req.host(), limits_.max_name_bytes, "--max-name-bytes"));
  std::string worker_id;
  if (!req.request_id().empty()) {
    auto it = worker_by_request_.find(req.request_id());
    if (it != worker_by_request_.end()) worker_id = it->second;
  }
  // A retried registration of a worker declared lost since gets a fresh identity, which
  // replaces the lost one.
  std::string replaces;
  if (!worker_id.empty() && IsLostWorker(worker_id)) replaces = std::exchange(worker_id, "");
  std::string job_id = req.job_id();
  if (!worker_id.empty()) {
    job_id = job_of_worker_.at(worker_id);
  } else if (job_id.empty()) {
    // The oldest job that still runs and has fewer live workers than it needs.
    for (const std::string& id : job_order_) {
      const StepMachine& m = *jobs_.at(id);
      if (m.terminal()) continue;
      int32_t live = 0;
      for (const v1::WorkerInfo& w : m.Workers()) live += w.state() != v1::LOST;
      if (live < m.Job().spec().workers().count()) {
        job_id = id;
        break;
      }
    }
    if (job_id.empty()) {
      return absl::FailedPreconditionError(
          "no job is waiting for workers: submit one (trainstep job submit) or pass --job");
    }
  }
  ASSIGN_OR_RETURN(StepMachine * m, Machine(job_id));
  const bool fresh = worker_id.empty();
  if (fresh) worker_id = absl::StrCat(kWorkerPrefix, next_worker_number_);
  ASSIGN_OR_RETURN(v1::RegisterWorkerResponse resp,
                   m->RegisterWorker(worker_id, req, now, replaces));
  if (fresh) {
    IndexWorker(worker_id, job_id, req.request_id());
    NoteReplaced(replaces, worker_id);
  }
  return resp;
}

bool JobRegistry::IsLostWorker(const std::string& worker_id) const {
  auto job = job_of_worker_.find(worker_id);
  if (job == job_of_worker_.end()) return false;
  for (const v1::WorkerInfo& w : jobs_.at(job->second)->Workers()) {
    if (w.worker_id() == worker_id) return w.state() == v1::LOST;
  }
  return false;
}

void JobRegistry::NoteReplaced(const std::string& replaces, const std::string& by) {
  auto job = job_of_worker_.find(replaces);
  if (!replaces.empty() && job != job_of_worker_.end()) {
    jobs_.at(job->second)->MarkReplaced(replaces, by);
  }
}

void JobRegistry::IndexWorker(const std::string& worker_id, const std::string& job_id,
                              const std::string& request_id) {
  job_of_worker_[worker_id] = job_id;
  if (!request_id.empty()) worker_by_request_[request_id] = worker_id;
  next_worker_number_ = std::max(next_worker_number_, IdNumber(worker_id, kWorkerPrefix) + 1);
}

absl::Status JobRegistry::ReportFailure(v1::ReportFailureRequest req, absl::Time now) {
  ASSIGN_OR_RETURN(StepMachine * m, Machine(req.job_id()));
  req.set_message(TruncateMessage(std::move(*req.mutable_message()), limits_.max_message_bytes));
  return m->ReportFailure(req, now);
}

void JobRegistry::Recovered(absl::Time now) {
  for (auto& [id, m] : jobs_) m->Recovered(now);
  ForgetFinishedBeyond(static_cast<size_t>(std::max<int64_t>(limits_.max_jobs, 1)) + 1);
}

std::optional<JobRegistry::Stall> JobRegistry::Tick(absl::Time now) {
  const std::optional<absl::Time> previous = std::exchange(last_tick_, now);
  std::optional<Stall> stall;
  if (previous.has_value() && now - *previous > StallThreshold()) {
    ++consecutive_stalls_;
    stall = Stall{now - *previous, consecutive_stalls_, consecutive_stalls_ <= kMaxRenewingStalls};
  } else {
    consecutive_stalls_ = 0;
  }
  if (stall.has_value() && stall->renewed) {
    // Process what arrived during the stall before expiring anyone: a full lease from now.
    for (auto& [id, m] : jobs_) m->RenewAllLeases(now);
  } else {
    for (auto& [id, m] : jobs_) m->Tick(now);
  }
  return stall;
}

void JobRegistry::RenewAllLeases(absl::Time now) {
  for (auto& [id, m] : jobs_) m->RenewAllLeases(now);
  last_tick_ = now;
  consecutive_stalls_ = 0;
}

void JobRegistry::AddStorageHold(absl::Duration held) {
  for (auto& [id, m] : jobs_) m->AddStorageHold(held);
}

std::optional<absl::Time> JobRegistry::NextDeadline() const {
  std::optional<absl::Time> next;
  for (const auto& [id, m] : jobs_) {
    std::optional<absl::Time> t = m->NextDeadline();
    if (t && (!next || *t < *next)) next = t;
  }
  // Tick often enough that only a real stall looks like one.
  if (last_tick_.has_value()) {
    const absl::Time due = *last_tick_ + StallThreshold() / 2;
    next = next.has_value() ? std::min(*next, due) : due;
  }
  return next;
}

std::vector<v1::JournalRecord> JobRegistry::TakeRecords() {
  std::vector<v1::JournalRecord> out;
  out.swap(pending_);
  for (const std::string& id : job_order_) {
    for (v1::JournalRecord& r : jobs_.at(id)->TakeRecords()) out.push_back(std::move(r));
  }
  return out;
}

absl::Status JobRegistry::Apply(const v1::JournalRecord& record) {
  if (record.kind_case() == v1::JournalRecord::KIND_NOT_SET) return absl::OkStatus();
  const std::string job_id = JobIdOf(record);
  auto it = jobs_.find(job_id);
  if (record.has_job_submitted()) {
    if (job_id.empty() || it != jobs_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("it submits job '", job_id, "', which is ",
                       job_id.empty() ? "no job id" : "already submitted"));
    }
    std::unique_ptr<StepMachine> m = StepMachine::FromSubmitted(options_, record.job_submitted());
    Index(*m);
    jobs_[job_id] = std::move(m);
    return absl::OkStatus();
  }
  if (it == jobs_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("it names job '", job_id, "', which the journal does not hold"));
  }
  if (record.has_job_forgotten()) {
    if (!it->second->terminal()) {
      return absl::FailedPreconditionError(
          absl::StrCat("it forgets job '", job_id, "', which has not ended"));
    }
    Forget(job_id);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(it->second->CheckFollows(record));
  if (record.has_worker_registered()) {
    const v1::WorkerRegistered& w = record.worker_registered();
    const std::string& worker_id = w.worker().worker_id();
    if (worker_id.empty() || job_of_worker_.count(worker_id) > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("it registers worker '", worker_id, "', which is ",
                       worker_id.empty() ? "no worker id" : "registered with another job"));
    }
    if (!w.replaces().empty() && !IsLostWorker(w.replaces())) {
      return absl::FailedPreconditionError(
          absl::StrCat("it registers worker '", worker_id, "' as replacing worker '", w.replaces(),
                       "', which is not a lost worker of any job"));
    }
    IndexWorker(worker_id, job_id, w.request_id());
  }
  it->second->Apply(record);
  if (record.has_worker_registered()) {
    NoteReplaced(record.worker_registered().replaces(),
                 record.worker_registered().worker().worker_id());
  }
  return absl::OkStatus();
}

v1::CoordinatorSnapshot JobRegistry::Snapshot() const {
  v1::CoordinatorSnapshot s;
  for (const std::string& id : job_order_) *s.add_jobs() = jobs_.at(id)->Snapshot();
  s.set_next_job_number(next_job_number_);
  s.set_next_worker_number(next_worker_number_);
  return s;
}

void JobRegistry::Restore(const v1::CoordinatorSnapshot& snapshot, absl::Time now) {
  jobs_.clear();
  job_order_.clear();
  job_by_request_.clear();
  worker_by_request_.clear();
  job_of_worker_.clear();
  for (const v1::JobSnapshot& js : snapshot.jobs()) {
    std::unique_ptr<StepMachine> m = StepMachine::Restore(options_, js, now);
    Index(*m);
    for (const v1::WorkerSnapshot& w : js.workers()) {
      IndexWorker(w.info().worker_id(), m->job_id(), w.request_id());
    }
    const std::string id = m->job_id();
    jobs_[id] = std::move(m);
  }
  next_job_number_ = std::max(next_job_number_, snapshot.next_job_number());
  next_worker_number_ = std::max(next_worker_number_, snapshot.next_worker_number());
}

}  // namespace trainstep
