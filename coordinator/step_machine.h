// StepMachine: one job's authoritative window protocol (docs/design.md, "The window
// protocol"). It owns the job's ids, loss scaler, membership and per-update log, and
// decides every window: COMMIT, SKIP(reason) or ABORT(reason).
//
// One class, defined one concept per file: step_machine.cc (construction, the outbox, the
// job's end) and step_machine/: replay.cc (Apply, CheckFollows, Restore, Snapshot),
// job_view.cc, worker_calls.cc, generations.cc, window_barrier.cc, decision.cc, rerun.cc,
// eval_checkpoint.cc and deadlines.cc (leases, grace periods, the rendezvous-key guard).
//
// Pure: no gRPC, no threads, no I/O, no clock. Every call takes `now`. Every durable
// change is made the same way: decide → build a journal record → Apply(record). The
// records are collected in an outbox the caller drains (TakeRecords) and journals
// before it answers anyone; replaying the journal calls the same Apply, so a recovered
// machine is the one that crashed. Things that are not journaled (leases, barrier
// reports in flight) are rebuilt by the workers' retries.
//
// Reports are idempotent on (generation, window_id, rank). A call that cannot be
// answered yet (a barrier still waiting for ranks) returns `ready = false`; the caller
// repeats the same call when the machine changed, and gets the answer then.
//
// Not thread-safe: the caller serialises calls.
#ifndef TRAINSTEP_COORDINATOR_STEP_MACHINE_H_
#define TRAINSTEP_COORDINATOR_STEP_MACHINE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/goodput.h"
#include "coordinator/loss_scaler.h"
#include "coordinator/membership.h"
#include "coordinator/rank_scores.h"
#include "core/window_outcome.h"
#include "core/window_plan.h"
#include "trainstep/v1/job_service.pb.h"
#include "trainstep/v1/journal.pb.h"
#include "trainstep/v1/worker_service.pb.h"

namespace trainstep {

struct MachineOptions {
  absl::Duration worker_lease = absl::Seconds(10);
  // A worker whose Attach stream dropped is lost this long after, unless it attaches again or
  // heartbeats: a dead process is replaced in well under a second, not a lease.
  absl::Duration detach_grace = absl::Milliseconds(300);
  // After a restart, how long a worker has to be heard from again (a live one reconnects
  // within a fraction of a second; one that died while the coordinator was down is then lost
  // after this, not after a whole lease). Capped at the lease.
  absl::Duration reconnect_grace = absl::Seconds(3);
  // A window aborted for DESYNC this many times in a row fails the job.
  int max_consecutive_desyncs = 3;
  // Decisions kept to answer repeated reports.
  size_t recent_decisions = 8;
};

// The clip coefficient (docs/numerics.md, rule 8): min(1, max_norm / (norm + 1e-6)); 1 without
// clipping.
double ClipCoefficient(std::optional<double> max_grad_norm, double grad_norm);
// Two ranks' reports of the same all-reduced gradient's norm agree (relative 1e-6).
bool GradNormsAgree(double a, double b);

template <typename Response>
struct Answer {
  bool ready = false;  // false: a barrier is still waiting; ask again after the machine changes
  Response response;
};

// An answer that needed no waiting.
template <typename Response>
Answer<Response> Ready(Response response) {
  Answer<Response> a;
  a.ready = true;
  a.response = std::move(response);
  return a;
}

class StepMachine {
 public:
  // A machine for a job just submitted. `job` carries id, name, resolved spec and times.
  // Its JobSubmitted record is the first one TakeRecords returns.
  static std::unique_ptr<StepMachine> Create(const MachineOptions& options, const v1::Job& job,
                                             absl::Time now);
  // The machine a JobSubmitted record describes (replay).
  static std::unique_ptr<StepMachine> FromSubmitted(const MachineOptions& options,
                                                    const v1::JobSubmitted& submitted);
  // A machine rebuilt from a snapshot; every live worker's lease restarts at now.
  static std::unique_ptr<StepMachine> Restore(const MachineOptions& options,
                                              const v1::JobSnapshot& snapshot, absl::Time now);

  // --- Worker calls ---
  // `replaces`: the lost worker (of this job or another) that this one is; the record says so.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(const std::string& worker_id,
                                                            const v1::RegisterWorkerRequest& req,
                                                            absl::Time now,
                                                            const std::string& replaces = "");
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req, absl::Time now);
  absl::StatusOr<Answer<v1::BeginWindowResponse>> BeginWindow(const v1::BeginWindowRequest& req,
                                                              absl::Time now);
  // With `next` (the same rank's BeginWindow for the window after), that report counts as one
  // sent ahead, and its answer comes back in the response's `next` when its barrier passed in
  // the round of this decision: one call per window.
  absl::StatusOr<Answer<v1::CompleteWindowResponse>> CompleteWindow(
      const v1::CompleteWindowRequest& req, absl::Time now);
  absl::Status AckCheckpoint(const v1::AckCheckpointRequest& req, absl::Time now);
  // The eval barrier: ready once every rank of the generation reported its held-out loss for
  // the update a decision asked to evaluate; the EvalEnded record is journaled first. A repeat
  // after that returns the recorded result.
  absl::StatusOr<Answer<v1::ReportEvalResponse>> ReportEval(const v1::ReportEvalRequest& req,
                                                            absl::Time now);
  absl::Status ReportFailure(const v1::ReportFailureRequest& req, absl::Time now);
  // The worker's Attach stream number `seq` (the caller numbers streams) is open, or still
  // open when asked again: the worker's place, as a heartbeat answers it. NOT_FOUND once the
  // worker was declared lost.
  absl::StatusOr<v1::HeartbeatResponse> Attach(const v1::AttachRequest& req, uint64_t seq,
                                               absl::Time now);
  // ABORTED for a waiting rendezvous read of `key` by a rank of `generation` (the request's
  // field; 0: none, never refused) once that generation is over: its ranks rejoin at once
  // instead of at their wait's deadline.
  absl::Status CheckRendezvousKey(int64_t generation, const std::string& key) const;
  // A rendezvous read by a rank of `generation` waits for `key`, which the store lacks. The
  // store is not journaled: if that is the generation that was live when this coordinator
  // recovered, its ranks may have set the key before the restart, and would wait for it for
  // ever. That generation ends (a new one rendezvouses afresh) and the read is answered
  // ABORTED. OK otherwise.
  absl::Status RendezvousKeyMissing(int64_t generation, const std::string& key, absl::Time now);
  // Stream `seq` of `worker_id` dropped (its process died, or its connection did).
  void Detached(const std::string& worker_id, uint64_t seq, absl::Time now);

  // --- Client calls ---
  absl::Status Cancel(absl::Time now);
  v1::Job Job() const;  // with progress filled in
  const std::vector<v1::UpdateRecord>& updates() const { return updates_; }
  // How many records a WatchJob stream may send: those before a commit whose evaluation is
  // still running, so that watchers get that record once, with its eval_loss.
  size_t WatchableUpdates() const;
  // Rates over the last minute of the log and the ETA (coordinator/throughput.h).
  v1::Throughput Throughput(absl::Time now) const;
  std::vector<v1::WorkerInfo> Workers() const;
  // The lost worker `worker_id` registered again as `by`, maybe with another job: applied by
  // the registry, which sees every job, from `by`'s WorkerRegistered record (live and replay).
  void MarkReplaced(const std::string& worker_id, const std::string& by);

  // --- Time ---
  // Expires leases: a lost rank aborts the window in flight; a new generation forms when
  // enough workers are ready.
  void Tick(absl::Time now);
  std::optional<absl::Time> NextDeadline() const;
  // Every live worker's lease restarts at `now`: the coordinator could not hear them for a
  // while (it was down, or paused), which is not their fault.
  // The coordinator itself stalled, or held its decisions: nobody's lease, nor the time in its
  // compute phase, may count that against it.
  void RenewAllLeases(absl::Time now) {
    membership_.RenewAll(now + options_.worker_lease);
    membership_.RestartPhaseClocks(now);
  }
  // Its decisions were held for `held` (the journal could not be written): lost to storage.
  void AddStorageHold(absl::Duration held) {
    if (!terminal()) goodput_.AddStorageHold(held);
  }
  // After a replay: leases restart, for the reconnect grace (a live worker speaks again at
  // once; one that died while the coordinator was down is lost soon),
  // and the window then in flight may be completed by ranks whose BeginWindow the previous
  // coordinator answered (see CheckBeginBarrierPassed).
  void Recovered(absl::Time now);

  // --- Journal ---
  void Apply(const v1::JournalRecord& record);
  // OK when this machine, in its present state, could have emitted `record`; otherwise why
  // not. Replay refuses a journal holding such a record (a damaged or forged one) instead of
  // running a job from a state no run can reach. Checks what Apply relies on: the workers,
  // generation, window, ids and checkpoint a record names.
  absl::Status CheckFollows(const v1::JournalRecord& record) const;
  v1::JobSnapshot Snapshot() const;
  std::vector<v1::JournalRecord> TakeRecords();

  const std::string& job_id() const { return job_.job_id(); }
  bool terminal() const;
  // Bumped on every change a waiting call may care about: a record applied or a barrier
  // complete. Partial barrier progress does not bump it, so W reports cost O(W) re-polls.
  uint64_t version() const { return version_; }

 private:
  struct Attempt {  // one window of the current generation, in flight
    int64_t window_id = 0;
    absl::Time first_report;
    std::vector<std::optional<int64_t>> units;  // by rank: n_r (from BeginWindow or CompleteWindow)
    std::vector<std::optional<v1::CompleteWindowRequest>> complete;  // by rank
    // Counts kept beside the vectors so each report is O(1), not O(world size).
    int32_t units_reported = 0;
    int32_t completes_reported = 0;
    int64_t total_units = 0;  // Σ n_r reported so far
    // spec.validate: the run the ranks report (1; 2 once the coordinator asked for a re-run),
    // why it asked, and the first run's reports by rank while the second is computed.
    int32_t run = 1;
    v1::RerunCause rerun_cause = v1::RERUN_CAUSE_UNSPECIFIED;
    std::vector<std::optional<v1::CompleteWindowRequest>> first_run;
    bool has_any_report() const { return units_reported > 0; }
  };

  StepMachine(const MachineOptions& options, const v1::Job& job);

  void Emit(v1::JournalRecord record, absl::Time now);
  absl::Status CheckRunnable() const;
  // NOT_FOUND for a worker declared lost: it must register again under a new identity.
  absl::Status LostError(const std::string& worker_id) const;
  // A worker's first report of the data it loaded: the job's dataset (and its windows per
  // epoch) if it is the first, else it must match. FAILED_PRECONDITION when it does not.
  absl::Status AcceptDataset(const std::string& worker_id, const v1::DatasetInfo& d,
                             absl::Time now);
  // What a heartbeat is answered: the job's state and the worker's assignment, if any.
  v1::HeartbeatResponse HeartbeatAnswer(const std::string& worker_id) const;
  // The worker's entry, or NOT_FOUND naming it and the job.
  absl::StatusOr<const WorkerEntry*> FindRegistered(const std::string& worker_id) const;
  // The same, and NOT_FOUND (LostError) once it was declared lost.
  absl::StatusOr<const WorkerEntry*> FindLive(const std::string& worker_id) const;
  // A BeginWindow answered by the window's decision (a repeat, or a window that ended at its
  // barrier): the same answer however it is reached.
  static Answer<v1::BeginWindowResponse> DecidedAtBegin(const v1::WindowDecision& d);
  // OK iff the worker is rank `rank` of generation `generation`; ABORTED when that
  // generation is gone (with the decision, if the window was decided in it).
  absl::Status CheckMember(const std::string& worker_id, int64_t generation, int32_t rank) const;
  const v1::WindowDecision* FindDecision(int64_t generation, int64_t window_id) const;
  // CompleteWindow without the begin report riding on it (`next`), which it counts before it
  // can decide the window.
  absl::StatusOr<Answer<v1::CompleteWindowResponse>> ReportComplete(
      const v1::CompleteWindowRequest& req, absl::Time now);
  // Whether a BeginWindow riding on a CompleteWindow was counted before that window's decision
  // (or its window already ended at the barrier): only then is it answered with the decision.
  bool CountedAhead(const v1::BeginWindowRequest& next) const;
  absl::StatusOr<Attempt*> AttemptFor(int64_t window_id);
  absl::Status RecordUnits(Attempt* attempt, int32_t rank, int64_t units);
  // A CompleteWindow needs the begin barrier's N: OK once the barrier completed, or for the
  // window in flight at recovery from a rank this coordinator never saw begin it (its
  // BeginWindow was answered before the restart). FAILED_PRECONDITION otherwise.
  absl::Status CheckBeginBarrierPassed(const Attempt& attempt,
                                       const v1::CompleteWindowRequest& req) const;
  // The begin barrier of `attempt`: all ranks counted and the previous window ended.
  bool BarrierReady(const Attempt& attempt) const;
  v1::BeginWindowResponse BarrierResponse(const Attempt& attempt) const;
  // Completes the decision's record (ids, scaler, checkpoint, stop) and journals it.
  void EndWindow(v1::WindowDecision decision, absl::Time now);
  void DecideWindow(Attempt& attempt, absl::Time now);
  // spec.validate: why a first run's decision `d` is suspicious enough to compute the window
  // again, or nullopt.
  std::optional<v1::RerunCause> RerunCauseOf(const v1::WindowDecision& d) const;
  // Whether `loss` lies above mean + spike_sigma·σ of the last spike_window committed losses
  // (false until there are that many).
  bool IsSpike(double loss) const;
  // Keeps the first run's reports and asks every rank for a second run (their pending
  // reports are answered `rerun`). Not journaled: a restart in between retries the window.
  void AskRerun(Attempt& attempt, v1::RerunCause cause);
  // After the second run: the verdict (Rerun) on `d`'s record; a reproducible spike is
  // skipped under validate.skip_spikes.
  void AttributeRerun(const Attempt& attempt, v1::WindowDecision* d) const;
  void AbortInFlight(v1::WindowReason reason, absl::Time now);
  // Ends the next window at its barrier when it has nothing to train (N = 0).
  void MaybeEndEmptyWindow(absl::Time now);
  // Emits JobEnded(SUCCEEDED) once the stop condition holds and the final checkpoint is durable.
  void MaybeFinish(absl::Time now);
  void FailJob(const std::string& message, absl::Time now);
  void MaybeFormGeneration(absl::Time now);
  // Whether the members may change at this window boundary: a live generation, no evaluation
  // due, and the job not at its stop.
  bool MembersMayChangeNow() const;
  // At a window boundary of a generation smaller than workers.count, with standbys waiting:
  // ends it, so that the next one takes them. Returns whether it did.
  bool MaybeGrow(absl::Time now);
  // At a window boundary (stragglers.replace_below): drains the rank whose relative score
  // stayed below the threshold for replace_after_windows scored windows, when a standby is
  // ready to take its rank; the generation ends and the next one forms with the standby.
  void MaybeReplaceStraggler(absl::Time now);
  // At a window boundary (validate.max_suspect): drains a rank found faulty that many times,
  // when a standby can take its rank or workers.min lets the job go on without it. Returns
  // whether it did.
  bool MaybeDrainSuspect(absl::Time now);
  // Ends the generation after this window (naming `worker_id`, for `why`), journals the worker
  // drained (LOST, told to exit) for `reason`, and forms the next generation without it.
  void Drain(const std::string& worker_id, const std::string& why, const std::string& reason,
             absl::Time now);
  // A READY standby not known to be dead, whose compute thread waits for an assignment.
  bool StandbyReady() const;
  static bool Takeable(const WorkerEntry& w);  // such a standby
  int64_t DetachedSurvivors() const;           // members whose stream dropped, lease not yet ended
  // Hangs (hangs.cc): the slowest of the job's recent ended windows (none yet: nullopt) found
  // again when a window ends (slowest_recent_window_, read by every heartbeat answer), the
  // deadline of a short step of a rank's own work now, a heartbeat's phase noted, and a rank
  // stuck past its deadline while a peer waits for it fenced (lost) and the job re-formed.
  void RefreshSlowestRecentWindow();
  absl::Duration ShortStepDeadlineNow() const;
  void NotePhase(const v1::HeartbeatRequest& req, absl::Time now);
  void MaybeFenceHung(absl::Time now);
  // The worker was drained: its heartbeats are answered (with why) so that it exits.
  bool Drained(const std::string& worker_id) const;
  absl::Duration JoinGrace() const;  // spec.workers.join_grace
  // What registration tells workers: five heartbeats per lease.
  absl::Duration HeartbeatInterval() const { return options_.worker_lease / 5; }
  // Ends the current generation if `worker_id`, one of its ranks, said it waits for a later one.
  void MaybeLeaveGeneration(const std::string& worker_id, absl::Time now);
  // Journals the end of the current generation (GenerationEnded), naming the worker that left
  // it, if one did.
  void EndGeneration(const std::string& reason, const std::string& worker_id, absl::Time now);
  v1::UpdateRecord BaseRecord(int64_t window_id) const;
  int64_t EpochOf(int64_t window_id) const;
  // last_dropped_tail_ for the epochs ended so far (last_window_): after every change of it.
  void RefreshDroppedTail();
  int64_t TotalWindows() const;  // 0 = unknown
  bool StopReachedAfter(int64_t window_id, int64_t update_id) const;
  bool CheckpointingEnabled() const { return !job_.spec().checkpoint().dir().empty(); }
  // The latest durable checkpoint no rank found damaged.
  const v1::CheckpointRecord* LatestDurableCheckpoint() const;
  // ReportFailure naming the checkpoint its generation loads as damaged: ends the generation.
  absl::Status CheckpointDamaged(const v1::ReportFailureRequest& req, absl::Time now);
  std::optional<int64_t> PendingCheckpointFor(int64_t update_id) const;

  void ApplyWindowEnded(const v1::WindowEnded& ended);
  void ApplyEvalEnded(const v1::EvalEnded& ended);
  bool EvalEnabled() const { return job_.spec().has_eval(); }
  void ApplyGenerationFormed(const v1::GenerationFormed& formed, int64_t time_ms);

  MachineOptions options_;
  v1::Job job_;  // state, message, spec, times; progress is computed in Job()
  LossScalerConfig scaler_config_;
  LossScaler scaler_;
  Membership membership_;

  // Ids (docs/design.md): last ended window, committed updates, scheduler steps, checkpoints.
  int64_t last_window_ = 0;
  int64_t update_id_ = 0;
  int64_t scheduler_step_ = 0;
  int64_t checkpoint_id_ = 0;       // latest assigned; 0 = the initial weights
  int64_t next_checkpoint_id_ = 1;  // never reused, even after a rollback
  int64_t cumulative_tokens_ = 0;
  int64_t micro_step_id_ = 0;   // of the last committed or skipped window
  int64_t last_commit_ms_ = 0;  // end_time_ms of the last commit in the log (0 = none)
  int64_t consecutive_desyncs_ = 0;
  int64_t rollbacks_ = 0;  // generations formed with rolled_back
  int64_t hangs_ = 0;      // workers lost as hung (WorkerLost.hung_phase)
  // Ephemeral: checkpoints rank 0 reported it could not write, and the latest one's error.
  int64_t checkpoint_failures_ = 0;
  std::string last_checkpoint_failure_;
  std::string last_hang_;  // the latest one's reason
  // Ephemeral: since when no generation could form with workers.count workers (reset when one
  // forms); the join grace runs from it. The latest Tick's time, for NextDeadline.
  std::optional<absl::Time> short_since_;
  std::optional<absl::Time> ticked_at_;
  std::map<int64_t, v1::CheckpointRecord> checkpoints_;  // by id

  std::optional<v1::DatasetInfo> dataset_;  // set once a worker's report was accepted
  int64_t windows_per_epoch_ = 0;
  // The workers' data plan for this dataset: it alone decides window sizes and dropped
  // tails. Non-null iff dataset_ is set.
  std::unique_ptr<const WindowPlanner> planner_;
  // What the latest ended epoch left out under batch.tail drop (derived from last_window_).
  std::optional<v1::DroppedTail> last_dropped_tail_;

  std::vector<v1::UpdateRecord> updates_;
  std::optional<absl::Duration> slowest_recent_window_;  // RefreshSlowestRecentWindow
  struct OutcomeCounts {  // derived from updates_, kept so Job() is O(1)
    int64_t committed = 0, skipped = 0, aborted = 0;
    int64_t reruns = 0, reruns_transient = 0;
    double last_loss = 0.0;
    void Add(const v1::UpdateRecord& r);
  } counts_;
  std::vector<v1::WindowDecision> recent_decisions_;  // oldest first

  // Held-out evaluation. Set iff a decision asked to evaluate this update and its EvalEnded
  // is not journaled yet: the next window's begin barrier and the job's end wait for it.
  std::optional<int64_t> eval_due_;
  std::optional<v1::EvalEnded> last_eval_;  // the latest recorded evaluation
  struct EvalAttempt {  // reports of the current generation for eval_due_ (not journaled)
    int64_t generation = 0;
    std::vector<std::optional<v1::ReportEvalRequest>> reports;  // by rank
    int32_t reported = 0;
  };
  std::optional<EvalAttempt> eval_attempt_;

  RankScores scores_;      // ephemeral: from the ranks' phase reports, not journaled
  GoodputLedger goodput_;  // derived from updates_ (storage holds: ephemeral)

  std::map<int64_t, Attempt> attempts_;  // windows of the current generation in flight
  // Ephemeral, set by Recovered: the window (and its generation) in flight at recovery, whose
  // begin barrier a previous coordinator may have answered. 0 = none (a fresh machine).
  int64_t recovered_window_ = 0;
  int64_t recovered_generation_ = 0;
  std::vector<v1::JournalRecord> outbox_;
  uint64_t version_ = 0;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_STEP_MACHINE_H_
