// Fuzzes the replay of a journal into the coordinator's registry (ReplayJournal in
// coordinator/coordinator.h): arbitrary bytes as the snapshot and the records, framed by the
// journal itself so they pass its checksums. Checks that replay either succeeds or reports
// DATA_LOSS, and that the state it rebuilds is self-consistent: a snapshot of it restores to
// the same state, and records produced afterwards (expired leases) apply to the restored copy
// exactly as they did to the original.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_registry.h"
#include "coordinator/journal.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/unit/coordinator/fault_injection_env.h"

namespace trainstep {
namespace {

using fuzz::DeterministicBytes;
using fuzz::FuzzInput;

constexpr char kDir[] = "/j";
constexpr int kMaxRecords = 256;

// Writes the snapshot and records through a Journal and recovers them again.
RecoveredJournal WriteAndRecover(const std::optional<std::string>& snapshot,
                                 const std::vector<std::string>& records) {
  InMemoryEnv env;
  {
    absl::StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(&env, kDir, {}, nullptr);
    FUZZ_CHECK(journal.ok(), journal.status().ToString());
    if (snapshot.has_value()) FUZZ_CHECK((*journal)->WriteSnapshot(*snapshot).ok());
    uint64_t seq = 0;
    for (const std::string& r : records) seq = (*journal)->Append(r);
    if (seq > 0) FUZZ_CHECK((*journal)->Sync(seq).ok());
  }
  RecoveredJournal recovered;
  absl::StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(&env, kDir, {}, &recovered);
  FUZZ_CHECK(journal.ok(), journal.status().ToString());
  FUZZ_CHECK(recovered.snapshot == snapshot, "the snapshot did not survive the journal");
  FUZZ_CHECK(recovered.records == records, "the records did not survive the journal");
  FUZZ_CHECK(recovered.warnings.empty(), recovered.warnings.front());
  return recovered;
}

void Run(FuzzInput& in) {
  std::optional<std::string> snapshot;
  if (in.Bool()) snapshot = in.String(65535, /*wide=*/true);
  std::vector<std::string> records;
  while (!in.empty() && records.size() < kMaxRecords) {
    records.push_back(in.String(65535, /*wide=*/true));
  }
  const RecoveredJournal recovered = WriteAndRecover(snapshot, records);

  MachineOptions options;
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  JobRegistry registry(options);
  const absl::Status replayed = ReplayJournal(recovered, kDir, now, &registry);
  if (!replayed.ok()) {
    FUZZ_CHECK(replayed.code() == absl::StatusCode::kDataLoss, replayed.ToString());
    return;
  }

  // What a restarted coordinator would write as its first snapshot restores to the same state,
  // recovered as a second restart would recover it (Restore, then Recovered: every worker
  // detached until it speaks), not by Restore alone, which no coordinator does.
  const v1::CoordinatorSnapshot snap = registry.Snapshot();
  JobRegistry restored(options);
  RecoveredJournal snapshot_only;
  snapshot_only.snapshot = snap.SerializeAsString();
  FUZZ_CHECK(ReplayJournal(snapshot_only, kDir, now, &restored).ok());
  const v1::CoordinatorSnapshot again = restored.Snapshot();
  FUZZ_CHECK(DeterministicBytes(again) == DeterministicBytes(snap),
             "Restore(Snapshot()) is not the same state:\n" + snap.DebugString() +
                 "\nrestored and written again:\n" + again.DebugString());

  // The read paths the services call on a recovered registry.
  for (const v1::Job& job : registry.List()) {
    FUZZ_CHECK(registry.Get(job.job_id()).ok());
    (void)registry.ListWorkers(job.job_id());
    v1::ListUpdatesRequest req;
    req.set_job_id(job.job_id());
    (void)registry.ListUpdates(req);
  }
  (void)registry.NextDeadline();

  // Leases expire a lease after recovery; the records that produces replay identically.
  const absl::Time later = now + options.worker_lease + absl::Seconds(1);
  for (JobRegistry* r : {&registry, &restored}) {
    (void)r->Tick(now);
    (void)r->Tick(now + options.worker_lease / 4);
  }
  (void)registry.Tick(later);
  (void)restored.Tick(later);
  for (const v1::JournalRecord& record : registry.TakeRecords()) {
    FUZZ_CHECK(!record.has_job_submitted());
  }
  (void)restored.TakeRecords();
  const v1::CoordinatorSnapshot replayed_after = registry.Snapshot();
  const v1::CoordinatorSnapshot restored_after = restored.Snapshot();
  FUZZ_CHECK(DeterministicBytes(restored_after) == DeterministicBytes(replayed_after),
             "the restored registry and the replayed one diverged after the same Ticks; "
             "replayed:\n" +
                 replayed_after.DebugString() + "\nrestored:\n" + restored_after.DebugString());
}

}  // namespace
}  // namespace trainstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainstep::fuzz::FuzzInput in(data, size);
  trainstep::Run(in);
  return 0;
}
