// Time and the rendezvous: leases and grace periods (Tick, NextDeadline), the restart
// recovery window, and the guard on a generation's rendezvous keys.
// Part of StepMachine (coordinator/step_machine.h): one concept per file.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/step_machine.h"

namespace trainstep {

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

void StepMachine::Recovered(absl::Time now) {
  // Never shorter than a worker that only heartbeats (no Attach stream) needs to be heard.
  const absl::Duration grace = std::min(
      options_.worker_lease, std::max(options_.reconnect_grace, HeartbeatInterval() * 3 / 2));
  membership_.RenewAll(now + grace);
  membership_.MarkAllDetached(grace);
  recovered_window_ = last_window_ + 1;
  recovered_generation_ = membership_.generation();
}

absl::Status StepMachine::CheckRendezvousKey(int64_t generation, const std::string& key) const {
  const int64_t current = membership_.generation();
  if (generation == 0 || generation > current ||
      (generation == current && membership_.generation_live())) {
    return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat("rendezvous key ", key, " belongs to generation ",
                                         generation, ", which is over; the current one is ",
                                         current, membership_.generation_live() ? "" : " (ended)"));
}

absl::Status StepMachine::RendezvousKeyMissing(int64_t generation, const std::string& key,
                                               absl::Time now) {
  if (recovered_generation_ == 0 || generation != recovered_generation_ ||
      recovered_generation_ != membership_.generation() || !membership_.generation_live()) {
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
  MaybeFenceHung(now);
}

}  // namespace trainstep
