#include "coordinator/coordinator.h"

#include <algorithm>
#include <set>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/request_job_id.h"

namespace trainstep {
namespace {

// The driver wakes at least this often to drop abandoned waiters and snapshot.
constexpr absl::Duration kMaxTickInterval = absl::Seconds(1);
// While decisions are held, how often the journal is tried again: each try serialises the
// state (memory work) and fails at once on a disk still full, and training waits meanwhile.
constexpr absl::Duration kResumeInterval = absl::Milliseconds(200);

absl::Status ShuttingDown() {
  return absl::UnavailableError("the coordinator is shutting down; retry against its successor");
}

// The answer to a call that would change a job while the journal cannot be written.
absl::Status Held(const absl::Status& cause) {
  return absl::UnavailableError(
      absl::StrCat("the coordinator cannot write its journal, so it holds every decision until "
                   "it can (it retries by itself; retry this call): ",
                   cause.message()));
}

}  // namespace

absl::Status ReplayJournal(const RecoveredJournal& recovered, const std::string& state_dir,
                           absl::Time now, JobRegistry* registry) {
  if (recovered.snapshot.has_value()) {
    v1::CoordinatorSnapshot snapshot;
    if (!snapshot.ParseFromString(*recovered.snapshot)) {
      return absl::DataLossError(absl::StrCat("the newest snapshot in ", state_dir,
                                              " passed its checksum but is not a snapshot"));
    }
    registry->Restore(snapshot, now);
  }
  for (size_t i = 0; i < recovered.records.size(); ++i) {
    v1::JournalRecord record;
    if (!record.ParseFromString(recovered.records[i])) {
      return absl::DataLossError(absl::StrCat("journal record ", i + 1, " in ", state_dir,
                                              " passed its checksum but is not a record"));
    }
    const absl::Status applied = registry->Apply(record);
    if (!applied.ok()) {
      return absl::DataLossError(
          absl::StrCat("journal record ", i + 1, " in ", state_dir,
                       " cannot follow the records before it: ", applied.message()));
    }
  }
  registry->Recovered(now);
  return absl::OkStatus();
}

// --- Lifecycle ---

Coordinator::Coordinator(CoordinatorOptions options)
    : options_(std::move(options)),
      id_(absl::StrFormat("%016x", absl::Uniform<uint64_t>(absl::BitGen()))),
      registry_(options_.machine, options_.limits) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(CoordinatorOptions options) {
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(options)));
  JournalOptions jopts;
  CoordinatorMetrics* metrics = c->options_.metrics;
  if (metrics != nullptr) jopts.on_fsync = [metrics](double s) { metrics->OnJournalFsync(s); };
  // Snapshots are written on the journal's thread; this hears how each went. Takes no mu_.
  jopts.on_snapshot = [raw = c.get()](const absl::Status& s, bool journal_broken, double) {
    if (s.ok()) return;
    if (!journal_broken) {
      // The log is intact and the next Tick tries again.
      LogWarning(absl::StrCat("journal snapshot failed (the log is intact): ", s.message()));
      return;
    }
    LogError(absl::StrCat("journal snapshot failed: ", s.message()));
    raw->JournalFailed(s);  // Hold decisions now, not at the next record's Sync.
  };
  RecoveredJournal recovered;
  ASSIGN_OR_RETURN(c->journal_,
                   Journal::Open(c->options_.env, c->options_.state_dir, jopts, &recovered));
  c->recovery_warnings_ = recovered.warnings;
  const absl::Time now = c->options_.clock->Now();
  {
    absl::MutexLock lock(&c->mu_);
    RETURN_IF_ERROR(ReplayJournal(recovered, c->options_.state_dir, now, &c->registry_));
    if (metrics != nullptr) {
      metrics->OnJobStates(c->registry_.List());
      for (const v1::Job& job : c->registry_.List()) {
        metrics->OnWorkers(job.job_id(), c->registry_.ListWorkers(job.job_id()));
      }
    }
  }
  c->syncer_ = std::thread([raw = c.get()] { raw->SyncerLoop(); });
  return c;
}

Coordinator::~Coordinator() {
  Shutdown();
  {
    absl::MutexLock lock(&sync_mu_);
    stop_syncer_ = true;
    sync_cv_.Signal();
  }
  if (syncer_.joinable()) syncer_.join();
  // Waits for a snapshot being written, while on_snapshot may still use this object.
  journal_.reset();
}

void Coordinator::Shutdown() {
  std::vector<Completion> completions;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    for (Waiter& w : waiters_) {
      std::optional<Completion> c = w.poll(absl::InfiniteFuture());  // answers UNAVAILABLE
      if (c.has_value()) completions.push_back(std::move(*c));
    }
    waiters_.clear();
    // A coordinator whose Open failed has no journal (and nothing to answer or flush).
    if (journal_ == nullptr) return;
    seq = journal_->last_appended();
  }
  // Answer now, not via the syncer: the server cancels whatever is unanswered next.
  absl::Status durable = deciding() ? journal_->Sync(seq) : JournalStatus();
  for (Completion& c : completions) c(durable);
}

// --- When the journal cannot be written ---

void Coordinator::JournalFailed(const absl::Status& status) {
  // A failure of a Sync that began before the journal was mended is not a new one.
  if (journal_->broken().ok()) return;
  {
    absl::MutexLock lock(&journal_status_mu_);
    if (journal_broken_.load()) return;
    journal_status_ = status;
    held_since_ = options_.clock->Now();
    journal_broken_.store(true);
  }
  LogError(
      absl::StrCat("the journal cannot be written; every decision is held until it can "
                   "(reads are still served, nothing unacknowledged was answered): ",
                   status.message()));
  if (options_.metrics != nullptr) options_.metrics->OnJournalWritable(false);
}

absl::Status Coordinator::JournalStatus() const {
  absl::MutexLock lock(&journal_status_mu_);
  return journal_status_;
}

bool Coordinator::TryResume() {
  std::string snapshot;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return false;
    // Records made since the failure went to the broken journal, which wrote none of them;
    // the snapshot holds their effect. Records made after it wait for the fresh log.
    JournalNewRecordsLocked();
    snapshot = registry_.Snapshot().SerializeAsString();
  }
  if (!journal_->Resume(snapshot).ok()) return false;  // still failing: the next Tick retries
  absl::Duration held;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    // Heartbeats were refused meanwhile: nobody loses a lease for it.
    registry_.RenewAllLeases(now);
    durable_seq_.store(journal_->last_appended());
    absl::MutexLock status_lock(&journal_status_mu_);
    held = now - held_since_;
    registry_.AddStorageHold(held);
    journal_status_ = absl::OkStatus();
    journal_broken_.store(false);
  }
  LogInfo(
      absl::StrCat("the journal can be written again: the state is in a fresh snapshot and "
                   "log; decisions go on after being held for ",
                   absl::FormatDuration(held)));
  if (options_.metrics != nullptr) options_.metrics->OnJournalWritable(true);
  return true;
}

// --- The call path ---

template <typename Resp>
Coordinator::Completion Coordinator::Complete(absl::StatusOr<Answer<Resp>> answer,
                                              Done<Resp> done) {
  return Completion(
      [answer = std::move(answer), done = std::move(done)](const absl::Status& durability) mutable {
        if (!durability.ok()) {
          done(Held(durability));
          return;
        }
        if (!answer.ok()) {
          done(answer.status());
          return;
        }
        done(std::move(answer->response));
      });
}

template <typename Resp>
void Coordinator::Run(const std::string& job_id, bool decides, Poll<Resp> poll, Done<Resp> done,
                      std::shared_ptr<CallHandle> handle) {
  std::vector<Completion> completions;
  uint64_t seq = 0;
  bool held = false;
  {
    absl::MutexLock lock(&mu_);
    held = !deciding();
    if (shutting_down_) {
      completions.push_back(Complete<Resp>(ShuttingDown(), std::move(done)));
    } else if (held && decides) {
      completions.push_back(Complete<Resp>(Held(JournalStatus()), std::move(done)));
    } else {
      const absl::Time now = options_.clock->Now();
      // After Shutdown, a waiter is polled once more with an infinite `now`: it answers
      // UNAVAILABLE.
      auto waiter_poll = [poll = std::move(poll),
                          done = std::move(done)](absl::Time at) -> std::optional<Completion> {
        if (at == absl::InfiniteFuture()) return Complete<Resp>(ShuttingDown(), done);
        absl::StatusOr<Answer<Resp>> answer = poll(at);
        if (answer.ok() && !answer->ready) return std::nullopt;
        return Complete<Resp>(std::move(answer), done);
      };
      std::optional<Completion> first = waiter_poll(now);
      if (first.has_value()) {
        completions.push_back(std::move(*first));
      } else {
        waiters_.push_back(Waiter{job_id, handle, std::move(waiter_poll)});
      }
      // Held, a read is answered from memory, which may be ahead of the disk until the
      // journal is mended; nothing is journaled or re-polled meanwhile (TryResume snapshots
      // the state).
      if (!held) seq = CommitLocked(now, &completions);
    }
  }
  if (held) {
    for (Completion& c : completions) c(absl::OkStatus());
    return;
  }
  Deliver(seq, std::move(completions));
}

uint64_t Coordinator::CommitLocked(absl::Time now, std::vector<Completion>* out) {
  // Re-polling may itself change a machine (an empty window ends at its barrier), so repeat
  // until nothing moves; every round's records are journaled before the answers that reveal
  // them are delivered. Each round ends a waiter or finds nothing changed, so this settles
  // in a few rounds; the cap only stops a bug from spinning under the lock.
  constexpr int kMaxRounds = 64;
  JournalNewRecordsLocked();
  for (int round = 1; RepollChangedLocked(now, out); ++round) {
    JournalNewRecordsLocked();
    if (round == kMaxRounds) {
      LogWarning(absl::StrCat("waiters still moving after ", kMaxRounds,
                              " rounds; the rest are polled at the next change"));
      break;
    }
  }
  return journal_->last_appended();
}

void Coordinator::JournalNewRecordsLocked() {
  bool job_states_changed = false;
  for (v1::JournalRecord& record : registry_.TakeRecords()) {
    journal_->Append(record.SerializeAsString());
    if (record.has_generation_formed()) {
      const v1::GenerationFormed& f = record.generation_formed();
      StoreOf(f.job_id()).KeepOnly(f.assignment().store_prefix());
    }
    if (record.has_job_ended()) stores_.erase(record.job_ended().job_id());
    if (record.has_job_forgotten()) {
      LogInfo(absl::StrCat("forgot finished job ", record.job_forgotten().job_id(), " (--max-jobs ",
                           options_.limits.max_jobs, ")"));
      stores_.erase(record.job_forgotten().job_id());
      seen_versions_.erase(record.job_forgotten().job_id());
    }
    job_states_changed |= record.has_job_submitted() || record.has_job_ended() ||
                          record.has_generation_formed() || record.has_job_forgotten();
    if (options_.metrics != nullptr) {
      const std::string job_id = JobIdOf(record);
      absl::StatusOr<v1::Job> job = registry_.Get(job_id);
      if (job.ok()) options_.metrics->OnRecord(record, *job);
      if (record.has_worker_registered() || record.has_worker_lost() ||
          record.has_generation_formed() || record.has_dataset_accepted()) {
        options_.metrics->OnWorkers(job_id, registry_.ListWorkers(job_id));
      }
    }
  }
  if (job_states_changed && options_.metrics != nullptr) {
    options_.metrics->OnJobStates(registry_.List());
  }
}

bool Coordinator::RepollChangedLocked(absl::Time now, std::vector<Completion>* out) {
  std::set<std::string> waiting_jobs;
  for (const Waiter& w : waiters_) waiting_jobs.insert(w.job_id);
  bool moved = false;
  for (const std::string& job_id : waiting_jobs) {
    absl::StatusOr<StepMachine*> m = registry_.Machine(job_id);
    const std::pair<uint64_t, uint64_t> version = {m.ok() ? (*m)->version() : 0,
                                                   StoreOf(job_id).version()};
    std::pair<uint64_t, uint64_t>& seen = seen_versions_[job_id];
    if (version == seen) continue;
    seen = version;
    moved = true;
    RepollLocked(job_id, now, out);
  }
  return moved;
}

void Coordinator::RepollLocked(const std::string& job_id, absl::Time now,
                               std::vector<Completion>* out) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->handle != nullptr && it->handle->claimed()) {
      it = waiters_.erase(it);  // the RPC ended (cancelled, deadline)
      continue;
    }
    if (it->job_id != job_id) {
      ++it;
      continue;
    }
    std::optional<Completion> c = it->poll(now);
    if (c.has_value()) {
      out->push_back(std::move(*c));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

void Coordinator::Deliver(uint64_t seq, std::vector<Completion> completions) {
  if (completions.empty()) return;
  if (!deciding()) {
    const absl::Status status = JournalStatus();
    for (Completion& c : completions) c(status);
    return;
  }
  if (seq <= durable_seq_.load()) {
    for (Completion& c : completions) c(absl::OkStatus());
    return;
  }
  absl::MutexLock lock(&sync_mu_);
  to_sync_.emplace_back(seq, std::move(completions));
  sync_cv_.Signal();
}

void Coordinator::SyncerLoop() {
  while (true) {
    std::deque<std::pair<uint64_t, std::vector<Completion>>> batch;
    {
      absl::MutexLock lock(&sync_mu_);
      // A CondVar loop rather than Mutex::Await: the condition is then read by this code
      // with the lock held, where ThreadSanitizer sees the lock (tsan_absl_shim.cc).
      while (to_sync_.empty() && !stop_syncer_) sync_cv_.Wait(&sync_mu_);
      if (to_sync_.empty()) return;  // stopping, and nothing left to flush
      batch.swap(to_sync_);
    }
    uint64_t max_seq = 0;
    for (const auto& [seq, completions] : batch) max_seq = std::max(max_seq, seq);
    absl::Status status = deciding() ? journal_->Sync(max_seq) : JournalStatus();
    if (status.ok()) {
      uint64_t prev = durable_seq_.load();
      while (prev < max_seq && !durable_seq_.compare_exchange_weak(prev, max_seq)) {
      }
    } else {
      JournalFailed(status);
    }
    for (auto& [seq, completions] : batch) {
      for (Completion& c : completions) c(status);
    }
  }
}

KvStore& Coordinator::StoreOf(const std::string& job_id) {
  const Limits& limits = options_.limits;
  return stores_.try_emplace(job_id, limits.store_max_keys, limits.store_max_bytes).first->second;
}

absl::StatusOr<KvStore*> Coordinator::KnownJobStore(const std::string& job_id) {
  RETURN_IF_ERROR(registry_.Machine(job_id).status());
  return &StoreOf(job_id);
}

absl::Time Coordinator::Tick() {
  if (!deciding() && !TryResume()) {
    // Held: no lease expires and nothing is journaled; abandoned calls still go.
    absl::MutexLock lock(&mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      it = (it->handle != nullptr && it->handle->claimed()) ? waiters_.erase(it) : std::next(it);
    }
    return options_.clock->Now() + kResumeInterval;
  }
  std::vector<Completion> completions;
  uint64_t seq = 0;
  absl::Time next;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    next = now + kMaxTickInterval;
    if (shutting_down_) return next;
    if (std::optional<JobRegistry::Stall> stall = registry_.Tick(now)) {
      if (stall->renewed) {
        LogWarning(
            absl::StrCat("the coordinator did not run for ", absl::FormatDuration(stall->gap),
                         " (paused, frozen or starved?): every worker's lease restarts now, "
                         "so that heartbeats queued meanwhile are read before anyone expires"));
      } else if (stall->consecutive == JobRegistry::kMaxRenewingStalls + 1) {
        // Once per run of late ticks: the decision, not every tick of it.
        LogWarning(absl::StrCat(
            "the coordinator's ticks came late ", stall->consecutive, " times in a row (this one ",
            absl::FormatDuration(stall->gap), " after the previous): it runs but ticks late, ",
            "so leases expire as usual again until a tick is on time (renewing them on every ",
            "late tick would keep a dead worker for ever)"));
      }
    }
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      it = (it->handle != nullptr && it->handle->claimed()) ? waiters_.erase(it) : std::next(it);
    }
    seq = CommitLocked(now, &completions);
    if (deciding() && !journal_->snapshot_in_progress() &&
        journal_->records_since_snapshot() >= options_.snapshot_every_records) {
      // Serialising is memory work; the journal writes the snapshot on its own thread and
      // reports the outcome to on_snapshot (Open). Not started: a broken journal (the next
      // Sync stops us) or a snapshot too big to frame, which says so.
      absl::Status s = journal_->StartSnapshot(registry_.Snapshot().SerializeAsString());
      if (!s.ok() && deciding()) {
        LogWarning(absl::StrCat("journal snapshot not started: ", s.message()));
      }
    }
    std::optional<absl::Time> deadline = registry_.NextDeadline();
    if (deadline.has_value()) next = std::min(next, *deadline);
  }
  Deliver(seq, std::move(completions));
  return next;
}

void Coordinator::WaitForTick(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const absl::Time real_deadline = absl::Now() + (deadline - options_.clock->Now());
  while (!tick_due_) {
    if (tick_cv_.WaitWithDeadline(&mu_, real_deadline)) break;  // the deadline passed
  }
  tick_due_ = false;
}

void Coordinator::WakeDriver() {
  absl::MutexLock lock(&mu_);
  tick_due_ = true;
  tick_cv_.SignalAll();
}

// --- The RPCs ---

template <typename Req, typename Resp>
void Coordinator::Serve(Answerer<Req, Resp> answer, Access access, const Req& req, Done<Resp> done,
                        CallContext ctx) {
  ctx.arrived = options_.clock->Now();
  std::shared_ptr<CallHandle> handle = ctx.handle;
  Run<Resp>(
      JobIdOfRequest(req), /*decides=*/access != Access::kView,
      [this, answer, req, ctx = std::move(ctx)](absl::Time now) -> absl::StatusOr<Answer<Resp>> {
        return (this->*answer)(req, ctx, now);
      },
      std::move(done), std::move(handle));
}

#define TRAINSTEP_DEFINE_CALL(Method, Req, Resp, access)                                         \
  void Coordinator::Method(const v1::Req& req, Done<v1::Resp> done, CallContext ctx) {           \
    Serve<v1::Req, v1::Resp>(&Coordinator::Answer##Method, Access::access, req, std::move(done), \
                             std::move(ctx));                                                    \
  }
TRAINSTEP_JOB_SERVICE_UNARY(TRAINSTEP_DEFINE_CALL)
TRAINSTEP_WORKER_SERVICE_UNARY(TRAINSTEP_DEFINE_CALL)
#undef TRAINSTEP_DEFINE_CALL

void Coordinator::WatchJob(const std::string& job_id, const WatchCursor& cursor,
                           Done<WatchBatch> done, std::shared_ptr<CallHandle> handle) {
  Run<WatchBatch>(
      job_id, /*decides=*/false,
      [this, job_id, cursor](absl::Time now) -> absl::StatusOr<Answer<WatchBatch>> {
        return NextWatchBatch(job_id, cursor, now);
      },
      std::move(done), std::move(handle));
}

void Coordinator::Attach(const v1::AttachRequest& req, uint64_t seq, const std::string& last_sent,
                         Done<v1::HeartbeatResponse> done, std::shared_ptr<CallHandle> handle) {
  // Keeps a worker's stream up while decisions are held: its place changes nothing.
  Run<v1::HeartbeatResponse>(
      req.job_id(), /*decides=*/false,
      [this, req, seq, last_sent](absl::Time now) -> absl::StatusOr<Answer<v1::HeartbeatResponse>> {
        return NextPlace(req, seq, last_sent, now);
      },
      std::move(done), std::move(handle));
}

void Coordinator::Detached(const v1::AttachRequest& req, uint64_t seq) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;  // the streams end because this process stops, not the workers
  absl::StatusOr<StepMachine*> m = registry_.Machine(req.job_id());
  if (!m.ok()) return;
  (*m)->Detached(req.worker_id(), seq, options_.clock->Now());
  tick_due_ = true;  // the lease now ends sooner than the driver planned to wake
  tick_cv_.SignalAll();
}

}  // namespace trainstep
