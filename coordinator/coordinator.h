// Coordinator: the thread-safe shell around the pure JobRegistry. It serialises calls
// under one lock, journals every record the machines produce, and answers a call only
// once the state it reveals is durable (group commit on a dedicated syncer thread, so no
// RPC thread waits for a record's fsync; Tick serialises a snapshot under the lock, and the
// journal writes and fsyncs it on its own thread while calls go on). Calls that wait on a
// barrier or a store key are kept as pollers and asked again whenever their job changes.
//
// When the journal cannot be written (a full disk, EIO, a failed fsync) the process stays:
// it holds every decision (calls that would change a job are answered UNAVAILABLE with the
// reason, reads are served, no lease expires) and each Tick tries to resume by writing the
// whole state as a snapshot beside a fresh log (Journal::Resume), so that nothing is lost,
// repeated, or trusted to the file that failed.
//
// The gRPC services (worker_service.h, job_service.h) are thin adapters over this class;
// the tests drive it directly with a FakeClock.
#ifndef TRAINSTEP_COORDINATOR_COORDINATOR_H_
#define TRAINSTEP_COORDINATOR_COORDINATOR_H_

#include <atomic>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/env.h"
#include "coordinator/call.h"
#include "coordinator/job_registry.h"
#include "coordinator/journal.h"
#include "coordinator/limits.h"
#include "coordinator/metrics.h"
#include "coordinator/rpc_table.h"
#include "coordinator/store/kv_store.h"

namespace trainstep {

// What a WatchJob stream has seen so far.
struct WatchCursor {
  size_t next_update = 0;      // index into the job's per-update log
  std::string last_job_state;  // ComparableBytes of the Job last sent, "" = none
};

struct WatchBatch {
  std::optional<v1::Job> job;  // set when the job changed since the cursor
  std::vector<v1::UpdateRecord> updates;
  WatchCursor cursor;  // to pass to the next WatchJob call
  bool end = false;    // the job ended and everything was sent
};

struct CoordinatorOptions {
  std::string state_dir;  // the journal's directory
  MachineOptions machine;
  Limits limits;
  uint64_t snapshot_every_records = 10000;
  Clock* clock = RealClock::Get();
  Env* env = Env::Default();
  CoordinatorMetrics* metrics = nullptr;  // may be null
};

// Rebuilds `registry` (fresh) from what Journal::Open recovered: the snapshot, then every
// record, then Recovered(now). DATA_LOSS naming `state_dir` and the record if a checksummed
// snapshot or record does not parse, or a record cannot follow those before it
// (JobRegistry::Apply): the coordinator then refuses to start rather than run from a state no
// run reaches.
absl::Status ReplayJournal(const RecoveredJournal& recovered, const std::string& state_dir,
                           absl::Time now, JobRegistry* registry);

// What an Attach stream compares to decide whether a worker's place changed: the place without
// its state version (which grows with every change of the job).
std::string PlaceKey(v1::HeartbeatResponse place);

class Coordinator {
 public:
  // Opens (or creates) the journal in options.state_dir and replays it.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Open(CoordinatorOptions options);
  ~Coordinator();

  const std::vector<std::string>& recovery_warnings() const { return recovery_warnings_; }
  // Random, chosen when this process opened the journal (HeartbeatResponse.coordinator_id).
  const std::string& id() const { return id_; }

  // --- The unary RPCs (rpc_table.h) ---
  // Each: `done` gets the answer once the state it reveals is durable. A call that waits (a
  // barrier, a store key) is kept until it can be answered, its handle is claimed, or
  // Shutdown.
#define TRAINSTEP_DECLARE_CALL(Method, Req, Resp, access) \
  void Method(const v1::Req& req, Done<v1::Resp> done, CallContext ctx = {});
  TRAINSTEP_JOB_SERVICE_UNARY(TRAINSTEP_DECLARE_CALL)
  TRAINSTEP_WORKER_SERVICE_UNARY(TRAINSTEP_DECLARE_CALL)
#undef TRAINSTEP_DECLARE_CALL

  // --- The streams ---
  // One poll of a WatchJob stream: answers as soon as there is something new after `cursor`
  // (or the job ended).
  void WatchJob(const std::string& job_id, const WatchCursor& cursor, Done<WatchBatch> done,
                std::shared_ptr<CallHandle> handle);
  // One poll of Attach stream `seq` (the caller numbers streams, unique in this process): the
  // worker's place, answered once it differs from `last_sent` (serialized; "" = none sent).
  void Attach(const v1::AttachRequest& req, uint64_t seq, const std::string& last_sent,
              Done<v1::HeartbeatResponse> done, std::shared_ptr<CallHandle> handle);
  // Stream `seq` dropped: the worker's lease ends after the machine's detach grace.
  void Detached(const v1::AttachRequest& req, uint64_t seq);

  // --- Driver ---
  // Expires leases, drops abandoned waiters, snapshots the journal when due. Returns the
  // time it next needs to run.
  absl::Time Tick();
  // The driver's sleep between ticks: until `deadline` (of options.clock), or until a lease was
  // cut short (Detached) or WakeDriver was called.
  void WaitForTick(absl::Time deadline);
  void WakeDriver();
  // Every waiting call and every later call is answered UNAVAILABLE; the journal is
  // flushed. Idempotent.
  void Shutdown();
  // False while the journal cannot be written and decisions are held (the reads go on).
  bool deciding() const { return !journal_broken_.load(); }

 private:
  // Runs under mu_: the machine call. Returns a ready answer or "ask again later".
  template <typename Resp>
  using Poll = std::function<absl::StatusOr<Answer<Resp>>(absl::Time now)>;
  // A call's answer, to deliver once the state it reveals is durable.
  using Completion = std::function<void(const absl::Status& durability)>;

  struct Waiter {
    std::string job_id;
    std::shared_ptr<CallHandle> handle;
    // Re-runs the call; returns the completion if it is now answered.
    std::function<std::optional<Completion>(absl::Time now)> poll;
  };

  explicit Coordinator(CoordinatorOptions options);

  // The body of each unary RPC, run under mu_ (job_calls.cc, worker_calls.cc,
  // store/store_calls.cc): a ready answer, or "ask again when the job changes".
#define TRAINSTEP_DECLARE_ANSWER(Method, Req, Resp, access)                                   \
  absl::StatusOr<Answer<v1::Resp>> Answer##Method(const v1::Req& req, const CallContext& ctx, \
                                                  absl::Time now)                             \
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TRAINSTEP_JOB_SERVICE_UNARY(TRAINSTEP_DECLARE_ANSWER)
  TRAINSTEP_WORKER_SERVICE_UNARY(TRAINSTEP_DECLARE_ANSWER)
#undef TRAINSTEP_DECLARE_ANSWER
  // The streams' polls.
  absl::StatusOr<Answer<WatchBatch>> NextWatchBatch(const std::string& job_id,
                                                    const WatchCursor& cursor, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Answer<v1::HeartbeatResponse>> NextPlace(const v1::AttachRequest& req,
                                                          uint64_t seq,
                                                          const std::string& last_sent,
                                                          absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  template <typename Req, typename Resp>
  using Answerer = absl::StatusOr<Answer<Resp>> (Coordinator::*)(const Req&, const CallContext&,
                                                                 absl::Time);
  // A unary RPC: notes when it arrived, then Runs `answer` under the job the request names.
  template <typename Req, typename Resp>
  void Serve(Answerer<Req, Resp> answer, Access access, const Req& req, Done<Resp> done,
             CallContext ctx);

  // The one path every call takes: poll under the lock, keep it waiting if not ready,
  // journal what changed, re-poll the job's other waiters, deliver after sync. A call that
  // `decides` (may change a job) is answered UNAVAILABLE at once while decisions are held.
  template <typename Resp>
  void Run(const std::string& job_id, bool decides, Poll<Resp> poll, Done<Resp> done,
           std::shared_ptr<CallHandle> handle);
  // The RPC layer claims the call inside `done`; the core only uses handles to drop
  // waiters whose call was abandoned.
  template <typename Resp>
  static Completion Complete(absl::StatusOr<Answer<Resp>> answer, Done<Resp> done);
  // Journals the registry's new records and re-polls affected waiters into `out`.
  // Returns the sequence number the answers must wait for.
  uint64_t CommitLocked(absl::Time now, std::vector<Completion>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends the registry's new records to the journal and tells the metrics.
  void JournalNewRecordsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-polls the waiters of every job whose machine or store changed since they were last
  // polled; false when none had.
  bool RepollChangedLocked(absl::Time now, std::vector<Completion>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RepollLocked(const std::string& job_id, absl::Time now, std::vector<Completion>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Delivers after the journal holds `seq` (inline when it already does).
  void Deliver(uint64_t seq, std::vector<Completion> completions);
  void SyncerLoop();
  // The journal cannot be written: decisions are held until TryResume mends it, and every
  // answer meanwhile carries `status`. The first cause of an episode wins; any thread.
  void JournalFailed(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Why decisions are held (OK while they are not).
  absl::Status JournalStatus() const;
  // Writes the whole state beside a fresh log (Journal::Resume); on success every lease
  // restarts and decisions go on. Returns whether they do.
  bool TryResume() ABSL_LOCKS_EXCLUDED(mu_);
  KvStore& StoreOf(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The store of a job the registry knows; NOT_FOUND for any other.
  absl::StatusOr<KvStore*> KnownJobStore(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A barrier call: `call` on the job's machine, counted as refused (by its code) or, once
  // answered, as having waited since `arrived` in `phase` (null: no wait is timed).
  template <typename Resp, typename Call>
  absl::StatusOr<Answer<Resp>> ObservedBarrier(const char* rpc, const char* phase,
                                               const std::string& job_id, absl::Time arrived,
                                               absl::Time now, Call call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CoordinatorOptions options_;
  std::unique_ptr<Journal> journal_;
  std::vector<std::string> recovery_warnings_;
  const std::string id_;

  mutable absl::Mutex mu_;
  JobRegistry registry_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, KvStore> stores_ ABSL_GUARDED_BY(mu_);
  std::list<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  // (machine version, store version) of each job when its waiters were last polled.
  std::map<std::string, std::pair<uint64_t, uint64_t>> seen_versions_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar tick_cv_;  // signalled when tick_due_ is set
  bool tick_due_ ABSL_GUARDED_BY(mu_) = false;

  // The syncer: completions waiting for their records to be fsynced.
  absl::Mutex sync_mu_;
  absl::CondVar sync_cv_;  // to_sync_ grew, or stop_syncer_
  std::deque<std::pair<uint64_t, std::vector<Completion>>> to_sync_ ABSL_GUARDED_BY(sync_mu_);
  bool stop_syncer_ ABSL_GUARDED_BY(sync_mu_) = false;
  std::atomic<uint64_t> durable_seq_{0};
  // Set by JournalFailed, cleared by TryResume; journal_status_ says why.
  std::atomic<bool> journal_broken_{false};
  mutable absl::Mutex journal_status_mu_;
  absl::Status journal_status_ ABSL_GUARDED_BY(journal_status_mu_);
  absl::Time held_since_ ABSL_GUARDED_BY(journal_status_mu_);
  std::thread syncer_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_COORDINATOR_H_
