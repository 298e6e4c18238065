// The workers of one job: their leases, ranks and the current generation. A plain
// container that the step machine mutates only while applying journal records (and,
// for the ephemeral leases, on heartbeats). No clock of its own, no threads.
#ifndef TRAINSTEP_COORDINATOR_MEMBERSHIP_H_
#define TRAINSTEP_COORDINATOR_MEMBERSHIP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "trainstep/v1/journal.pb.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep {

struct WorkerEntry {
  v1::WorkerInfo info;
  std::string request_id;
  bool dataset_accepted = false;
  absl::Time lease_expiry;  // ephemeral: not journaled, reset on recovery
  // Ephemeral: the newest optimizer update this worker's replica is known to hold (from its
  // heartbeats and window reports); -1 until it says. Only holders of the job's current
  // update may seed a new generation.
  int64_t applied_update_id = -1;
  // Ephemeral: set while the worker says it waits for a generation after this one (its
  // applied_update_id is then final); -1 while it may still be applying a decision, and
  // until it says (after a coordinator restart nobody has said yet).
  int64_t idle_after_generation = -1;
  // Ephemeral: the worker's open Attach stream (coordinator-assigned number), 0 = none.
  uint64_t attach_seq = 0;
  // Ephemeral: its stream dropped and it has not spoken since: probably dead (its lease ends
  // after the detach grace). A new generation is not built on it meanwhile.
  bool detached = false;
  // Ephemeral: restored by a restarted coordinator and not attached to it since. Its
  // heartbeats renew it for the reconnect grace only: a worker that heartbeated once and then
  // died before its stream opened would otherwise hold its generation for a whole lease.
  bool restored_unattached = false;
  // Ephemeral: its compute thread's phase at its latest heartbeat, and since when (by this
  // clock: the heartbeat's arrival less the time the worker said it had been there).
  v1::ComputePhase phase = v1::COMPUTE_PHASE_UNSPECIFIED;
  absl::Time phase_since;
  absl::Time phase_heard;  // that heartbeat's arrival
};

class Membership {
 public:
  // --- Mutations (called from the step machine's Apply) ---
  void Add(const v1::WorkerInfo& info, const std::string& request_id, absl::Time lease_expiry);
  void AcceptDataset(const std::string& worker_id);
  // Marks the worker lost at `lost_ms` (its record's time). Returns true if it was a rank of
  // the current generation, which then is broken: no window of it can end any more.
  bool MarkLost(const std::string& worker_id, int64_t lost_ms);
  // A re-run found the worker's first run not reproduced (a transient fault on it).
  void AddSuspect(const std::string& worker_id);
  // The lost worker was drained (WorkerLost.drained) for `reason`: it is told to exit.
  void MarkDrained(const std::string& worker_id, const std::string& reason);
  // The lost worker registered again as `by` (the registry's, from by's registration record).
  void MarkReplaced(const std::string& worker_id, const std::string& by);
  void FormGeneration(const v1::GenerationFormed& formed);
  // The current generation ends without a successor yet (desync: same members re-form).
  void BreakGeneration() { broken_ = true; }

  // --- Leases (ephemeral) ---
  // `idle_after_generation`: see WorkerEntry (-1: the worker is not idle).
  bool Renew(const std::string& worker_id, absl::Time now, absl::Time lease_expiry,
             int64_t applied_update_id, int64_t idle_after_generation = -1);
  // Every phase counts from `now` at the earliest.
  void RestartPhaseClocks(absl::Time now);
  // Its heartbeat, heard at `heard`, said its compute thread is in `phase`, since `since`.
  void SetPhase(const std::string& worker_id, v1::ComputePhase phase, absl::Time since,
                absl::Time heard);
  // The worker opened Attach stream `seq`: its lease is renewed like a heartbeat's.
  void Attach(const std::string& worker_id, uint64_t seq, absl::Time lease_expiry);
  // Stream `seq` dropped: if it is the worker's latest, its lease ends by `lease_expiry`
  // (a live worker re-attaches or heartbeats before then, a dead one cannot).
  void Detach(const std::string& worker_id, uint64_t seq, absl::Time lease_expiry);
  // The worker's replica holds optimizer update `update_id` (it reported a window at it).
  void NoteApplied(const std::string& worker_id, int64_t update_id);
  // Every live worker's lease restarts at `lease_expiry` (a coordinator pause or restart).
  void RenewAll(absl::Time lease_expiry);
  // After a restart: nobody has spoken to this coordinator yet, and a worker that died while it
  // was down never will; each counts as detached until it heartbeats or attaches, and until it
  // attaches each heartbeat renews it for `reconnect_grace` only.
  void MarkAllDetached(absl::Duration reconnect_grace);
  std::vector<std::string> Expired(absl::Time now) const;
  std::optional<absl::Time> NextLeaseExpiry() const;

  // --- Queries ---
  const WorkerEntry* Find(const std::string& worker_id) const;
  int64_t generation() const { return generation_; }
  int32_t world_size() const { return static_cast<int32_t>(members_.size()); }
  bool has_generation() const { return generation_ > 0; }
  // A formed generation whose members are all alive and which no desync broke.
  bool generation_live() const { return generation_ > 0 && !broken_; }
  // The current generation's record (assignment template); unset before the first.
  const v1::GenerationFormed& current() const { return current_; }
  // Worker ids in registration order.
  const std::vector<std::string>& order() const { return order_; }
  // Live members of the current generation, by old rank: the survivors.
  std::vector<std::string> Survivors() const;
  // Live workers with an accepted dataset that are not survivors, in registration order.
  std::vector<std::string> Standbys() const;
  int32_t RankOf(
      const std::string& worker_id) const;  // -1 unless a member of the current generation

  std::vector<v1::WorkerSnapshot> Snapshot() const;
  void Restore(const std::vector<v1::WorkerSnapshot>& workers, const v1::GenerationFormed& current,
               absl::Time lease_expiry);

 private:
  WorkerEntry* FindMutable(const std::string& worker_id);

  std::vector<std::string> order_;
  std::vector<WorkerEntry> entries_;                   // parallel to order_
  absl::flat_hash_map<std::string, size_t> index_;     // worker id -> position in order_
  absl::flat_hash_map<std::string, int32_t> rank_of_;  // members_ inverted
  int64_t generation_ = 0;
  bool broken_ = false;
  std::vector<std::string> members_;  // index = rank
  v1::GenerationFormed current_;
  absl::Duration reconnect_grace_;  // of MarkAllDetached: renewals of restored_unattached
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_MEMBERSHIP_H_
