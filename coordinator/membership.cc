#include "coordinator/membership.h"

#include <algorithm>

namespace trainstep {

void Membership::Add(const v1::WorkerInfo& info, const std::string& request_id,
                     absl::Time lease_expiry) {
  WorkerEntry e;
  e.info = info;
  e.info.set_rank(-1);
  e.request_id = request_id;
  e.lease_expiry = lease_expiry;
  index_[info.worker_id()] = order_.size();
  order_.push_back(info.worker_id());
  entries_.push_back(std::move(e));
}

WorkerEntry* Membership::FindMutable(const std::string& worker_id) {
  auto it = index_.find(worker_id);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const WorkerEntry* Membership::Find(const std::string& worker_id) const {
  return const_cast<Membership*>(this)->FindMutable(worker_id);
}

void Membership::AcceptDataset(const std::string& worker_id) {
  WorkerEntry* e = FindMutable(worker_id);
  if (e == nullptr) return;
  e->dataset_accepted = true;
  if (e->info.state() == v1::REGISTERED) e->info.set_state(v1::READY);
}

bool Membership::MarkLost(const std::string& worker_id, int64_t lost_ms) {
  WorkerEntry* e = FindMutable(worker_id);
  if (e == nullptr || e->info.state() == v1::LOST) return false;
  const bool was_member = RankOf(worker_id) >= 0;
  e->info.set_state(v1::LOST);
  e->info.set_rank(-1);
  e->info.set_lost_ms(lost_ms);
  if (was_member) broken_ = true;
  return was_member;
}

void Membership::AddSuspect(const std::string& worker_id) {
  WorkerEntry* e = FindMutable(worker_id);
  if (e != nullptr) e->info.set_suspect_count(e->info.suspect_count() + 1);
}

void Membership::MarkDrained(const std::string& worker_id, const std::string& reason) {
  WorkerEntry* e = FindMutable(worker_id);
  if (e != nullptr) e->info.set_drained(reason);
}

void Membership::MarkReplaced(const std::string& worker_id, const std::string& by) {
  WorkerEntry* e = FindMutable(worker_id);
  if (e != nullptr) e->info.set_replaced_by(by);
}

void Membership::FormGeneration(const v1::GenerationFormed& formed) {
  for (const std::string& id : members_) {
    WorkerEntry* e = FindMutable(id);
    if (e != nullptr && e->info.state() == v1::ACTIVE) {
      e->info.set_state(v1::READY);
      e->info.set_rank(-1);
    }
  }
  generation_ = formed.generation();
  broken_ = false;
  members_.assign(formed.worker_ids().begin(), formed.worker_ids().end());
  current_ = formed;
  rank_of_.clear();
  for (size_t rank = 0; rank < members_.size(); ++rank) {
    rank_of_[members_[rank]] = static_cast<int32_t>(rank);
    WorkerEntry* e = FindMutable(members_[rank]);
    if (e == nullptr) {
      // Not reached: replay refuses a record naming a worker the job does not know
      // (CheckFollows). Broken rather than skipped, as Restore reads such a snapshot.
      broken_ = true;
      continue;
    }
    e->info.set_state(v1::ACTIVE);
    e->info.set_rank(static_cast<int32_t>(rank));
    e->info.set_generation(generation_);
    e->idle_after_generation = -1;  // a member syncs, then applies decisions
    // A replica past the generation's starting state is one a rollback discarded: until the
    // member syncs and says so, it holds nothing of this timeline (a sync that fails leaves it
    // as it was, and it must not seed the next generation as if it held the job's update).
    if (e->applied_update_id > formed.assignment().optimizer_update_id()) {
      e->applied_update_id = -1;
    }
  }
}

bool Membership::Renew(const std::string& worker_id, absl::Time now, absl::Time lease_expiry,
                       int64_t applied_update_id, int64_t idle_after_generation) {
  WorkerEntry* e = FindMutable(worker_id);
  if (e == nullptr || e->info.state() == v1::LOST) return false;
  e->lease_expiry =
      e->restored_unattached ? std::min(lease_expiry, now + reconnect_grace_) : lease_expiry;
  e->info.set_last_heartbeat_ms(absl::ToUnixMillis(now));
  // Reports can arrive out of order; a replica never goes back within a timeline (members of a
  // generation that rolls back are reset when it forms, FormGeneration).
  e->applied_update_id = std::max(e->applied_update_id, applied_update_id);
  e->detached = false;  // it speaks: alive, whatever happened to its stream
  // A heartbeat sent before the worker joined the current generation says nothing of it.
  if (idle_after_generation < 0 || idle_after_generation >= e->idle_after_generation) {
    e->idle_after_generation = idle_after_generation;
  }
  return true;
}

void Membership::Attach(const std::string& worker_id, uint64_t seq, absl::Time lease_expiry) {
  WorkerEntry* e = FindMutable(worker_id);
  if (e == nullptr || e->info.state() == v1::LOST) return;
  e->attach_seq = seq;
  e->detached = false;
  e->restored_unattached = false;
  e->lease_expiry = std::max(e->lease_expiry, lease_expiry);
}

void Membership::Detach(const std::string& worker_id, uint64_t seq, absl::Time lease_expiry) {
  WorkerEntry* e = FindMutable(worker_id);
  if (e == nullptr || e->info.state() == v1::LOST || e->attach_seq != seq) return;
  e->attach_seq = 0;
  e->detached = true;
  e->lease_expiry = std::min(e->lease_expiry, lease_expiry);
}

void Membership::NoteApplied(const std::string& worker_id, int64_t update_id) {
  WorkerEntry* e = FindMutable(worker_id);
  if (e != nullptr) e->applied_update_id = std::max(e->applied_update_id, update_id);
}

void Membership::SetPhase(const std::string& worker_id, v1::ComputePhase phase, absl::Time since,
                          absl::Time heard) {
  WorkerEntry* e = FindMutable(worker_id);
  if (e == nullptr) return;
  e->phase = phase;
  e->phase_since = since;
  e->phase_heard = heard;
}

void Membership::RestartPhaseClocks(absl::Time now) {
  for (WorkerEntry& e : entries_) e.phase_since = std::max(e.phase_since, now);
}

void Membership::RenewAll(absl::Time lease_expiry) {
  for (WorkerEntry& e : entries_) e.lease_expiry = lease_expiry;
}

void Membership::MarkAllDetached(absl::Duration reconnect_grace) {
  reconnect_grace_ = reconnect_grace;
  for (WorkerEntry& e : entries_) {
    e.detached = true;
    e.restored_unattached = true;
  }
}

std::vector<std::string> Membership::Expired(absl::Time now) const {
  std::vector<std::string> out;
  for (size_t i = 0; i < order_.size(); ++i) {
    const WorkerEntry& e = entries_[i];
    if (e.info.state() != v1::LOST && e.lease_expiry <= now) out.push_back(order_[i]);
  }
  return out;
}

std::optional<absl::Time> Membership::NextLeaseExpiry() const {
  std::optional<absl::Time> next;
  for (const WorkerEntry& e : entries_) {
    if (e.info.state() == v1::LOST) continue;
    if (!next || e.lease_expiry < *next) next = e.lease_expiry;
  }
  return next;
}

std::vector<std::string> Membership::Survivors() const {
  std::vector<std::string> out;
  for (const std::string& id : members_) {
    const WorkerEntry* e = Find(id);
    if (e != nullptr && e->info.state() != v1::LOST) out.push_back(id);
  }
  return out;
}

std::vector<std::string> Membership::Standbys() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < order_.size(); ++i) {
    const WorkerEntry& e = entries_[i];
    if (e.info.state() == v1::READY && e.dataset_accepted && RankOf(order_[i]) < 0) {
      out.push_back(order_[i]);
    }
  }
  return out;
}

int32_t Membership::RankOf(const std::string& worker_id) const {
  auto it = rank_of_.find(worker_id);
  if (it == rank_of_.end()) return -1;
  const WorkerEntry* e = Find(worker_id);
  return e != nullptr && e->info.state() == v1::ACTIVE ? it->second : -1;
}

std::vector<v1::WorkerSnapshot> Membership::Snapshot() const {
  std::vector<v1::WorkerSnapshot> out;
  for (const WorkerEntry& e : entries_) {
    v1::WorkerSnapshot s;
    *s.mutable_info() = e.info;
    s.set_request_id(e.request_id);
    s.set_dataset_accepted(e.dataset_accepted);
    out.push_back(std::move(s));
  }
  return out;
}

void Membership::Restore(const std::vector<v1::WorkerSnapshot>& workers,
                         const v1::GenerationFormed& current, absl::Time lease_expiry) {
  order_.clear();
  entries_.clear();
  index_.clear();
  for (const v1::WorkerSnapshot& s : workers) {
    WorkerEntry e;
    e.info = s.info();
    e.request_id = s.request_id();
    e.dataset_accepted = s.dataset_accepted();
    e.lease_expiry = lease_expiry;
    index_[s.info().worker_id()] = order_.size();
    order_.push_back(s.info().worker_id());
    entries_.push_back(std::move(e));
  }
  current_ = current;
  generation_ = current.generation();
  members_.assign(current.worker_ids().begin(), current.worker_ids().end());
  rank_of_.clear();
  for (size_t rank = 0; rank < members_.size(); ++rank) {
    rank_of_[members_[rank]] = static_cast<int32_t>(rank);
  }
  broken_ = false;
  for (const std::string& id : members_) {
    const WorkerEntry* e = Find(id);
    if (e == nullptr || e->info.state() != v1::ACTIVE) broken_ = true;
  }
}

}  // namespace trainstep
