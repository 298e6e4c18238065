// A worker's own calls: registration, heartbeats, the Attach stream, its dataset report, and
// what each answer tells it.
// Part of StepMachine (coordinator/step_machine.h): one concept per file.
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "coordinator/report_validation.h"
#include "coordinator/step_machine.h"
#include "core/hang.h"
#include "core/spec.h"

namespace trainstep {

absl::Status StepMachine::LostError(const std::string& worker_id) const {
  // NOT_FOUND, not FAILED_PRECONDITION: the identity is gone and the worker must register
  // again (a new identity), which a refused dataset must not trigger. A drained worker's
  // rejoin finds its heartbeat answered with `drained` and exits instead.
  if (Drained(worker_id)) {
    return absl::NotFoundError(
        absl::StrCat("worker ", worker_id, " of ", job_id(),
                     " was drained: ", membership_.Find(worker_id)->info.drained()));
  }
  return absl::NotFoundError(absl::StrCat(
      "worker ", worker_id, " of ", job_id(), " was declared lost (no heartbeat within its ",
      absl::FormatDuration(options_.worker_lease), " lease): register again"));
}

absl::StatusOr<const WorkerEntry*> StepMachine::FindRegistered(const std::string& worker_id) const {
  const WorkerEntry* w = membership_.Find(worker_id);
  if (w == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("worker ", worker_id, " is not registered with job ", job_id()));
  }
  return w;
}

absl::StatusOr<const WorkerEntry*> StepMachine::FindLive(const std::string& worker_id) const {
  ASSIGN_OR_RETURN(const WorkerEntry* w, FindRegistered(worker_id));
  if (w->info.state() == v1::LOST) return LostError(worker_id);
  return w;
}

absl::Status StepMachine::CheckMember(const std::string& worker_id, int64_t generation,
                                      int32_t rank) const {
  RETURN_IF_ERROR(FindLive(worker_id).status());
  const int64_t current = membership_.generation();
  if (generation > current) {
    return absl::FailedPreconditionError(
        absl::StrCat("generation ", generation, " does not exist; the current one is ", current));
  }
  if (generation < current || !membership_.generation_live()) {
    return absl::AbortedError(absl::StrCat("generation ", generation,
                                           " is over; wait for the next generation (heartbeat)"));
  }
  const int32_t actual = membership_.RankOf(worker_id);
  if (actual != rank) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id, " is rank ", actual,
                                                      " of generation ", current, ", not rank ",
                                                      rank));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterWorkerResponse> StepMachine::RegisterWorker(
    const std::string& worker_id, const v1::RegisterWorkerRequest& req, absl::Time now,
    const std::string& replaces) {
  RETURN_IF_ERROR(CheckRunnable());
  if (membership_.Find(worker_id) == nullptr) {
    v1::JournalRecord record;
    v1::WorkerRegistered* reg = record.mutable_worker_registered();
    v1::WorkerInfo* info = reg->mutable_worker();
    info->set_worker_id(worker_id);
    info->set_job_id(job_id());
    info->set_name(req.name());
    info->set_host(req.host());
    info->set_state(v1::REGISTERED);
    info->set_rank(-1);
    info->set_registered_ms(absl::ToUnixMillis(now));
    info->set_last_heartbeat_ms(absl::ToUnixMillis(now));
    reg->set_request_id(req.request_id());
    reg->set_replaces(replaces);
    Emit(std::move(record), now);
  }
  v1::RegisterWorkerResponse resp;
  resp.set_worker_id(worker_id);
  resp.set_job_id(job_id());
  *resp.mutable_spec() = job_.spec();
  resp.set_owner(job_.owner());
  resp.set_lease_ms(absl::ToInt64Milliseconds(options_.worker_lease));
  resp.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(HeartbeatInterval()));
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> StepMachine::Heartbeat(const v1::HeartbeatRequest& req,
                                                             absl::Time now) {
  RETURN_IF_ERROR(ValidateHeartbeat(req));
  if (Drained(req.worker_id())) return HeartbeatAnswer(req.worker_id());  // it exits
  ASSIGN_OR_RETURN(const WorkerEntry* w, FindLive(req.worker_id()));
  // No replica of the job's timeline is past its latest committed update: a higher one is a
  // replica that a rollback left behind (its process outlived its rank, and its state was
  // discarded), which says nothing of what the worker holds of this timeline.
  const int64_t applied = req.applied_update_id() <= update_id_ ? req.applied_update_id() : -1;
  membership_.Renew(req.worker_id(), now, now + options_.worker_lease, applied,
                    req.has_idle_after_generation() ? req.idle_after_generation() : -1);
  NotePhase(req, now);
  if (!terminal() && req.has_dataset() && !w->dataset_accepted) {
    RETURN_IF_ERROR(AcceptDataset(req.worker_id(), req.dataset(), now));
  }
  if (req.has_idle_after_generation()) MaybeLeaveGeneration(req.worker_id(), now);
  // What a survivor holds may have been the one thing a new generation waited for.
  if (!membership_.generation_live()) MaybeFormGeneration(now);
  v1::HeartbeatResponse resp = HeartbeatAnswer(req.worker_id());
  // Heartbeat answers only: Attach pushes a place when it changes, and these change with
  // every window.
  resp.set_hang_deadline_ms(absl::ToInt64Milliseconds(ShortStepDeadlineNow()));
  resp.set_hang_cap_ms(absl::ToInt64Milliseconds(HangPolicyOf(job_.spec()).cap));
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> StepMachine::Attach(const v1::AttachRequest& req,
                                                          uint64_t seq, absl::Time now) {
  if (Drained(req.worker_id())) return HeartbeatAnswer(req.worker_id());  // it exits
  ASSIGN_OR_RETURN(const WorkerEntry* w, FindLive(req.worker_id()));
  if (w->attach_seq != seq) membership_.Attach(req.worker_id(), seq, now + options_.worker_lease);
  return HeartbeatAnswer(req.worker_id());
}

void StepMachine::Detached(const std::string& worker_id, uint64_t seq, absl::Time now) {
  if (terminal()) return;
  membership_.Detach(worker_id, seq, now + std::min(options_.detach_grace, options_.worker_lease));
}

absl::Status StepMachine::AcceptDataset(const std::string& worker_id, const v1::DatasetInfo& d,
                                        absl::Time now) {
  if (dataset_.has_value() && !google::protobuf::util::MessageDifferencer::Equals(
                                  dataset_->model_config(), d.model_config())) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "worker %s built its model from a different config than the job's (model_config): "
        "every worker must read the same model.llama.path",
        worker_id));
  }
  if (dataset_.has_value() &&
      (dataset_->samples() != d.samples() || dataset_->fingerprint() != d.fingerprint())) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "worker %s read a different dataset (%d samples, fingerprint %s) than the job's "
        "(%d samples, fingerprint %s): every worker must read the same files",
        worker_id, d.samples(), d.fingerprint(), dataset_->samples(), dataset_->fingerprint()));
  }
  int64_t per_epoch = windows_per_epoch_;
  if (!dataset_.has_value()) {
    const int64_t batch = GlobalBatchSamples(job_.spec());
    per_epoch = WindowPlanner(job_.spec(), d.samples()).windows_per_epoch();
    if (per_epoch == 0) {
      FailJob(absl::StrFormat("the dataset has %d samples, fewer than one global batch of %d "
                              "(micro_batch_size × accumulation_steps × workers.count) with "
                              "batch.tail drop: no window would train",
                              d.samples(), batch),
              now);
      return absl::OkStatus();  // the answer tells the worker the job failed
    }
  }
  v1::JournalRecord record;
  v1::DatasetAccepted* acc = record.mutable_dataset_accepted();
  acc->set_job_id(job_id());
  acc->set_worker_id(worker_id);
  *acc->mutable_dataset() = d;
  acc->set_windows_per_epoch(per_epoch);
  Emit(std::move(record), now);
  MaybeFormGeneration(now);
  return absl::OkStatus();
}

v1::HeartbeatResponse StepMachine::HeartbeatAnswer(const std::string& worker_id) const {
  v1::HeartbeatResponse resp;
  resp.set_job_state(job_.state());
  resp.set_job_message(job_.message());
  resp.set_lease_ms(absl::ToInt64Milliseconds(options_.worker_lease));
  const WorkerEntry* w = membership_.Find(worker_id);
  resp.set_dataset_accepted(w->dataset_accepted);
  resp.set_drained(w->info.drained());
  const int32_t rank = membership_.RankOf(worker_id);
  if (!terminal() && rank >= 0 && membership_.generation_live()) {
    resp.set_assigned(true);
    v1::Assignment* a = resp.mutable_assignment();
    *a = membership_.current().assignment();
    a->set_rank(rank);
    a->set_world_size(membership_.world_size());
    a->set_generation(membership_.generation());
    if (rank != 0) a->clear_pending_checkpoint_id();
  }
  return resp;
}

bool StepMachine::Drained(const std::string& worker_id) const {
  const WorkerEntry* w = membership_.Find(worker_id);
  return w != nullptr && !w->info.drained().empty();
}

}  // namespace trainstep
