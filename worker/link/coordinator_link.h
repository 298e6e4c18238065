// CoordinatorLink: a worker's membership conversation with the coordinator, apart from its
// training. It registers (and registers again under a new identity after the coordinator
// declared it lost), runs the worker's one heartbeat source, and publishes what the answers
// say as a snapshot that the training thread's waits read: whether the job is over, whether
// this process was refused, which generation it is in. Classify() is the one place that
// decides what a failed call means. No LibTorch: the flow is unit-tested with a fake client
// and a fake clock (tests/unit/worker/link/coordinator_link_test.cc).
#ifndef TRAINSTEP_WORKER_LINK_COORDINATOR_LINK_H_
#define TRAINSTEP_WORKER_LINK_COORDINATOR_LINK_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainstep/v1/worker_service.pb.h"
#include "worker/link/compute_phase.h"
#include "worker/link/worker_client.h"

namespace trainstep {

// What a failed call to the coordinator or to the collective means for this worker.
enum class ErrorMeaning {
  // The generation or this identity is gone, or a peer or the coordinator is unreachable for
  // now (UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED, NOT_FOUND: declared lost): nothing of the
  // window is kept, and the worker waits for its next assignment.
  kRejoin,
  // Anything else is this worker's own failure: the job fails with its message.
  kFatal,
};
ErrorMeaning Classify(const absl::Status& status);

// The latest heartbeat answer, as the waits read it.
struct HeartbeatSnapshot {
  uint64_t version = 0;   // +1 with every answer, refusal or failed heartbeat
  bool job_over = false;  // the job reached a terminal state
  bool refused = false;   // this process cannot take part (its dataset, a failed re-register)
  // Why the coordinator drained this worker (a straggler a standby replaces); "" if it did not.
  // Final like refused: the worker exits 0 and does not register again.
  std::string drained;
  v1::JobState job_state = v1::JOB_STATE_UNSPECIFIED;
  std::string job_message;  // the job's, or why this process was refused
  // The generation the coordinator has this worker in: -1 none (it broke, or re-formed
  // without us), 0 not told yet.
  int64_t current_generation = 0;
  std::optional<v1::Assignment> assignment;
  std::string assignment_worker_id;  // the identity the assignment was given to
  bool dataset_accepted = false;
  // The coordinator process that answered last (HeartbeatResponse.coordinator_id), and its
  // job state version then: answers older than that are not applied.
  std::string coordinator_id;
  uint64_t state_version = 0;
  absl::Status last_error;  // of the latest heartbeat; OK when it was answered
};

struct LinkOptions {
  std::string job_id;       // empty: the oldest job that needs workers
  std::string name;         // for humans
  std::string host;         // where peers reach this worker's collective
  std::string coordinator;  // its address, for messages
  const Clock* clock = RealClock::Get();
  // The heartbeat's pace while the training thread waits on it (an assignment, the job's
  // end); otherwise the coordinator's heartbeat interval.
  absl::Duration urgent_every = absl::Milliseconds(50);
  // The pace after a failed heartbeat, and the longest pause before opening Attach again: a
  // restarted coordinator hears from this worker within a fraction of a second.
  absl::Duration retry_every = absl::Milliseconds(100);
  // Where the compute thread is, reported with every heartbeat (and told the coordinator's
  // hang deadlines); null: not reported.
  ComputePhase* compute_phase = nullptr;
};

class CoordinatorLink {
 public:
  CoordinatorLink(WorkerControlClient* client, LinkOptions options);
  ~CoordinatorLink();  // stops the heartbeats
  CoordinatorLink(const CoordinatorLink&) = delete;
  CoordinatorLink& operator=(const CoordinatorLink&) = delete;

  // The first registration: learns the job, its spec and the heartbeat interval.
  absl::Status Register();
  const std::string& job_id() const { return job_id_; }
  const v1::JobSpec& spec() const { return spec_; }
  // The job's owner as the coordinator recorded it ("" when it authenticates nobody).
  const std::string& owner() const { return owner_; }
  std::string worker_id() const;
  // The identity the current assignment was given to (training thread only): reports keep
  // using it, so that a worker declared lost meanwhile is refused (NOT_FOUND) and rejoins.
  const std::string& member_id() const { return member_id_; }

  // Heartbeats and the Attach stream from now on, until destruction (before a long data load:
  // the lease holds). The stream tells the coordinator at once when this process dies, and
  // brings every change of this worker's place without waiting for the next heartbeat.
  void StartHeartbeats();
  // Reported with the heartbeats until the coordinator accepts it.
  void SetDataset(const v1::DatasetInfo& dataset);
  void SetAppliedUpdate(int64_t update_id) { applied_update_ = update_id; }
  int64_t applied_update() const { return applied_update_; }

  HeartbeatSnapshot Snapshot() const;
  // The snapshot once a heartbeat sent after this call was answered (or `timeout` passed):
  // the coordinator's word now. A report refused because the job ended (cancelled) can come
  // back before the heartbeat or pushed place that says so.
  HeartbeatSnapshot Fresh(absl::Duration timeout);
  // The next assignment to a generation after `after_generation`. CANCELLED once the job is
  // over; FAILED_PRECONDITION when refused; a fatal heartbeat error as it is.
  absl::StatusOr<v1::Assignment> AwaitAssignment(int64_t after_generation);
  // True while a barrier or rendezvous wait is worth continuing: the job runs, this process
  // takes part, and the generation it joined is still the current one.
  bool KeepWaiting() const;
  // Until the job is over (OK) or `give_up` passes or this process is refused (an error).
  absl::Status AwaitJobEnd(absl::Duration give_up);
  // Fails the job with this worker's message (best effort: the coordinator may be gone).
  void ReportFailure(const absl::Status& status);
  // Tells the coordinator that checkpoint `checkpoint_id`, which this worker's generation loads,
  // is damaged (`why`): the job rolls back past it. The coordinator's refusal or absence is
  // returned; the worker rejoins either way, and a later generation that loads it reports again.
  absl::Status ReportDamagedCheckpoint(int64_t checkpoint_id, const absl::Status& why);

 private:
  absl::Status RegisterAs(bool again);
  v1::HeartbeatRequest NextHeartbeat() const;
  void HeartbeatLoop();
  void AttachLoop();
  // A heartbeat's answer or a pushed place, for identity `from` (dropped if that identity was
  // replaced meanwhile).
  void Publish(const absl::StatusOr<v1::HeartbeatResponse>& answer, const std::string& from)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Refuse(const std::string& message) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits (bounded by `timeout`) for a snapshot newer than `version`, at the urgent pace.
  HeartbeatSnapshot AwaitNewer(uint64_t version, absl::Duration timeout);

  WorkerControlClient* client_;
  LinkOptions options_;
  std::string job_id_;
  v1::JobSpec spec_;
  std::string owner_;
  absl::Duration heartbeat_every_ = absl::Seconds(1);
  std::string member_id_;
  int64_t joined_generation_ = 0;             // training thread only
  std::atomic<int64_t> joined_for_waits_{0};  // the same, for KeepWaiting on other threads
  std::atomic<int64_t> applied_update_{0};
  // The generation AwaitAssignment waits to be placed after; -1 while this worker is a rank.
  std::atomic<int64_t> idle_after_{-1};

  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // a new snapshot, a new urgent waiter, or stop
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  v1::DatasetInfo dataset_ ABSL_GUARDED_BY(mu_);
  HeartbeatSnapshot snapshot_ ABSL_GUARDED_BY(mu_);
  int urgent_waiters_ ABSL_GUARDED_BY(mu_) = 0;
  bool heartbeat_now_ ABSL_GUARDED_BY(mu_) = false;        // the Attach stream ended: ask at once
  uint64_t heartbeats_sent_ ABSL_GUARDED_BY(mu_) = 0;      // rounds of HeartbeatLoop begun
  uint64_t heartbeats_answered_ ABSL_GUARDED_BY(mu_) = 0;  // the latest round that ended
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  CallCanceller attach_cancel_;
  std::thread heartbeats_;
  std::thread attach_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_LINK_COORDINATOR_LINK_H_
