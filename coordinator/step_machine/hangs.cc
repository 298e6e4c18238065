// Hung ranks: alive (heartbeating) but stuck in a step of their own work while their peers
// wait for them. Fenced like a lost worker, so the job re-forms without them at once.
// Part of StepMachine (coordinator/step_machine.h): one concept per file.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/step_machine.h"
#include "core/hang.h"
#include "core/window_outcome.h"

namespace trainstep {
namespace {

// Windows the hang deadline looks back on: enough to ride out one fast window, few enough to
// follow a job that slowed down (a longer sequence length, a bigger evaluation).
constexpr size_t kHangWindows = 20;

}  // namespace

void StepMachine::RefreshSlowestRecentWindow() {
  slowest_recent_window_.reset();
  size_t seen = 0;
  for (auto it = updates_.rbegin(); it != updates_.rend() && seen < kHangWindows; ++it) {
    if (OutcomeOf(*it) == v1::ABORT) continue;  // an aborted window may be the hang itself
    ++seen;
    const absl::Duration d = absl::Seconds(it->window_seconds());
    if (!slowest_recent_window_.has_value() || d > *slowest_recent_window_) {
      slowest_recent_window_ = d;
    }
  }
}

absl::Duration StepMachine::ShortStepDeadlineNow() const {
  return ShortStepDeadline(HangPolicyOf(job_.spec()), slowest_recent_window_);
}

void StepMachine::NotePhase(const v1::HeartbeatRequest& req, absl::Time now) {
  if (!v1::ComputePhase_IsValid(req.phase()) || req.phase() == v1::COMPUTE_PHASE_UNSPECIFIED) {
    return;  // a worker from before phases, or one from a newer version: nothing to judge by
  }
  // A day at most: a worker's clock is its own, and a wild value must not overflow the time.
  const int64_t ms = std::clamp<int64_t>(req.phase_ms(), 0, 86'400'000);
  membership_.SetPhase(req.worker_id(), req.phase(), now - absl::Milliseconds(ms), now);
}

void StepMachine::MaybeFenceHung(absl::Time now) {
  if (terminal() || !membership_.generation_live()) return;
  const HangPolicy policy = HangPolicyOf(job_.spec());
  const absl::Duration short_deadline = ShortStepDeadlineNow();
  // Only a rank its peers wait for is hung: when every rank is in its own work (a slow shared
  // file system, a pause of the whole job) nobody is to blame, and fencing would lose them all.
  bool someone_waits = false;
  std::string hung;
  v1::ComputePhase hung_phase = v1::COMPUTE_PHASE_UNSPECIFIED;
  absl::Duration longest, hung_deadline;
  for (const std::string& id : membership_.current().worker_ids()) {
    const WorkerEntry* w = membership_.Find(id);
    if (w == nullptr || w->info.state() == v1::LOST) continue;
    if (IsWaitForPeers(w->phase)) someone_waits = true;
    if (!IsOwnWork(w->phase)) continue;
    const absl::Duration stuck = now - w->phase_since;
    const absl::Duration deadline = PhaseDeadline(policy, w->phase, short_deadline);
    if (stuck > deadline && (hung.empty() || stuck > longest)) {
      hung = id;
      hung_phase = w->phase;
      longest = stuck;
      hung_deadline = deadline;
    }
  }
  if (!someone_waits || hung.empty()) return;
  AbortInFlight(v1::WINDOW_REASON_WORKER_LOST, now);
  v1::JournalRecord record;
  v1::WorkerLost* lost = record.mutable_worker_lost();
  lost->set_job_id(job_id());
  lost->set_worker_id(hung);
  lost->set_hung_phase(hung_phase);
  lost->set_reason(absl::StrCat("hung: rank ", membership_.RankOf(hung), " stayed in ",
                                PhaseName(hung_phase), " for ", absl::FormatDuration(longest),
                                " while its peers waited (hang deadline ",
                                absl::FormatDuration(hung_deadline), "); fenced"));
  Emit(std::move(record), now);
  MaybeFormGeneration(now);
}

}  // namespace trainstep
