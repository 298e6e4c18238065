#include "coordinator/step_machine.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "core/job_state.h"
#include "core/spec.h"

namespace trainstep {

StepMachine::StepMachine(const MachineOptions& options, const v1::Job& job)
    : options_(options),
      job_(job),
      scaler_config_(LossScalerConfig::FromSpec(job.spec().loss_scaler())),
      scaler_(scaler_config_),
      scores_(job.spec().stragglers().score_windows() > 0 ? job.spec().stragglers().score_windows()
                                                          : kDefaultScoreWindows,
              job.spec().stragglers().has_replace_below()
                  ? std::optional<double>(job.spec().stragglers().replace_below())
                  : std::nullopt) {
  v1::CheckpointRecord initial;
  initial.set_checkpoint_id(0);
  *initial.mutable_scaler() = scaler_.State();
  checkpoints_[0] = initial;
}

std::unique_ptr<StepMachine> StepMachine::Create(const MachineOptions& options, const v1::Job& job,
                                                 absl::Time now) {
  std::unique_ptr<StepMachine> machine(new StepMachine(options, job));
  v1::JournalRecord record;
  record.set_time_ms(absl::ToUnixMillis(now));
  *record.mutable_job_submitted()->mutable_job() = job;
  machine->outbox_.push_back(std::move(record));
  return machine;
}

void StepMachine::Emit(v1::JournalRecord record, absl::Time now) {
  record.set_time_ms(absl::ToUnixMillis(now));
  Apply(record);
  outbox_.push_back(std::move(record));
}

std::vector<v1::JournalRecord> StepMachine::TakeRecords() {
  std::vector<v1::JournalRecord> out;
  out.swap(outbox_);
  return out;
}

bool StepMachine::terminal() const { return IsTerminal(job_.state()); }

absl::Status StepMachine::CheckRunnable() const {
  if (terminal()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id(), " is ", v1::JobState_Name(job_.state()),
                     job_.message().empty() ? "" : ": ", job_.message()));
  }
  return absl::OkStatus();
}

absl::Status StepMachine::ReportFailure(const v1::ReportFailureRequest& req, absl::Time now) {
  ASSIGN_OR_RETURN(const WorkerEntry* w, FindRegistered(req.worker_id()));
  if (terminal()) return absl::OkStatus();
  if (req.has_damaged_checkpoint_id()) return CheckpointDamaged(req, now);
  FailJob(absl::StrCat("worker ", req.worker_id(), w->info.host().empty() ? "" : " on ",
                       w->info.host(), ": ", req.message()),
          now);
  return absl::OkStatus();
}

absl::Status StepMachine::Cancel(absl::Time now) {
  if (terminal()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id(), " already ended: ", v1::JobState_Name(job_.state())));
  }
  v1::JournalRecord record;
  v1::JobEnded* e = record.mutable_job_ended();
  e->set_job_id(job_id());
  e->set_state(v1::CANCELLED);
  e->set_message("cancelled by a client");
  Emit(std::move(record), now);
  return absl::OkStatus();
}

void StepMachine::FailJob(const std::string& message, absl::Time now) {
  if (terminal()) return;
  v1::JournalRecord record;
  v1::JobEnded* e = record.mutable_job_ended();
  e->set_job_id(job_id());
  e->set_state(v1::FAILED);
  e->set_message(message);
  Emit(std::move(record), now);
}

}  // namespace trainstep
