// JobRegistry: every job's StepMachine, the request-id and worker-id indexes, and the
// journal records they produce. Pure like the machines it holds: no threads, no I/O,
// no clock. Coordinator (coordinator.h) wraps it with a lock, the journal and waiting.
#ifndef TRAINSTEP_COORDINATOR_JOB_REGISTRY_H_
#define TRAINSTEP_COORDINATOR_JOB_REGISTRY_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/limits.h"
#include "coordinator/step_machine.h"
#include "trainstep/v1/job_service.pb.h"
#include "trainstep/v1/journal.pb.h"
#include "trainstep/v1/worker_service.pb.h"

namespace trainstep {

// The job a journal record belongs to.
std::string JobIdOf(const v1::JournalRecord& record);

// Who makes a JobService call, as the RPC layer's authorization (auth.h) found it.
struct Caller {
  std::string principal;       // "" without authentication; Submit records it as Job.owner
  bool own_jobs_only = false;  // Cancel refuses a job that another principal submitted
};

class JobRegistry {
 public:
  explicit JobRegistry(const MachineOptions& options, const Limits& limits = Limits())
      : options_(options), limits_(limits) {}

  // --- JobService ---
  // Refuses oversized request ids, names and specs (INVALID_ARGUMENT), a checkpoint dir a
  // live job already uses (FAILED_PRECONDITION naming it), and a job beyond --max-jobs when
  // every retained job is live (RESOURCE_EXHAUSTED); otherwise forgets the oldest finished
  // jobs to make room. Request ids are the caller's own: the same id from two principals
  // names two requests.
  absl::StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& req, absl::Time now,
                                 const Caller& caller = {});
  absl::StatusOr<v1::Job> Get(const std::string& job_id) const;
  // Every job, in submission order (for metrics; RPCs page with ListJobs).
  std::vector<v1::Job> List() const;
  // A page of jobs within the page size and Limits::list_page_bytes; its token is the number
  // of the last job in it, so jobs forgotten between pages shift nothing.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& req) const;
  // PERMISSION_DENIED when caller.own_jobs_only and the job is another principal's.
  absl::StatusOr<v1::Job> Cancel(const v1::CancelJobRequest& req, absl::Time now,
                                 const Caller& caller = {});
  absl::StatusOr<v1::ListUpdatesResponse> ListUpdates(const v1::ListUpdatesRequest& req) const;
  // Every worker of the job (all jobs for ""), in registration order; with `now`, only those
  // still listed then (StillListed).
  std::vector<v1::WorkerInfo> ListWorkers(const std::string& job_id,
                                          std::optional<absl::Time> now = std::nullopt) const;
  // A page of ListWorkers(req.job_id(), now); NOT_FOUND for an unknown job.
  absl::StatusOr<v1::ListWorkersResponse> ListWorkersPage(const v1::ListWorkersRequest& req,
                                                          absl::Time now) const;

  // --- WorkerService ---
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(const v1::RegisterWorkerRequest& req,
                                                            absl::Time now);
  // The worker's failure, its message truncated to Limits::max_message_bytes.
  absl::Status ReportFailure(v1::ReportFailureRequest req, absl::Time now);
  // The job's machine, or NOT_FOUND naming the id.
  absl::StatusOr<StepMachine*> Machine(const std::string& job_id);
  absl::StatusOr<const StepMachine*> Machine(const std::string& job_id) const;

  // --- Time ---
  // A Tick that came more than StallThreshold() after the previous one.
  struct Stall {
    absl::Duration gap;    // since the previous Tick
    int consecutive = 0;   // stalled Ticks in a row, this one included
    bool renewed = false;  // every lease restarted; false beyond kMaxRenewingStalls in a row
  };
  // A pause (SIGSTOP, a VM freeze or migration, swapping) shows as one late Tick, or a few
  // when it comes in steps. More in a row means the coordinator runs but ticks late: it reads
  // heartbeats between Ticks, so leases are right, and renewing them would keep a dead worker
  // for ever. So a dead worker outlives at most this many stalls and then its lease.
  static constexpr int kMaxRenewingStalls = 3;
  // Expires leases, unless the time since the previous Tick shows the coordinator itself was
  // stalled: then the workers' heartbeats are still queued, unread, so every lease restarts
  // at `now` instead and nobody expires, for up to kMaxRenewingStalls Ticks in a row (one on
  // time ends the run). Returns the stall, if it was one. The driver must tick at least every
  // StallThreshold() / 2 (NextDeadline asks for that), so that a normal gap is never a stall.
  std::optional<Stall> Tick(absl::Time now);
  // Every lease restarts at `now`, and the time since the last Tick is not a stall: the
  // coordinator held its decisions (the journal could not be written) and refused heartbeats.
  void RenewAllLeases(absl::Time now);
  // Every running job's decisions were held for `held`: its goodput lost that to storage.
  void AddStorageHold(absl::Duration held);
  std::optional<absl::Time> NextDeadline() const;
  // Half a lease: a shorter stall cannot cost a worker that heartbeats every lease / 5 its
  // lease.
  absl::Duration StallThreshold() const { return options_.worker_lease / 2; }

  // --- Journal ---
  // Every record produced since the last call, in the order they were applied.
  std::vector<v1::JournalRecord> TakeRecords();
  // Replays one record. A record this state cannot have produced (see
  // StepMachine::CheckFollows; here also: a job submitted twice, a record for a job the journal
  // does not hold, a worker registered with two jobs) is refused, FAILED_PRECONDITION saying
  // why, and changes nothing.
  absl::Status Apply(const v1::JournalRecord& record);
  v1::CoordinatorSnapshot Snapshot() const;
  void Restore(const v1::CoordinatorSnapshot& snapshot, absl::Time now);
  // After a replay: every machine's Recovered (leases restart at `now`: the workers were
  // alive when we went down), then the oldest finished jobs beyond --max-jobs are forgotten
  // (a journal written under a higher limit replays in full first).
  void Recovered(absl::Time now);

 private:
  void Index(const StepMachine& machine);
  void IndexWorker(const std::string& worker_id, const std::string& job_id,
                   const std::string& request_id);
  bool IsLostWorker(const std::string& worker_id) const;  // of any job this registry holds
  // Marks `replaces`, a lost worker ("" = none), replaced by `by`: live after `by`'s
  // registration, in replay after its record, so both end with the same rows.
  void NoteReplaced(const std::string& replaces, const std::string& by);
  // A worker lost, or of a job that ended (`job_end_ms` > 0), is listed for
  // Limits::finished_worker_retention after that; every other worker always.
  bool StillListed(const v1::WorkerInfo& w, int64_t job_end_ms, absl::Time now) const;
  std::string NewJobId();
  // Forgets finished jobs, oldest first, until fewer than `keep` remain; false if only live
  // ones are left and there are still `keep` or more.
  bool ForgetFinishedBeyond(size_t keep);
  void Forget(const std::string& job_id);

  MachineOptions options_;
  Limits limits_;
  std::map<std::string, std::unique_ptr<StepMachine>> jobs_;  // by id
  std::vector<std::string> job_order_;                        // submission order
  std::map<std::string, std::string> job_by_request_;     // RequestKey(owner, request_id) -> job_id
  std::map<std::string, std::string> worker_by_request_;  // request_id -> worker_id
  std::map<std::string, std::string> job_of_worker_;      // worker_id -> job_id
  int64_t next_job_number_ = 1;
  int64_t next_worker_number_ = 1;
  std::optional<absl::Time> last_tick_;     // ephemeral; unset before the first Tick
  int consecutive_stalls_ = 0;              // ephemeral: late Ticks since the last on time
  std::vector<v1::JournalRecord> pending_;  // records of machines created in Submit
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_JOB_REGISTRY_H_
