#include "coordinator/step_machine.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/proto_bytes.h"
#include "common/status_macros.h"
#include "coordinator/lr_schedule.h"
#include "coordinator/report_validation.h"
#include "coordinator/throughput.h"
#include "core/job_state.h"
#include "core/spec.h"
#include "core/window_outcome.h"

namespace trainstep {
namespace {

constexpr double kClipEpsilon = 1e-6;
constexpr double kNormRelativeTolerance = 1e-6;
// The least σ a loss spike is measured in, relative to the mean loss (validate.spike_sigma).
constexpr double kSpikeSigmaFloor = 1e-6;

// The latest evaluation is the newest update record that carries one. Replay and Restore both
// read it from the log, so a restored machine cannot disagree with the one it was taken from.
std::optional<v1::EvalEnded> LatestEval(const std::vector<v1::UpdateRecord>& updates,
                                        const std::string& job_id) {
  for (auto it = updates.rbegin(); it != updates.rend(); ++it) {
    if (!it->has_eval_loss()) continue;
    v1::EvalEnded e;
    e.set_job_id(job_id);
    e.set_generation(it->generation());
    e.set_optimizer_update_id(it->optimizer_update_id());
    e.set_eval_loss(it->eval_loss());
    e.set_valid_units(it->eval_valid_tokens());
    return e;
  }
  return std::nullopt;
}

}  // namespace

double ClipCoefficient(std::optional<double> max_grad_norm, double grad_norm) {
  if (!max_grad_norm.has_value()) return 1.0;
  return std::min(1.0, *max_grad_norm / (grad_norm + kClipEpsilon));
}

bool GradNormsAgree(double a, double b) {
  if (a == b) return true;
  if (!std::isfinite(a) || !std::isfinite(b)) return false;  // inf tolerance would accept anything
  return std::fabs(a - b) <= kNormRelativeTolerance * std::max(std::fabs(a), std::fabs(b));
}

void StepMachine::OutcomeCounts::Add(const v1::UpdateRecord& r) {
  switch (OutcomeOf(r)) {
    case v1::COMMIT:
      ++committed;
      last_loss = r.loss();
      break;
    case v1::SKIP:
      ++skipped;
      break;
    default:
      ++aborted;
      break;
  }
  if (r.has_rerun()) {
    ++reruns;
    if (r.rerun().verdict() == "transient") ++reruns_transient;
  }
}

// --- Construction ---

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

std::unique_ptr<StepMachine> StepMachine::FromSubmitted(const MachineOptions& options,
                                                        const v1::JobSubmitted& submitted) {
  return std::unique_ptr<StepMachine>(new StepMachine(options, submitted.job()));
}

std::unique_ptr<StepMachine> StepMachine::Restore(const MachineOptions& options,
                                                  const v1::JobSnapshot& snap, absl::Time now) {
  std::unique_ptr<StepMachine> m(new StepMachine(options, snap.job()));
  m->scaler_ = LossScaler(m->scaler_config_, snap.scaler());
  m->updates_.assign(snap.updates().begin(), snap.updates().end());
  for (const v1::UpdateRecord& r : m->updates_) m->counts_.Add(r);
  m->last_eval_ = LatestEval(m->updates_, snap.job().job_id());
  if (snap.has_eval_due_update_id()) m->eval_due_ = snap.eval_due_update_id();
  m->membership_.Restore({snap.workers().begin(), snap.workers().end()}, snap.generation(),
                         now + options.worker_lease);
  if (snap.has_dataset()) {
    m->dataset_ = snap.dataset();
    m->planner_ = std::make_unique<WindowPlanner>(snap.job().spec(), snap.dataset().samples());
  }
  m->windows_per_epoch_ = snap.job().progress().windows_per_epoch();
  m->checkpoints_.clear();
  for (const v1::CheckpointRecord& c : snap.checkpoints()) m->checkpoints_[c.checkpoint_id()] = c;
  m->recent_decisions_.assign(snap.recent_decisions().begin(), snap.recent_decisions().end());
  m->next_checkpoint_id_ = snap.next_checkpoint_id();
  const v1::JobProgress& p = snap.job().progress();
  m->last_window_ = p.window_id();
  m->update_id_ = p.optimizer_update_id();
  m->scheduler_step_ = p.scheduler_step();
  m->checkpoint_id_ = p.checkpoint_id();
  m->cumulative_tokens_ = p.cumulative_tokens();
  m->micro_step_id_ = p.micro_step_id();
  m->rollbacks_ = p.rollbacks();
  m->RefreshDroppedTail();
  for (auto it = m->updates_.rbegin(); it != m->updates_.rend(); ++it) {
    if (OutcomeOf(*it) == v1::COMMIT) {
      m->last_commit_ms_ = it->end_time_ms();
      break;
    }
  }
  // Derivable state: consecutive desync aborts at the end of the log.
  for (auto it = m->updates_.rbegin(); it != m->updates_.rend(); ++it) {
    if (OutcomeOf(*it) != v1::ABORT) break;
    if (ReasonCodeOf(*it) == v1::WINDOW_REASON_DESYNC) ++m->consecutive_desyncs_;
  }
  return m;
}

// --- Journal plumbing ---

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

void StepMachine::Apply(const v1::JournalRecord& record) {
  ++version_;
  const absl::Time now = absl::FromUnixMillis(record.time_ms());
  switch (record.kind_case()) {
    case v1::JournalRecord::kJobSubmitted:
      break;  // the registry builds the machine from it
    case v1::JournalRecord::kJobEnded: {
      job_.set_state(record.job_ended().state());
      job_.set_message(record.job_ended().message());
      job_.set_end_time_ms(record.time_ms());
      attempts_.clear();
      break;
    }
    case v1::JournalRecord::kWorkerRegistered:
      membership_.Add(record.worker_registered().worker(), record.worker_registered().request_id(),
                      now + options_.worker_lease);
      break;
    case v1::JournalRecord::kDatasetAccepted: {
      const v1::DatasetAccepted& d = record.dataset_accepted();
      if (!dataset_.has_value()) {
        dataset_ = d.dataset();
        *job_.mutable_model_config() = d.dataset().model_config();
        windows_per_epoch_ = d.windows_per_epoch();
        planner_ = std::make_unique<WindowPlanner>(job_.spec(), d.dataset().samples());
      }
      membership_.AcceptDataset(d.worker_id());
      break;
    }
    case v1::JournalRecord::kWorkerLost:
      membership_.MarkLost(record.worker_lost().worker_id(), record.time_ms());
      if (record.worker_lost().drained()) {
        membership_.MarkDrained(record.worker_lost().worker_id(), record.worker_lost().reason());
      }
      break;
    case v1::JournalRecord::kGenerationFormed:
      ApplyGenerationFormed(record.generation_formed(), record.time_ms());
      break;
    case v1::JournalRecord::kGenerationEnded:
      if (record.generation_ended().generation() == membership_.generation()) {
        membership_.BreakGeneration();
        attempts_.clear();
      }
      break;
    case v1::JournalRecord::kWindowEnded:
      ApplyWindowEnded(record.window_ended());
      break;
    case v1::JournalRecord::kEvalEnded:
      ApplyEvalEnded(record.eval_ended());
      break;
    case v1::JournalRecord::kCheckpointDurable: {
      auto it = checkpoints_.find(record.checkpoint_durable().checkpoint_id());
      if (it != checkpoints_.end()) {
        it->second.set_durable(true);
        it->second.set_path(record.checkpoint_durable().path());
      }
      break;
    }
    case v1::JournalRecord::kJobForgotten:  // the registry's record
    case v1::JournalRecord::KIND_NOT_SET:
      break;
  }
}

absl::Status StepMachine::CheckFollows(const v1::JournalRecord& record) const {
  const auto known_worker = [this](const std::string& id) -> absl::Status {
    if (membership_.Find(id) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("it names worker '", id, "', which job ", job_id(), " does not have"));
    }
    return absl::OkStatus();
  };
  switch (record.kind_case()) {
    case v1::JournalRecord::kJobSubmitted:
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id(), " is already submitted"));
    case v1::JournalRecord::kJobEnded:
      if (terminal()) {
        return absl::FailedPreconditionError(absl::StrCat("job ", job_id(), " already ended (",
                                                          v1::JobState_Name(job_.state()), ")"));
      }
      if (!IsTerminal(record.job_ended().state())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "it ends the job in state ", v1::JobState_Name(record.job_ended().state())));
      }
      return absl::OkStatus();
    case v1::JournalRecord::kWorkerRegistered:
      if (membership_.Find(record.worker_registered().worker().worker_id()) != nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("worker '", record.worker_registered().worker().worker_id(),
                         "' is already registered with job ", job_id()));
      }
      return absl::OkStatus();
    case v1::JournalRecord::kDatasetAccepted:
      return known_worker(record.dataset_accepted().worker_id());
    case v1::JournalRecord::kWorkerLost:
      return known_worker(record.worker_lost().worker_id());
    case v1::JournalRecord::kGenerationFormed: {
      const v1::GenerationFormed& f = record.generation_formed();
      if (terminal()) return absl::FailedPreconditionError("the job already ended");
      if (f.generation() != membership_.generation() + 1) {
        return absl::FailedPreconditionError(absl::StrCat("it forms generation ", f.generation(),
                                                          " after generation ",
                                                          membership_.generation()));
      }
      if (f.worker_ids().empty()) return absl::FailedPreconditionError("it names no worker");
      absl::flat_hash_set<std::string> seen;
      for (const std::string& id : f.worker_ids()) {
        RETURN_IF_ERROR(known_worker(id));
        if (membership_.Find(id)->info.state() == v1::LOST) {
          return absl::FailedPreconditionError(absl::StrCat("worker '", id, "' is lost"));
        }
        if (!seen.insert(id).second) {
          return absl::FailedPreconditionError(absl::StrCat("it names worker '", id, "' twice"));
        }
      }
      if (f.rolled_back() && checkpoints_.count(f.rollback_to().checkpoint_id()) == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "it rolls back to checkpoint ", f.rollback_to().checkpoint_id(), ", which is unknown"));
      }
      return absl::OkStatus();
    }
    case v1::JournalRecord::kWindowEnded: {
      const v1::WindowDecision& d = record.window_ended().decision();
      const v1::UpdateRecord& r = d.record();
      if (terminal()) return absl::FailedPreconditionError("the job already ended");
      if (!membership_.has_generation() || r.generation() != membership_.generation()) {
        return absl::FailedPreconditionError(
            absl::StrCat("it ends a window of generation ", r.generation(),
                         " while the job is in generation ", membership_.generation()));
      }
      if (r.window_id() != last_window_ + 1) {
        return absl::FailedPreconditionError(
            absl::StrCat("it ends window ", r.window_id(), " after window ", last_window_));
      }
      const int64_t advance = d.outcome() == v1::COMMIT ? 1 : 0;
      if (d.outcome() != v1::ABORT && (d.optimizer_update_id() != update_id_ + advance ||
                                       d.scheduler_step() != scheduler_step_ + advance)) {
        return absl::FailedPreconditionError(
            absl::StrCat("its ", OutcomeName(d.outcome()), " leaves optimizer update ",
                         d.optimizer_update_id(), " and scheduler step ", d.scheduler_step(),
                         " after ", update_id_, " and ", scheduler_step_));
      }
      return absl::OkStatus();
    }
    case v1::JournalRecord::kEvalEnded:
    case v1::JournalRecord::kGenerationEnded:
    case v1::JournalRecord::kCheckpointDurable:
    case v1::JournalRecord::kJobForgotten:
    case v1::JournalRecord::KIND_NOT_SET:
      return absl::OkStatus();  // Apply makes nothing of one that does not fit
  }
  return absl::OkStatus();
}

void StepMachine::ApplyGenerationFormed(const v1::GenerationFormed& formed, int64_t time_ms) {
  if (formed.rolled_back()) {
    ++rollbacks_;
    const v1::CheckpointRecord& to = formed.rollback_to();
    last_window_ = to.window_id();
    update_id_ = to.optimizer_update_id();
    scheduler_step_ = to.scheduler_step();
    cumulative_tokens_ = to.cumulative_tokens();
    micro_step_id_ = to.micro_step_id();
    checkpoint_id_ = to.checkpoint_id();
    RefreshDroppedTail();
    scaler_ = LossScaler(scaler_config_, to.scaler());
    // Checkpoints requested after the rollback point can never be written: their state is gone.
    checkpoints_.erase(checkpoints_.upper_bound(to.checkpoint_id()), checkpoints_.end());
    // So can evaluations of updates past it; the update is evaluated when it commits again.
    if (eval_due_.has_value() && *eval_due_ > to.optimizer_update_id()) eval_due_.reset();
  }
  eval_attempt_.reset();  // reports of the old generation count for nothing
  membership_.FormGeneration(formed);
  attempts_.clear();
  if (job_.state() == v1::PENDING) {
    job_.set_state(v1::RUNNING);
    job_.set_start_time_ms(time_ms);
  }
}

void StepMachine::ApplyWindowEnded(const v1::WindowEnded& ended) {
  const v1::WindowDecision& d = ended.decision();
  const v1::UpdateRecord& r = d.record();
  updates_.push_back(r);
  counts_.Add(r);
  if (r.rerun().verdict() == "transient") {
    for (const std::string& id : r.rerun().worker_ids()) membership_.AddSuspect(id);
  }
  recent_decisions_.push_back(d);
  if (recent_decisions_.size() > options_.recent_decisions) {
    recent_decisions_.erase(recent_decisions_.begin());
  }
  switch (d.outcome()) {
    case v1::COMMIT:
      update_id_ = d.optimizer_update_id();
      scheduler_step_ = d.scheduler_step();
      cumulative_tokens_ = r.cumulative_tokens();
      last_commit_ms_ = r.end_time_ms();
      [[fallthrough]];
    case v1::SKIP:
      last_window_ = r.window_id();
      micro_step_id_ = r.micro_step_id();
      consecutive_desyncs_ = 0;
      attempts_.erase(r.window_id());
      RefreshDroppedTail();
      break;
    case v1::ABORT:
      if (ReasonCodeOf(r) == v1::WINDOW_REASON_DESYNC) ++consecutive_desyncs_;
      // Nothing of this generation's windows in flight can end any more.
      membership_.BreakGeneration();
      attempts_.clear();
      break;
    default:
      break;
  }
  scaler_ = LossScaler(scaler_config_, ended.scaler_after());
  if (d.run_eval()) {
    eval_due_ = d.optimizer_update_id();
    eval_attempt_.reset();
  }
  if (ended.has_checkpoint_assigned()) {
    const v1::CheckpointRecord& c = ended.checkpoint_assigned();
    checkpoints_[c.checkpoint_id()] = c;
    checkpoint_id_ = c.checkpoint_id();
    next_checkpoint_id_ = std::max(next_checkpoint_id_, c.checkpoint_id() + 1);
  }
}

void StepMachine::ApplyEvalEnded(const v1::EvalEnded& ended) {
  // The evaluation belongs to the newest commit of that update (an earlier one may have been
  // rolled back and committed again). One of no committed update fits nothing and changes
  // nothing (only a damaged journal has one: the journal_replay fuzzer's finding).
  auto it = std::find_if(updates_.rbegin(), updates_.rend(), [&](const v1::UpdateRecord& r) {
    return OutcomeOf(r) == v1::COMMIT && r.optimizer_update_id() == ended.optimizer_update_id();
  });
  if (it == updates_.rend()) return;
  it->set_eval_loss(ended.eval_loss());
  it->set_eval_valid_tokens(ended.valid_units());
  last_eval_ = LatestEval(updates_, job_id());
  if (eval_due_ == ended.optimizer_update_id()) eval_due_.reset();
  eval_attempt_.reset();
}

v1::JobSnapshot StepMachine::Snapshot() const {
  v1::JobSnapshot s;
  *s.mutable_job() = Job();
  *s.mutable_scaler() = scaler_.State();
  for (const v1::UpdateRecord& r : updates_) *s.add_updates() = r;
  for (v1::WorkerSnapshot& w : membership_.Snapshot()) *s.add_workers() = std::move(w);
  if (membership_.has_generation()) *s.mutable_generation() = membership_.current();
  if (dataset_.has_value()) *s.mutable_dataset() = *dataset_;
  for (const auto& [id, c] : checkpoints_) *s.add_checkpoints() = c;
  for (const v1::WindowDecision& d : recent_decisions_) *s.add_recent_decisions() = d;
  s.set_next_checkpoint_id(next_checkpoint_id_);
  if (eval_due_.has_value()) s.set_eval_due_update_id(*eval_due_);
  return s;
}

// --- Queries ---

bool StepMachine::terminal() const { return IsTerminal(job_.state()); }

int64_t StepMachine::TotalWindows() const {
  return JobTotalWindows(job_.spec(), windows_per_epoch_);
}

int64_t StepMachine::EpochOf(int64_t window_id) const {
  return planner_ == nullptr ? 0 : planner_->EpochOf(window_id);
}

void StepMachine::RefreshDroppedTail() {
  const int64_t epochs_ended = EpochOf(last_window_ + 1);
  if (planner_ == nullptr || planner_->dropped_per_epoch() == 0 || epochs_ended == 0) {
    last_dropped_tail_.reset();
  } else if (!last_dropped_tail_.has_value() || last_dropped_tail_->epoch() != epochs_ended - 1) {
    last_dropped_tail_ = planner_->DroppedTail(epochs_ended - 1);
  }
}

bool StepMachine::StopReachedAfter(int64_t window_id, int64_t update_id) const {
  const v1::Stop& stop = job_.spec().stop();
  if (stop.has_max_updates() && update_id >= stop.max_updates()) return true;
  const int64_t total = TotalWindows();
  return total > 0 && window_id >= total;
}

v1::Job StepMachine::Job() const {
  v1::Job job = job_;
  // Derived from this machine's state alone: a restored job_ still carries its snapshot's
  // progress, whose conditional fields (waiting, workers_available) must not outlive it.
  v1::JobProgress* p = job.mutable_progress();
  p->Clear();
  p->set_window_id(last_window_);
  p->set_optimizer_update_id(update_id_);
  p->set_scheduler_step(scheduler_step_);
  p->set_checkpoint_id(checkpoint_id_);
  const v1::CheckpointRecord* durable = LatestDurableCheckpoint();
  p->set_durable_checkpoint_id(durable == nullptr ? -1 : durable->checkpoint_id());
  p->set_cumulative_tokens(cumulative_tokens_);
  p->set_loss_scale(scaler_.scale());
  p->set_learning_rate(LearningRate(job_.spec(), scheduler_step_));
  p->set_generation(membership_.generation());
  p->set_world_size(membership_.world_size());
  p->set_windows_committed(counts_.committed);
  p->set_windows_skipped(counts_.skipped);
  p->set_windows_aborted(counts_.aborted);
  p->set_reruns(counts_.reruns);
  p->set_reruns_transient(counts_.reruns_transient);
  p->set_last_loss(counts_.last_loss);
  p->set_epoch(EpochOf(last_window_ + 1));
  p->set_micro_step_id(micro_step_id_);
  p->set_rollbacks(rollbacks_);
  if (!terminal() && dataset_.has_value() && !membership_.generation_live()) {
    // Visible, not silent: a job short of workers says what it waits for.
    const v1::Workers& w = job_.spec().workers();
    const int64_t available =
        static_cast<int64_t>(membership_.Survivors().size() + membership_.Standbys().size());
    p->set_workers_available(static_cast<int32_t>(available));
    if (available < w.min()) {
      p->set_waiting(
          absl::StrFormat("waiting for workers: %d available, workers.min is %d (workers.count %d)",
                          available, w.min(), w.count()));
    } else if (available < w.count() && short_since_.has_value()) {
      p->set_waiting(absl::StrFormat(
          "waiting for %d more worker(s) until %s (workers.join_grace %s), then going on with %d",
          w.count() - available,
          absl::FormatTime(absl::RFC3339_sec, *short_since_ + JoinGrace(), absl::UTCTimeZone()),
          absl::FormatDuration(JoinGrace()), available));
    }
  }
  if (planner_ != nullptr) p->set_dropped_samples(p->epoch() * planner_->dropped_per_epoch());
  if (last_dropped_tail_.has_value()) *p->mutable_last_dropped_tail() = *last_dropped_tail_;
  if (job_.spec().stop().has_max_updates()) p->set_max_updates(job_.spec().stop().max_updates());
  p->set_windows_per_epoch(windows_per_epoch_);
  if (dataset_.has_value()) p->set_dataset_samples(dataset_->samples());
  if (last_eval_.has_value()) {
    p->set_last_eval_loss(last_eval_->eval_loss());
    p->set_last_eval_update_id(last_eval_->optimizer_update_id());
  }
  if (membership_.has_generation()) {
    // The latest generation's, also once it ended: which rank was slow stays visible.
    const auto& ranks = membership_.current().worker_ids();
    for (int rank = 0; rank < ranks.size(); ++rank) {
      std::optional<v1::RankScore> score = scores_.Find(ranks[rank]);
      if (!score.has_value()) continue;
      score->set_rank(rank);
      *p->add_rank_scores() = std::move(*score);
    }
  }
  return job;
}

size_t StepMachine::WatchableUpdates() const {
  if (!eval_due_.has_value() || terminal()) return updates_.size();
  // The commit being evaluated is the newest one (no window commits before its evaluation is
  // recorded); an abort of the next window may follow it, and waits too: the stream keeps
  // the log's order.
  for (size_t i = updates_.size(); i-- > 0;) {
    if (OutcomeOf(updates_[i]) != v1::COMMIT) continue;
    return updates_[i].optimizer_update_id() == *eval_due_ ? i : updates_.size();
  }
  return updates_.size();
}

v1::Throughput StepMachine::Throughput(absl::Time now) const {
  return ComputeThroughput(updates_, Job(), now);
}

void StepMachine::MarkReplaced(const std::string& worker_id, const std::string& by) {
  membership_.MarkReplaced(worker_id, by);
}

std::vector<v1::WorkerInfo> StepMachine::Workers() const {
  std::vector<v1::WorkerInfo> out;
  for (const std::string& id : membership_.order()) {
    out.push_back(membership_.Find(id)->info);
    if (out.back().state() == v1::LOST) continue;
    if (std::optional<v1::RankScore> score = scores_.Find(id)) *out.back().mutable_score() = *score;
  }
  return out;
}

const v1::CheckpointRecord* StepMachine::LatestDurableCheckpoint() const {
  for (auto it = checkpoints_.rbegin(); it != checkpoints_.rend(); ++it) {
    if (it->second.durable()) return &it->second;
  }
  return nullptr;
}

std::optional<int64_t> StepMachine::PendingCheckpointFor(int64_t update_id) const {
  if (!CheckpointingEnabled()) return std::nullopt;
  for (auto it = checkpoints_.rbegin(); it != checkpoints_.rend(); ++it) {
    if (it->second.optimizer_update_id() == update_id) {
      if (it->second.durable()) return std::nullopt;
      return it->first;
    }
  }
  return std::nullopt;
}

const v1::WindowDecision* StepMachine::FindDecision(int64_t generation, int64_t window_id) const {
  for (auto it = recent_decisions_.rbegin(); it != recent_decisions_.rend(); ++it) {
    if (it->record().generation() == generation && it->record().window_id() == window_id) {
      return &*it;
    }
  }
  return nullptr;
}

std::optional<absl::Time> StepMachine::NextDeadline() const {
  if (terminal()) return std::nullopt;
  std::optional<absl::Time> next = membership_.NextLeaseExpiry();
  // The end of the join grace, until a tick at or after it has looked (not a past time the
  // driver would spin on while the job waits below workers.min).
  if (short_since_.has_value() && !membership_.generation_live()) {
    const absl::Time grace_end = *short_since_ + JoinGrace();
    if (!ticked_at_.has_value() || *ticked_at_ < grace_end) {
      next = next.has_value() ? std::min(*next, grace_end) : grace_end;
    }
  }
  return next;
}

absl::Duration StepMachine::JoinGrace() const {
  const v1::Workers& w = job_.spec().workers();
  if (!w.has_join_grace()) return 3 * options_.worker_lease;  // a spec resolved before elasticity
  return absl::Seconds(w.join_grace().seconds()) + absl::Nanoseconds(w.join_grace().nanos());
}

// --- Checks ---

absl::Status StepMachine::CheckRunnable() const {
  if (terminal()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id(), " is ", v1::JobState_Name(job_.state()),
                     job_.message().empty() ? "" : ": ", job_.message()));
  }
  return absl::OkStatus();
}

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

absl::StatusOr<StepMachine::Attempt*> StepMachine::AttemptFor(int64_t window_id) {
  const int64_t next = last_window_ + 1;
  if (window_id < next) {
    return absl::AbortedError(
        absl::StrCat("window ", window_id, " already ended; the next window is ", next));
  }
  if (window_id > next + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("window ", window_id, " is ahead of the protocol; the next window is ", next));
  }
  if (StopReachedAfter(window_id - 1, update_id_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("training is done: there is no window ", window_id));
  }
  auto [it, inserted] = attempts_.try_emplace(window_id);
  if (inserted) {
    it->second.window_id = window_id;
    it->second.units.resize(membership_.world_size());
    it->second.complete.resize(membership_.world_size());
  }
  return &it->second;
}

absl::Status StepMachine::RecordUnits(Attempt* attempt, int32_t rank, int64_t units) {
  std::optional<int64_t>& slot = attempt->units[rank];
  if (slot.has_value()) {
    if (*slot != units) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " reported ", *slot,
                                                     " valid units for window ", attempt->window_id,
                                                     " and now ", units));
    }
    return absl::OkStatus();
  }
  if (units > kMaxUnits - attempt->total_units) {
    return absl::InvalidArgumentError(absl::StrCat(
        "valid_units ", units, " of rank ", rank, " would make window ", attempt->window_id,
        "'s total over the ranks exceed 2^53 (", attempt->total_units, " reported so far)"));
  }
  slot = units;
  ++attempt->units_reported;
  attempt->total_units += units;
  // Waiters only care when the barrier can resolve; a partial count wakes nobody.
  if (attempt->units_reported == static_cast<int32_t>(attempt->units.size())) ++version_;
  return absl::OkStatus();
}

bool StepMachine::BarrierReady(const Attempt& attempt) const {
  // No window starts before the weights it would change are evaluated.
  return attempt.window_id == last_window_ + 1 && !eval_due_.has_value() &&
         attempt.units_reported == static_cast<int32_t>(attempt.units.size());
}

absl::Status StepMachine::CheckBeginBarrierPassed(const Attempt& attempt,
                                                  const v1::CompleteWindowRequest& req) const {
  if (attempt.units_reported == static_cast<int32_t>(attempt.units.size())) {
    return absl::OkStatus();
  }
  // A repeat of a CompleteWindow already accepted (the client re-sends while it waits).
  if (attempt.complete[req.rank()].has_value()) return absl::OkStatus();
  if (attempt.units[req.rank()].has_value()) {
    // This rank is still waiting at the begin barrier: it cannot know N yet.
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", req.rank(), " sent CompleteWindow for window ", req.window_id(),
                     " before the window's begin barrier completed (BeginWindow answers N first)"));
  }
  // Only the window in flight when this coordinator recovered can have had its begin barrier
  // answered by the previous one; for it, the report stands for the lost BeginWindow.
  if (req.window_id() == recovered_window_ && req.generation() == recovered_generation_) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", req.rank(), " sent CompleteWindow for window ", req.window_id(),
      " without a BeginWindow: N comes from the begin barrier (a CompleteWindow stands for a "
      "BeginWindow only for the window in flight when the coordinator restarted)"));
}

void StepMachine::Recovered(absl::Time now) {
  // Never shorter than a worker that only heartbeats (no Attach stream) needs to be heard.
  const absl::Duration grace = std::min(
      options_.worker_lease, std::max(options_.reconnect_grace, HeartbeatInterval() * 3 / 2));
  membership_.RenewAll(now + grace);
  membership_.MarkAllDetached(grace);
  recovered_window_ = last_window_ + 1;
  recovered_generation_ = membership_.generation();
}

v1::BeginWindowResponse StepMachine::BarrierResponse(const Attempt& attempt) const {
  v1::BeginWindowResponse r;
  r.set_global_valid_units(attempt.total_units);
  r.set_loss_scale(scaler_.scale());
  r.set_learning_rate(LearningRate(job_.spec(), scheduler_step_));
  r.set_scheduler_step(scheduler_step_);
  r.set_optimizer_update_id(update_id_);
  r.set_epoch(EpochOf(attempt.window_id));
  return r;
}

// --- Worker calls ---

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
  membership_.Renew(req.worker_id(), now, now + options_.worker_lease, req.applied_update_id(),
                    req.has_idle_after_generation() ? req.idle_after_generation() : -1);
  if (!terminal() && req.has_dataset() && !w->dataset_accepted) {
    RETURN_IF_ERROR(AcceptDataset(req.worker_id(), req.dataset(), now));
  }
  if (req.has_idle_after_generation()) MaybeLeaveGeneration(req.worker_id(), now);
  // What a survivor holds may have been the one thing a new generation waited for.
  if (!membership_.generation_live()) MaybeFormGeneration(now);
  return HeartbeatAnswer(req.worker_id());
}

void StepMachine::MaybeLeaveGeneration(const std::string& worker_id, absl::Time now) {
  const WorkerEntry* w = membership_.Find(worker_id);
  if (terminal() || !membership_.generation_live() || membership_.RankOf(worker_id) < 0 ||
      w->idle_after_generation < membership_.generation()) {
    return;
  }
  // A rank waiting for a later generation takes no further part in this one: end it now
  // rather than wait for the others' barriers (they would wait for this rank for ever).
  AbortInFlight(v1::WINDOW_REASON_WORKER_LOST, now);
  if (membership_.generation_live()) EndGeneration("worker left", worker_id, now);
}

void StepMachine::EndGeneration(const std::string& reason, const std::string& worker_id,
                                absl::Time now) {
  v1::JournalRecord record;
  v1::GenerationEnded* ended = record.mutable_generation_ended();
  ended->set_job_id(job_id());
  ended->set_generation(membership_.generation());
  ended->set_reason(reason);
  if (!worker_id.empty()) ended->set_worker_id(worker_id);
  Emit(std::move(record), now);
}

absl::StatusOr<v1::HeartbeatResponse> StepMachine::Attach(const v1::AttachRequest& req,
                                                          uint64_t seq, absl::Time now) {
  if (Drained(req.worker_id())) return HeartbeatAnswer(req.worker_id());  // it exits
  ASSIGN_OR_RETURN(const WorkerEntry* w, FindLive(req.worker_id()));
  if (w->attach_seq != seq) membership_.Attach(req.worker_id(), seq, now + options_.worker_lease);
  return HeartbeatAnswer(req.worker_id());
}

absl::Status StepMachine::CheckRendezvousKey(const std::string& key) const {
  // Keys are "<job>/g<generation>/..." (the assignment's store prefix).
  const std::string prefix = absl::StrCat(job_id(), "/g");
  if (!absl::StartsWith(key, prefix)) return absl::OkStatus();
  const absl::string_view rest = absl::string_view(key).substr(prefix.size());
  int64_t generation = 0;
  if (!absl::SimpleAtoi(rest.substr(0, rest.find('/')), &generation)) return absl::OkStatus();
  const int64_t current = membership_.generation();
  if (generation > current || (generation == current && membership_.generation_live())) {
    return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat("rendezvous key ", key, " belongs to generation ",
                                         generation, ", which is over; the current one is ",
                                         current, membership_.generation_live() ? "" : " (ended)"));
}

absl::Status StepMachine::RendezvousKeyMissing(const std::string& key, absl::Time now) {
  if (recovered_generation_ == 0 || recovered_generation_ != membership_.generation() ||
      !membership_.generation_live() ||
      !absl::StartsWith(key, absl::StrCat(job_id(), "/g", recovered_generation_, "/"))) {
    return absl::OkStatus();
  }
  AbortInFlight(v1::WINDOW_REASON_WORKER_LOST, now);
  if (membership_.generation_live()) {
    EndGeneration("its rendezvous straddled a coordinator restart", /*worker_id=*/"", now);
  }
  MaybeFormGeneration(now);
  return absl::AbortedError(
      absl::StrCat("rendezvous key ", key,
                   " may have been set before the coordinator restarted (the store "
                   "is not journaled): generation ",
                   recovered_generation_, " ends; rejoin"));
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

absl::StatusOr<Answer<v1::BeginWindowResponse>> StepMachine::BeginWindow(
    const v1::BeginWindowRequest& req, absl::Time now) {
  RETURN_IF_ERROR(ValidateBeginWindow(req));
  Answer<v1::BeginWindowResponse> answer;
  if (const v1::WindowDecision* d = FindDecision(req.generation(), req.window_id())) {
    return DecidedAtBegin(*d);
  }
  RETURN_IF_ERROR(CheckRunnable());
  RETURN_IF_ERROR(CheckMember(req.worker_id(), req.generation(), req.rank()));
  ASSIGN_OR_RETURN(Attempt * attempt, AttemptFor(req.window_id()));
  if (!attempt->has_any_report()) attempt->first_report = now;
  const bool first_of_rank = !attempt->units[req.rank()].has_value();
  RETURN_IF_ERROR(RecordUnits(attempt, req.rank(), req.valid_units()));
  // A rank starts window w only after applying every decision before it. Not a report sent
  // ahead while w-1 was open (pipelined), polled again once w-1 is decided: that rank may not
  // have the decision yet.
  if (first_of_rank && req.window_id() == last_window_ + 1) {
    membership_.NoteApplied(req.worker_id(), update_id_);
  }
  if (!BarrierReady(*attempt)) return answer;
  MaybeEndEmptyWindow(now);
  if (const v1::WindowDecision* d = FindDecision(req.generation(), req.window_id())) {
    return DecidedAtBegin(*d);  // ended at its barrier (empty): as a repeated call gets it
  }
  answer.ready = true;
  answer.response = BarrierResponse(*attempt);
  return answer;
}

Answer<v1::BeginWindowResponse> StepMachine::DecidedAtBegin(const v1::WindowDecision& d) {
  Answer<v1::BeginWindowResponse> answer;
  answer.ready = true;
  answer.response.set_global_valid_units(d.record().global_valid_tokens());
  answer.response.set_learning_rate(d.learning_rate());
  *answer.response.mutable_decision() = d;
  return answer;
}

absl::StatusOr<Answer<v1::CompleteWindowResponse>> StepMachine::CompleteWindow(
    const v1::CompleteWindowRequest& req, absl::Time now) {
  RETURN_IF_ERROR(ValidateCompleteWindow(req));
  ASSIGN_OR_RETURN(Answer<v1::CompleteWindowResponse> answer, ReportComplete(req, now));
  // The next window's begin answer rides back with the decision when its barrier passed in the
  // same round. Otherwise (an ABORT, the job's end, a barrier held for an evaluation) it stays
  // out: the worker sends that BeginWindow itself, and its report counts once. Only a report
  // counted before the decision (ReportComplete) is answered here: one counted after it would
  // claim this rank applied a decision it has not received yet.
  if (answer.ready && req.has_next() && CountedAhead(req.next())) {
    absl::StatusOr<Answer<v1::BeginWindowResponse>> next = BeginWindow(req.next(), now);
    if (next.ok() && next->ready) *answer.response.mutable_next() = std::move(next->response);
  }
  return answer;
}

bool StepMachine::CountedAhead(const v1::BeginWindowRequest& next) const {
  if (FindDecision(next.generation(), next.window_id()) != nullptr) return true;  // ended empty
  auto it = attempts_.find(next.window_id());
  if (it == attempts_.end() || next.rank() >= static_cast<int32_t>(it->second.units.size())) {
    return false;
  }
  return it->second.units[next.rank()].has_value();
}

absl::StatusOr<Answer<v1::CompleteWindowResponse>> StepMachine::ReportComplete(
    const v1::CompleteWindowRequest& req, absl::Time now) {
  Answer<v1::CompleteWindowResponse> answer;
  if (const v1::WindowDecision* d = FindDecision(req.generation(), req.window_id())) {
    answer.ready = true;
    *answer.response.mutable_decision() = *d;
    return answer;
  }
  RETURN_IF_ERROR(CheckRunnable());
  RETURN_IF_ERROR(CheckMember(req.worker_id(), req.generation(), req.rank()));
  if (req.window_id() != last_window_ + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("window ", req.window_id(), " cannot complete: the window in progress is ",
                     last_window_ + 1));
  }
  ASSIGN_OR_RETURN(Attempt * attempt, AttemptFor(req.window_id()));
  RETURN_IF_ERROR(CheckBeginBarrierPassed(*attempt, req));
  const int32_t run = std::max(1, req.run());
  if (run < attempt->run) {
    // A first run's report, repeated or late, after the re-run was asked: ask again.
    answer.ready = true;
    answer.response.set_rerun(attempt->run);
    return answer;
  }
  if (run > attempt->run) {
    // A re-run this coordinator never asked for: the one that did restarted, and the first
    // run's reports (not journaled) are gone. Nothing was applied: the window is retried.
    if (!job_.spec().validate().rerun_on_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("run ", run, " of window ", req.window_id(), " was never asked for"));
    }
    // The restarted coordinator may have heard nothing else of the window (ranks stop sending
    // their begin reports once their all-reduce ran): this report is the window in flight, so
    // the abort is recorded and ends the generation.
    if (!attempt->has_any_report()) attempt->first_report = now;
    RETURN_IF_ERROR(RecordUnits(attempt, req.rank(), req.valid_units()));
    AbortInFlight(v1::WINDOW_REASON_RERUN_INTERRUPTED, now);
    MaybeFormGeneration(now);
    const v1::WindowDecision* d = FindDecision(req.generation(), req.window_id());
    if (d == nullptr) return absl::AbortedError("the window was aborted: rejoin");
    answer.ready = true;
    *answer.response.mutable_decision() = *d;
    return answer;
  }
  if (!attempt->has_any_report()) attempt->first_report = now;
  // The report carries n_r, so it also stands for a BeginWindow report that a restarted
  // coordinator never saw. Idempotent per rank: it never counts twice.
  RETURN_IF_ERROR(RecordUnits(attempt, req.rank(), req.valid_units()));
  membership_.NoteApplied(req.worker_id(), update_id_);
  // The report itself, without the begin report riding on it: sent again with or without
  // that, it is the same report.
  v1::CompleteWindowRequest report = req;
  report.clear_next();
  std::optional<v1::CompleteWindowRequest>& slot = attempt->complete[req.rank()];
  if (slot.has_value()) {
    if (ComparableBytes(*slot) != ComparableBytes(report)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", req.rank(), " sent two different reports for window ", req.window_id()));
    }
  } else {
    slot = std::move(report);
    ++attempt->completes_reported;  // the decision's record wakes the waiters
  }
  // The next window's begin report counts before this window can be decided, as a BeginWindow
  // sent ahead does: so it does not claim that this rank applied the decision (NoteApplied),
  // which it learns only from this call's answer. Refused, it is only not answered here.
  if (req.has_next()) (void)BeginWindow(req.next(), now);
  const bool all = attempt->completes_reported == static_cast<int32_t>(attempt->complete.size());
  if (!all || !BarrierReady(*attempt)) return answer;
  DecideWindow(*attempt, now);
  answer.ready = true;
  const v1::WindowDecision* d = FindDecision(req.generation(), req.window_id());
  if (d == nullptr) {  // not decided: every rank computes it again first
    answer.response.set_rerun(attempt->run);
    return answer;
  }
  *answer.response.mutable_decision() = *d;
  return answer;
}

absl::Status StepMachine::AckCheckpoint(const v1::AckCheckpointRequest& req, absl::Time now) {
  RETURN_IF_ERROR(ValidateAckCheckpoint(req));
  RETURN_IF_ERROR(FindRegistered(req.worker_id()).status());
  if (!CheckpointingEnabled()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id(), " has no checkpoint.dir: checkpoints are off"));
  }
  auto it = checkpoints_.find(req.checkpoint_id());
  if (it == checkpoints_.end()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", req.checkpoint_id(), " was never requested"));
  }
  if (it->second.optimizer_update_id() != req.optimizer_update_id()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", req.checkpoint_id(), " holds optimizer update ",
                     it->second.optimizer_update_id(), ", not ", req.optimizer_update_id()));
  }
  if (it->second.durable()) return absl::OkStatus();
  v1::JournalRecord record;
  v1::CheckpointDurable* c = record.mutable_checkpoint_durable();
  c->set_job_id(job_id());
  c->set_checkpoint_id(req.checkpoint_id());
  c->set_path(req.path());
  Emit(std::move(record), now);
  MaybeFinish(now);
  return absl::OkStatus();
}

absl::StatusOr<Answer<v1::ReportEvalResponse>> StepMachine::ReportEval(
    const v1::ReportEvalRequest& req, absl::Time now) {
  RETURN_IF_ERROR(ValidateReportEval(req));
  Answer<v1::ReportEvalResponse> answer;
  if (last_eval_.has_value() && last_eval_->optimizer_update_id() == req.optimizer_update_id() &&
      eval_due_ != req.optimizer_update_id()) {
    answer.ready = true;  // recorded: a repeat, or a rank that learns the result late
    answer.response.set_eval_loss(last_eval_->eval_loss());
    answer.response.set_valid_units(last_eval_->valid_units());
    return answer;
  }
  RETURN_IF_ERROR(CheckRunnable());
  RETURN_IF_ERROR(CheckMember(req.worker_id(), req.generation(), req.rank()));
  if (eval_due_ != req.optimizer_update_id()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no evaluation of update ", req.optimizer_update_id(), " is due",
        eval_due_.has_value() ? absl::StrCat(" (update ", *eval_due_, "'s is)") : std::string(),
        ": a rank evaluates only when a decision (run_eval) or its assignment asks"));
  }
  if (!eval_attempt_.has_value() || eval_attempt_->generation != req.generation()) {
    // Built, then moved in: clang 14 rejects emplace() of a nested struct with default member
    // initializers (is_constructible is evaluated as if the enclosing class were incomplete).
    EvalAttempt attempt;
    attempt.generation = req.generation();
    attempt.reports.resize(membership_.world_size());
    eval_attempt_ = std::move(attempt);
  }
  std::optional<v1::ReportEvalRequest>& slot = eval_attempt_->reports[req.rank()];
  if (slot.has_value()) {
    if (ComparableBytes(*slot) != ComparableBytes(req)) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", req.rank(),
                                                     " sent two different evaluations of update ",
                                                     req.optimizer_update_id()));
    }
  } else {
    slot = req;
    ++eval_attempt_->reported;  // a partial count wakes nobody; the record wakes everyone
  }
  if (eval_attempt_->reported != static_cast<int32_t>(eval_attempt_->reports.size())) {
    return answer;
  }
  // Token-weighted over every rank's share: Σ loss_sum_r / Σ n_r, never a mean of means.
  double loss_sum = 0.0;
  int64_t units = 0;
  for (const std::optional<v1::ReportEvalRequest>& r : eval_attempt_->reports) {
    loss_sum += r->loss_sum();
    units += r->valid_units();
  }
  v1::JournalRecord record;
  v1::EvalEnded* e = record.mutable_eval_ended();
  e->set_job_id(job_id());
  e->set_generation(req.generation());
  e->set_optimizer_update_id(req.optimizer_update_id());
  e->set_eval_loss(units > 0 ? loss_sum / static_cast<double>(units)
                             : std::numeric_limits<double>::quiet_NaN());
  e->set_valid_units(units);
  answer.ready = true;
  answer.response.set_eval_loss(e->eval_loss());
  answer.response.set_valid_units(units);
  Emit(std::move(record), now);
  MaybeFinish(now);
  MaybeEndEmptyWindow(now);
  return answer;
}

absl::Status StepMachine::ReportFailure(const v1::ReportFailureRequest& req, absl::Time now) {
  ASSIGN_OR_RETURN(const WorkerEntry* w, FindRegistered(req.worker_id()));
  if (terminal()) return absl::OkStatus();
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

void StepMachine::Tick(absl::Time now) {
  ticked_at_ = now;
  if (terminal()) return;
  bool lost_any = false;
  for (const std::string& id : membership_.Expired(now)) {
    if (membership_.RankOf(id) >= 0 && membership_.generation_live()) {
      AbortInFlight(v1::WINDOW_REASON_WORKER_LOST, now);
    }
    v1::JournalRecord record;
    v1::WorkerLost* lost = record.mutable_worker_lost();
    lost->set_job_id(job_id());
    lost->set_worker_id(id);
    lost->set_reason("lease expired");
    Emit(std::move(record), now);
    lost_any = true;
  }
  // Also when nobody was lost: the join grace may just have run out.
  if (lost_any || !membership_.generation_live()) MaybeFormGeneration(now);
}

// --- Decisions ---

v1::UpdateRecord StepMachine::BaseRecord(int64_t window_id) const {
  v1::UpdateRecord r;
  r.set_window_id(window_id);
  r.set_generation(membership_.generation());
  r.set_world_size(membership_.world_size());
  r.set_optimizer_update_id(update_id_);
  r.set_scheduler_step(scheduler_step_);
  r.set_cumulative_tokens(cumulative_tokens_);
  r.set_learning_rate(LearningRate(job_.spec(), scheduler_step_));
  r.set_loss_scale(scaler_.scale());
  r.set_checkpoint_id(checkpoint_id_);
  r.set_epoch(EpochOf(window_id));
  r.set_micro_step_id(micro_step_id_);
  r.set_tail_window(planner_ != nullptr && planner_->IsTailWindow(window_id));
  return r;
}

void StepMachine::DecideWindow(Attempt& attempt, absl::Time now) {
  const size_t world = attempt.complete.size();
  const v1::CompleteWindowRequest& first = *attempt.complete[0];
  const auto observe_speed = [&] {
    // Every rank reported the window: how fast each computed its share (straggler scores).
    std::vector<RankScores::Sample> samples(world);
    for (size_t rank = 0; rank < world; ++rank) {
      const v1::CompleteWindowRequest& c = *attempt.complete[rank];
      samples[rank] = {c.worker_id(), c.has_phases() ? c.valid_units() : 0, c.phases()};
    }
    scores_.Observe(samples);
  };
  int64_t units = 0, micro_steps = 0;
  double loss_sum = 0.0;
  size_t inf_ranks = 0;
  std::string desync;
  for (size_t rank = 0; rank < world; ++rank) {
    const v1::CompleteWindowRequest& c = *attempt.complete[rank];
    units += c.valid_units();
    micro_steps += c.micro_steps();
    loss_sum += c.loss_sum();
    if (c.found_inf()) ++inf_ranks;
    if (desync.empty() && c.allreduce_calls() != first.allreduce_calls()) {
      desync = absl::StrCat("rank ", rank, " made ", c.allreduce_calls(),
                            " all-reduce calls, rank 0 made ", first.allreduce_calls());
    }
  }
  // Every rank checks the same all-reduced gradient, so they must agree on found_inf and
  // on its norm. Disagreement means the replicas diverged: never continue silently.
  if (desync.empty() && inf_ranks != 0 && inf_ranks != world) {
    desync = absl::StrCat(inf_ranks, " of ", world, " ranks found non-finite gradients");
  }
  if (desync.empty() && inf_ranks == 0) {
    for (size_t rank = 1; rank < world; ++rank) {
      const double norm = attempt.complete[rank]->grad_norm();
      if (!GradNormsAgree(norm, first.grad_norm())) {
        desync = absl::StrFormat("rank %d reports grad norm %.9g, rank 0 %.9g", rank, norm,
                                 first.grad_norm());
        break;
      }
    }
  }

  v1::WindowDecision d;
  v1::UpdateRecord* r = d.mutable_record();
  *r = BaseRecord(attempt.window_id);
  r->set_micro_steps(micro_steps);
  r->set_global_valid_tokens(units);
  r->set_allreduce_calls(first.allreduce_calls());
  r->set_loss(units > 0 ? loss_sum / static_cast<double>(units) : 0.0);
  r->set_grad_norm_pre_clip(first.grad_norm());
  if (first.has_grad_norm_scaled()) r->set_grad_norm_scaled(first.grad_norm_scaled());
  r->set_window_seconds(absl::ToDoubleSeconds(now - attempt.first_report));

  if (!desync.empty()) {
    d.set_outcome(v1::ABORT);
    SetReason(&d, v1::WINDOW_REASON_DESYNC);
    r->set_grad_norm_post_clip(0.0);
    observe_speed();
    EndWindow(std::move(d), now);
    if (terminal()) return;
    if (consecutive_desyncs_ >= options_.max_consecutive_desyncs) {
      FailJob(absl::StrCat("replicas diverged ", consecutive_desyncs_, " times in a row at window ",
                           last_window_ + 1, " (", desync, ")"),  // `attempt` died in Apply
              now);
      return;
    }
    MaybeFormGeneration(now);
    return;
  }
  if (units == 0) {
    // Normally decided at the begin barrier; reached here only when the coordinator
    // restarted between the barrier and the reports.
    d.set_outcome(v1::SKIP);
    SetReason(&d, v1::WINDOW_REASON_EMPTY_WINDOW);
  } else if (inf_ranks > 0) {
    d.set_outcome(v1::SKIP);
    SetReason(&d, v1::WINDOW_REASON_OVERFLOW);
  } else if (!std::isfinite(loss_sum) || !std::isfinite(first.grad_norm())) {
    d.set_outcome(v1::SKIP);
    SetReason(&d, v1::WINDOW_REASON_NONFINITE_LOSS);
  } else {
    d.set_outcome(v1::COMMIT);
  }
  if (attempt.run == 1) {
    if (std::optional<std::string> cause = RerunCause(d)) {
      AskRerun(attempt, *cause);
      return;
    }
  } else {
    AttributeRerun(attempt, &d);
  }
  observe_speed();
  EndWindow(std::move(d), now);
}

std::optional<std::string> StepMachine::RerunCause(const v1::WindowDecision& d) const {
  const v1::Validate& v = job_.spec().validate();
  const auto on = [&v](v1::Validate::Trigger t) {
    return std::find(v.rerun_on().begin(), v.rerun_on().end(), t) != v.rerun_on().end();
  };
  // Non-finite gradients are an overflow the scaler expects only with a scaler.
  const bool nonfinite = d.reason_code() == v1::WINDOW_REASON_NONFINITE_LOSS ||
                         (d.reason_code() == v1::WINDOW_REASON_OVERFLOW && !scaler_config_.enabled);
  if (nonfinite && on(v1::Validate::nonfinite)) return "nonfinite";
  if (d.outcome() == v1::COMMIT && on(v1::Validate::spike) && IsSpike(d.record().loss())) {
    return "spike";
  }
  return std::nullopt;
}

bool StepMachine::IsSpike(double loss) const {
  const v1::Validate& v = job_.spec().validate();
  const size_t n = static_cast<size_t>(v.spike_window());
  std::vector<double> losses;
  losses.reserve(n);
  for (auto it = updates_.rbegin(); it != updates_.rend() && losses.size() < n; ++it) {
    if (OutcomeOf(*it) == v1::COMMIT) losses.push_back(it->loss());
  }
  if (losses.size() < n) return false;
  double sum = 0.0;
  for (const double x : losses) sum += x;
  const double mean = sum / static_cast<double>(n);
  double squares = 0.0;  // about the mean: E[x²] − mean² cancels to noise for close losses
  for (const double x : losses) squares += (x - mean) * (x - mean);
  // Losses equal to their last digits have σ ≈ 0; a rise in those digits is no spike.
  const double sigma =
      std::max(std::sqrt(squares / static_cast<double>(n)), kSpikeSigmaFloor * std::abs(mean));
  return loss > mean + v.spike_sigma() * sigma;
}

void StepMachine::AskRerun(Attempt& attempt, const std::string& cause) {
  attempt.first_run = std::move(attempt.complete);
  attempt.complete.assign(attempt.first_run.size(), std::nullopt);
  attempt.completes_reported = 0;
  attempt.run = 2;
  attempt.rerun_cause = cause;
  ++version_;  // the ranks waiting for the decision are answered: compute the window again
}

namespace {

// Bit for bit, except that any NaN equals any NaN (its payload says nothing of the data).
bool SameBits(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint64_t x, y;
  std::memcpy(&x, &a, sizeof x);
  std::memcpy(&y, &b, sizeof y);
  return x == y;
}

// Whether a rank's second run reproduced its first: its loss, units and local gradient.
bool Reproduced(const v1::CompleteWindowRequest& first, const v1::CompleteWindowRequest& again) {
  return SameBits(first.loss_sum(), again.loss_sum()) &&
         first.valid_units() == again.valid_units() &&
         first.has_grad_checksum() == again.has_grad_checksum() &&
         first.grad_checksum() == again.grad_checksum();
}

// How much a rank's share weighs in a bad window: a non-finite loss above any finite one.
double LossWeight(const v1::CompleteWindowRequest& c) {
  if (!std::isfinite(c.loss_sum())) return std::numeric_limits<double>::infinity();
  return c.valid_units() > 0 ? c.loss_sum() / static_cast<double>(c.valid_units()) : 0.0;
}

}  // namespace

void StepMachine::AttributeRerun(const Attempt& attempt, v1::WindowDecision* d) const {
  v1::Rerun* rerun = d->mutable_record()->mutable_rerun();
  rerun->set_cause(attempt.rerun_cause);
  for (size_t rank = 0; rank < attempt.complete.size(); ++rank) {
    if (!Reproduced(*attempt.first_run[rank], *attempt.complete[rank])) {
      rerun->add_ranks(static_cast<int32_t>(rank));
      rerun->add_worker_ids(attempt.complete[rank]->worker_id());
    }
  }
  if (rerun->ranks_size() > 0) {
    // Its first run is discarded: the window is decided on the second, as a retry.
    rerun->set_verdict("transient");
    rerun->set_rank(rerun->ranks(0));
    rerun->set_worker_id(rerun->worker_ids(0));
    return;
  }
  rerun->set_verdict("persistent");
  size_t worst = 0;
  for (size_t rank = 1; rank < attempt.complete.size(); ++rank) {
    if (LossWeight(*attempt.complete[rank]) > LossWeight(*attempt.complete[worst])) worst = rank;
  }
  const v1::CompleteWindowRequest& c = *attempt.complete[worst];
  rerun->set_rank(static_cast<int32_t>(worst));
  rerun->set_worker_id(c.worker_id());
  // Its samples whose loss dominates: the non-finite ones and those within half the worst.
  for (const v1::SampleLoss& s : c.sample_losses()) {
    const double top = c.sample_losses(0).loss();  // the worst: reported first
    if (!std::isfinite(s.loss()) || (std::isfinite(top) && s.loss() >= 0.5 * top)) {
      rerun->add_sample_ids(s.sample_id());
    }
  }
  if (attempt.rerun_cause == "spike" && job_.spec().validate().skip_spikes() &&
      d->outcome() == v1::COMMIT) {
    d->set_outcome(v1::SKIP);
    SetReason(d, v1::WINDOW_REASON_LOSS_SPIKE);
  }
}

void StepMachine::EndWindow(v1::WindowDecision d, absl::Time now) {
  v1::UpdateRecord* r = d.mutable_record();
  SetOutcome(r, d.outcome());
  r->set_reason(d.reason());
  r->set_reason_code(d.reason_code());
  const v1::Clip& clip = job_.spec().clip();
  std::optional<double> max_norm;
  if (clip.has_max_grad_norm()) max_norm = clip.max_grad_norm();

  LossScaler scaler_after = scaler_;
  int64_t update_after = update_id_;
  int64_t step_after = scheduler_step_;
  if (d.outcome() == v1::COMMIT) {
    const double coef = ClipCoefficient(max_norm, r->grad_norm_pre_clip());
    d.set_clip_coef(coef);
    r->set_clip_coef(coef);
    r->set_grad_norm_post_clip(r->grad_norm_pre_clip() * coef);
    update_after = update_id_ + 1;
    step_after = scheduler_step_ + 1;
    r->set_cumulative_tokens(SaturatingAdd(cumulative_tokens_, r->global_valid_tokens()));
    scaler_after.Update(/*found_inf=*/false);
    // From the previous commit in the log, or from the job's start for the first one.
    const int64_t since_ms = last_commit_ms_ > 0 ? last_commit_ms_ : job_.start_time_ms();
    r->set_update_interval_seconds(
        static_cast<double>(std::max<int64_t>(0, absl::ToUnixMillis(now) - since_ms)) / 1000.0);
  } else if (d.outcome() == v1::SKIP) {
    // The scaler reacts to gradient overflow only, once per window.
    if (d.reason_code() == v1::WINDOW_REASON_OVERFLOW) scaler_after.Update(/*found_inf=*/true);
    r->set_grad_norm_post_clip(0.0);
  }
  d.set_learning_rate(r->learning_rate());
  d.set_optimizer_update_id(update_after);
  d.set_scheduler_step(step_after);
  r->set_optimizer_update_id(update_after);
  r->set_scheduler_step(step_after);
  r->set_loss_scale(scaler_after.scale());
  r->set_end_time_ms(absl::ToUnixMillis(now));

  v1::JournalRecord record;
  v1::WindowEnded* ended = record.mutable_window_ended();
  ended->set_job_id(job_id());
  *ended->mutable_scaler_after() = scaler_after.State();

  if (d.outcome() != v1::ABORT) {
    // The window's micro-batches ran and it ended: they count (an abort's are run again).
    r->set_micro_step_id(SaturatingAdd(micro_step_id_, r->micro_steps()));
    if (planner_ != nullptr && planner_->EndsEpoch(r->window_id()) &&
        planner_->dropped_per_epoch() > 0) {
      *r->mutable_dropped_tail() = planner_->DroppedTail(EpochOf(r->window_id()));
    }
    const bool done = StopReachedAfter(r->window_id(), update_after);
    d.set_job_done(done);
    const int64_t every = job_.spec().checkpoint().every_updates();
    const bool periodic = d.outcome() == v1::COMMIT && every > 0 && update_after % every == 0;
    // The last committed update is always checkpointed when the job ends.
    const bool final_needed =
        done && checkpoints_.rbegin()->second.optimizer_update_id() != update_after;
    // Every eval.every_updates-th update, and the last one (once) when the job ends.
    const int64_t eval_every = job_.spec().eval().every_updates();  // 0 without eval
    const bool periodic_eval =
        d.outcome() == v1::COMMIT && eval_every > 0 && update_after % eval_every == 0;
    const bool final_eval =
        done && (!last_eval_.has_value() || last_eval_->optimizer_update_id() != update_after);
    d.set_run_eval(EvalEnabled() && update_after > 0 && (periodic_eval || final_eval));
    if (CheckpointingEnabled() && (periodic || final_needed)) {
      v1::CheckpointRecord* c = ended->mutable_checkpoint_assigned();
      c->set_checkpoint_id(next_checkpoint_id_);
      c->set_window_id(r->window_id());
      c->set_optimizer_update_id(update_after);
      c->set_scheduler_step(step_after);
      c->set_cumulative_tokens(r->cumulative_tokens());
      c->set_micro_step_id(r->micro_step_id());
      *c->mutable_scaler() = scaler_after.State();
      d.set_write_checkpoint(true);
      d.set_checkpoint_id(next_checkpoint_id_);
      r->set_checkpoint_id(next_checkpoint_id_);
    }
  }
  *ended->mutable_decision() = std::move(d);
  Emit(std::move(record), now);
  // Begin reports of the next window sent ahead (pipelined) arrived while this one was open:
  // the next window's time (window_seconds) starts now, not then.
  if (auto next = attempts_.find(last_window_ + 1);
      next != attempts_.end() && next->second.has_any_report()) {
    next->second.first_report = std::max(next->second.first_report, now);
  }
  MaybeFinish(now);
  MaybeEndEmptyWindow(now);
  // One change of members per boundary: the generation each forms runs a window first.
  if (!MaybeGrow(now) && !MaybeDrainSuspect(now)) MaybeReplaceStraggler(now);
}

bool StepMachine::MembersMayChangeNow() const {
  return !terminal() && membership_.generation_live() && !eval_due_.has_value() &&
         !StopReachedAfter(last_window_, update_id_);
}

bool StepMachine::MaybeGrow(absl::Time now) {
  if (!MembersMayChangeNow() || membership_.world_size() >= job_.spec().workers().count() ||
      membership_.Standbys().empty()) {
    return false;
  }
  // At a window boundary, with workers back: the next generation takes them (up to
  // workers.count). The members finish applying this decision first, then say so. Begin
  // reports of the next window sent ahead (pipelined) do not hold this up: no rank computed
  // anything of it, and their calls are answered ABORTED like any of the ended generation.
  EndGeneration("workers joined", /*worker_id=*/"", now);
  MaybeFormGeneration(now);
  return true;
}

bool StepMachine::Drained(const std::string& worker_id) const {
  const WorkerEntry* w = membership_.Find(worker_id);
  return w != nullptr && !w->info.drained().empty();
}

bool StepMachine::StandbyReady() const {
  const std::vector<std::string> standbys = membership_.Standbys();
  return std::any_of(standbys.begin(), standbys.end(),
                     [this](const std::string& id) { return !membership_.Find(id)->detached; });
}

bool StepMachine::MaybeDrainSuspect(absl::Time now) {
  const v1::Validate& v = job_.spec().validate();
  if (v.rerun_on().empty() || !MembersMayChangeNow()) return false;
  // A standby takes its rank, or the job goes on one rank smaller (elastic): a worker that
  // computes wrong costs more than a missing one. Below workers.min it stays, and is logged.
  if (!StandbyReady() && membership_.world_size() - 1 < job_.spec().workers().min()) {
    return false;
  }
  for (const std::string& id : membership_.Survivors()) {
    const int32_t faults = membership_.Find(id)->info.suspect_count();
    if (faults < v.max_suspect()) continue;
    Drain(id, "faulty worker drained",
          absl::StrCat("faulty: a re-run found its first run not reproduced in ", faults,
                       " windows (validate.max_suspect ", v.max_suspect(), ")"),
          now);
    return true;
  }
  return false;
}

void StepMachine::MaybeReplaceStraggler(absl::Time now) {
  const v1::Stragglers& policy = job_.spec().stragglers();
  if (!policy.has_replace_below() || !MembersMayChangeNow()) return;
  // Only with a standby to take its place: draining alone would shrink the world (or stop
  // the job below workers.min), which costs more than a slow rank does.
  if (!StandbyReady()) return;
  // The rank longest below the threshold, if its streak is long enough: one per boundary.
  std::string slowest;
  v1::RankScore worst;
  for (const std::string& id : membership_.Survivors()) {
    std::optional<v1::RankScore> score = scores_.Find(id);
    if (!score.has_value() || score->windows_below() < policy.replace_after_windows()) continue;
    if (slowest.empty() || score->windows_below() > worst.windows_below() ||
        (score->windows_below() == worst.windows_below() && score->relative() < worst.relative())) {
      slowest = id;
      worst = *score;
    }
  }
  if (slowest.empty()) return;
  Drain(slowest, "straggler replaced",
        absl::StrCat("straggler: relative score ", absl::SixDigits(worst.relative()),
                     " below stragglers.replace_below ", absl::SixDigits(policy.replace_below()),
                     " for ", worst.windows_below(), " scored windows in a row (rank ",
                     worst.rank(), "); a standby takes its place"),
        now);
}

void StepMachine::Drain(const std::string& worker_id, const std::string& why,
                        const std::string& reason, absl::Time now) {
  // At a window boundary, like a grow: the members finish applying this decision, and the
  // next generation is seeded by a survivor that holds the update, so the weights do not
  // change. The generation ends first, so begin reports sent ahead are answered ABORTED
  // without a log record, as when workers join.
  EndGeneration(why, worker_id, now);
  v1::JournalRecord record;
  v1::WorkerLost* lost = record.mutable_worker_lost();
  lost->set_job_id(job_id());
  lost->set_worker_id(worker_id);
  lost->set_reason(reason);
  lost->set_drained(true);
  Emit(std::move(record), now);
  MaybeFormGeneration(now);
}

void StepMachine::MaybeEndEmptyWindow(absl::Time now) {
  if (terminal() || StopReachedAfter(last_window_, update_id_)) return;  // no window after the stop
  auto it = attempts_.find(last_window_ + 1);
  if (it == attempts_.end() || !BarrierReady(it->second)) return;
  if (it->second.total_units != 0) return;
  if (FindDecision(membership_.generation(), it->first) != nullptr) return;
  v1::WindowDecision d;
  d.set_outcome(v1::SKIP);
  SetReason(&d, v1::WINDOW_REASON_EMPTY_WINDOW);
  v1::UpdateRecord* r = d.mutable_record();
  *r = BaseRecord(it->first);
  r->set_window_seconds(absl::ToDoubleSeconds(now - it->second.first_report));
  EndWindow(std::move(d), now);
}

void StepMachine::AbortInFlight(v1::WindowReason reason, absl::Time now) {
  auto it = attempts_.find(last_window_ + 1);
  if (it == attempts_.end() || !it->second.has_any_report()) {
    // Nothing in flight: the generation still ends, without a log record.
    return;
  }
  v1::WindowDecision d;
  d.set_outcome(v1::ABORT);
  SetReason(&d, reason);
  v1::UpdateRecord* r = d.mutable_record();
  *r = BaseRecord(it->first);
  r->set_global_valid_tokens(it->second.total_units);
  r->set_window_seconds(absl::ToDoubleSeconds(now - it->second.first_report));
  EndWindow(std::move(d), now);
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

void StepMachine::MaybeFinish(absl::Time now) {
  if (terminal() || !StopReachedAfter(last_window_, update_id_)) return;
  if (eval_due_.has_value()) return;                         // wait for the final evaluation
  if (PendingCheckpointFor(update_id_).has_value()) return;  // wait for the final checkpoint
  v1::JournalRecord record;
  v1::JobEnded* e = record.mutable_job_ended();
  e->set_job_id(job_id());
  e->set_state(v1::SUCCEEDED);
  Emit(std::move(record), now);
}

void StepMachine::MaybeFormGeneration(absl::Time now) {
  if (terminal() || !dataset_.has_value() || membership_.generation_live()) return;
  // A worker whose stream just dropped is probably dead: building on it would only give a
  // generation that breaks again when its lease ends. It is left out until it speaks again,
  // and while it may hold the current update, nothing rolls back.
  std::vector<std::string> survivors, standbys;
  bool detached_survivor = false;
  for (const std::string& id : membership_.Survivors()) {
    if (membership_.Find(id)->detached) {
      detached_survivor = true;
    } else {
      survivors.push_back(id);
    }
  }
  for (const std::string& id : membership_.Standbys()) {
    if (!membership_.Find(id)->detached) standbys.push_back(id);
  }
  const size_t count = static_cast<size_t>(job_.spec().workers().count());
  const size_t available = survivors.size() + standbys.size();
  if (available < count) {
    // Short of workers.count: wait for replacements for the join grace, then go on with at
    // least workers.min. The global batch stays the same; each rank runs more micro-steps.
    if (!short_since_.has_value()) short_since_ = now;
    if (available < static_cast<size_t>(job_.spec().workers().min()) ||
        now < *short_since_ + JoinGrace()) {
      return;
    }
  }
  const size_t need = std::min(available, count);

  // Survivors whose replica holds the current update come first, so rank 0 can seed the
  // others. A member of a generation that broke before it synced (its source died) holds
  // nothing: it must not seed anyone.
  std::vector<std::string> holders, others;
  bool unsettled = detached_survivor;  // a survivor that may still come to hold the update
  for (const std::string& id : survivors) {
    const WorkerEntry* w = membership_.Find(id);
    const bool holds = w->applied_update_id >= update_id_;
    (holds ? holders : others).push_back(id);
    unsettled |= !holds && w->idle_after_generation < membership_.generation();
  }
  // Never roll back while a live replica may hold the current update: a survivor that has not
  // said it is idle may be applying the decision (or, after a coordinator restart, has not
  // spoken yet). Each one soon says so in a heartbeat, or its lease expires.
  if (holders.empty() && update_id_ > 0 && unsettled) return;
  v1::JournalRecord record;
  v1::GenerationFormed* f = record.mutable_generation_formed();
  f->set_job_id(job_id());
  f->set_generation(membership_.generation() + 1);
  std::vector<std::string> order = holders;
  order.insert(order.end(), others.begin(), others.end());
  order.insert(order.end(), standbys.begin(), standbys.end());
  order.resize(need);
  for (const std::string& id : order) f->add_worker_ids(id);
  v1::Assignment* a = f->mutable_assignment();
  a->set_store_prefix(absl::StrCat(job_id(), "/g", f->generation(), "/"));

  // Where the replicas' state comes from (docs/design.md, "Failure semantics").
  if (!holders.empty()) {
    a->set_state_source(v1::Assignment::BROADCAST);
    a->set_source_rank(0);
  } else if (update_id_ == 0) {
    a->set_state_source(v1::Assignment::INIT);
  } else {
    // Every replica is gone: roll back to the latest durable checkpoint (or the start).
    const v1::CheckpointRecord* resume = LatestDurableCheckpoint();
    f->set_rolled_back(true);
    if (resume != nullptr) {
      *f->mutable_rollback_to() = *resume;
      a->set_state_source(v1::Assignment::CHECKPOINT);
      a->set_checkpoint_id(resume->checkpoint_id());
    } else {
      *f->mutable_rollback_to() = checkpoints_.begin()->second;  // checkpoint 0: the initial state
      a->set_state_source(v1::Assignment::INIT);
    }
  }
  const int64_t update_id = f->rolled_back() ? f->rollback_to().optimizer_update_id() : update_id_;
  a->set_optimizer_update_id(update_id);
  a->set_scheduler_step(f->rolled_back() ? f->rollback_to().scheduler_step() : scheduler_step_);
  a->set_next_window_id((f->rolled_back() ? f->rollback_to().window_id() : last_window_) + 1);
  a->set_loss_scale(f->rolled_back() ? LossScaler(scaler_config_, f->rollback_to().scaler()).scale()
                                     : scaler_.scale());
  // A checkpoint of this state that was requested but never acknowledged is written again.
  if (std::optional<int64_t> pending = PendingCheckpointFor(update_id)) {
    a->set_pending_checkpoint_id(*pending);
  }
  // An evaluation a lost rank interrupted is run again on the same weights (a rollback past
  // it clears it in Apply: that update is evaluated when it commits again).
  if (eval_due_.has_value() && *eval_due_ == update_id) a->set_pending_eval_update_id(update_id);
  if (last_eval_.has_value() && last_eval_->optimizer_update_id() <= update_id) {
    a->set_last_eval_loss(last_eval_->eval_loss());
    a->set_last_eval_update_id(last_eval_->optimizer_update_id());
  }
  short_since_.reset();
  Emit(std::move(record), now);
}

}  // namespace trainstep
