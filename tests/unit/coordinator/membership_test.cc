#include "coordinator/membership.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

v1::WorkerInfo Info(const std::string& id) {
  v1::WorkerInfo w;
  w.set_worker_id(id);
  w.set_job_id("job-1");
  w.set_state(v1::REGISTERED);
  w.set_rank(-1);
  return w;
}

v1::GenerationFormed Gen(int64_t generation, std::vector<std::string> ids) {
  v1::GenerationFormed f;
  f.set_job_id("job-1");
  f.set_generation(generation);
  for (const std::string& id : ids) f.add_worker_ids(id);
  f.mutable_assignment()->set_store_prefix("job-1/g" + std::to_string(generation) + "/");
  return f;
}

// a, b, c registered (in that order) with accepted datasets; leases a < b < c.
Membership ThreeReady() {
  Membership m;
  m.Add(Info("a"), "req-a", kT0 + absl::Seconds(1));
  m.Add(Info("b"), "req-b", kT0 + absl::Seconds(2));
  m.Add(Info("c"), "", kT0 + absl::Seconds(3));
  for (const char* id : {"a", "b", "c"}) m.AcceptDataset(id);
  return m;
}

// Catches: a worker placed in a generation before its dataset was accepted, or a
// registration order that is not kept.
TEST(MembershipTest, RegisteredBecomesReadyOnDataset) {
  Membership m;
  m.Add(Info("a"), "req-a", kT0);
  m.Add(Info("b"), "", kT0);
  EXPECT_EQ(m.Find("a")->info.state(), v1::REGISTERED);
  EXPECT_EQ(m.Find("a")->request_id, "req-a");
  EXPECT_THAT(m.Standbys(), IsEmpty());
  m.AcceptDataset("b");
  EXPECT_EQ(m.Find("b")->info.state(), v1::READY);
  EXPECT_TRUE(m.Find("b")->dataset_accepted);
  EXPECT_THAT(m.Standbys(), ElementsAre("b"));
  EXPECT_THAT(m.order(), ElementsAre("a", "b"));
  EXPECT_EQ(m.Find("zz"), nullptr);
  EXPECT_FALSE(m.has_generation());
  EXPECT_FALSE(m.generation_live());
}

// Catches: ranks not following worker_ids order, or members of the previous generation
// left ACTIVE (with a stale rank) when they are not in the new one.
TEST(MembershipTest, FormGenerationAssignsRanks) {
  Membership m = ThreeReady();
  m.FormGeneration(Gen(1, {"b", "a"}));
  EXPECT_EQ(m.generation(), 1);
  EXPECT_TRUE(m.generation_live());
  EXPECT_EQ(m.world_size(), 2);
  EXPECT_EQ(m.RankOf("b"), 0);
  EXPECT_EQ(m.RankOf("a"), 1);
  EXPECT_EQ(m.RankOf("c"), -1);
  EXPECT_EQ(m.Find("a")->info.state(), v1::ACTIVE);
  EXPECT_EQ(m.Find("a")->info.rank(), 1);
  EXPECT_EQ(m.Find("a")->info.generation(), 1);
  EXPECT_THAT(m.Standbys(), ElementsAre("c"));
  EXPECT_EQ(m.current().assignment().store_prefix(), "job-1/g1/");

  m.FormGeneration(Gen(2, {"a", "c"}));
  EXPECT_EQ(m.Find("b")->info.state(), v1::READY);
  EXPECT_EQ(m.Find("b")->info.rank(), -1);
  EXPECT_EQ(m.RankOf("b"), -1);
  EXPECT_EQ(m.RankOf("c"), 1);
  EXPECT_THAT(m.Standbys(), ElementsAre("b"));
}

// Catches: losing a member that does not break the generation, losing a standby that does,
// or survivors reported out of rank order.
TEST(MembershipTest, MarkLostBreaksOnlyForMembers) {
  Membership m = ThreeReady();
  m.FormGeneration(Gen(1, {"c", "a"}));
  EXPECT_FALSE(m.MarkLost("b", 0));  // standby
  EXPECT_TRUE(m.generation_live());
  EXPECT_THAT(m.Standbys(), IsEmpty());
  EXPECT_TRUE(m.MarkLost("c", 0));
  EXPECT_FALSE(m.generation_live());
  EXPECT_FALSE(m.MarkLost("c", 0));  // already lost
  EXPECT_EQ(m.Find("c")->info.state(), v1::LOST);
  EXPECT_EQ(m.Find("c")->info.rank(), -1);
  EXPECT_EQ(m.RankOf("c"), -1);
  EXPECT_THAT(m.Survivors(), ElementsAre("a"));
}

// Catches: a generation naming a worker the job does not know (only a damaged journal holds
// one) counted live when applied but broken when restored from a snapshot of the same state,
// so a restarted coordinator answered otherwise (the journal_replay fuzzer's finding).
TEST(MembershipTest, GenerationNamingAnUnknownWorkerIsBrokenAppliedOrRestored) {
  Membership m = ThreeReady();
  m.FormGeneration(Gen(1, {"a", "ghost"}));
  EXPECT_FALSE(m.generation_live());
  EXPECT_EQ(m.Find("a")->info.state(), v1::ACTIVE);

  std::vector<v1::WorkerSnapshot> workers;
  for (const std::string& id : m.order()) {
    v1::WorkerSnapshot& w = workers.emplace_back();
    *w.mutable_info() = m.Find(id)->info;
  }
  Membership restored;
  restored.Restore(workers, m.current(), kT0);
  EXPECT_EQ(restored.generation_live(), m.generation_live());
}

// Catches: survivors listed in registration order instead of old rank order.
TEST(MembershipTest, SurvivorsKeepRankOrder) {
  Membership m = ThreeReady();
  m.FormGeneration(Gen(1, {"c", "b", "a"}));
  m.MarkLost("b", 0);
  EXPECT_THAT(m.Survivors(), ElementsAre("c", "a"));
}

// Catches: BreakGeneration (desync) that does not stop the generation, or a re-formed
// generation that stays broken.
TEST(MembershipTest, BreakAndReform) {
  Membership m = ThreeReady();
  m.FormGeneration(Gen(1, {"a", "b"}));
  m.BreakGeneration();
  EXPECT_FALSE(m.generation_live());
  EXPECT_THAT(m.Survivors(), ElementsAre("a", "b"));
  m.FormGeneration(Gen(2, {"a", "b"}));
  EXPECT_TRUE(m.generation_live());
  EXPECT_EQ(m.RankOf("b"), 1);
}

// Catches: leases of lost workers still expiring (a worker lost twice), wrong next deadline.
TEST(MembershipTest, LeasesExpireAndRenew) {
  Membership m = ThreeReady();
  EXPECT_EQ(m.NextLeaseExpiry(), kT0 + absl::Seconds(1));
  EXPECT_THAT(m.Expired(kT0), IsEmpty());
  EXPECT_THAT(m.Expired(kT0 + absl::Seconds(2)), ElementsAre("a", "b"));
  EXPECT_TRUE(m.Renew("a", kT0 + absl::Seconds(1), kT0 + absl::Seconds(10), 4));
  EXPECT_EQ(m.Find("a")->applied_update_id, 4);
  // The heartbeat time shown to users is when it arrived, not when the lease ends.
  EXPECT_EQ(m.Find("a")->info.last_heartbeat_ms(), absl::ToUnixMillis(kT0 + absl::Seconds(1)));
  EXPECT_THAT(m.Expired(kT0 + absl::Seconds(2)), ElementsAre("b"));
  m.MarkLost("b", 0);
  EXPECT_FALSE(m.Renew("b", kT0, kT0 + absl::Seconds(10), 0));
  EXPECT_THAT(m.Expired(kT0 + absl::Seconds(5)), ElementsAre("c"));
  EXPECT_EQ(m.NextLeaseExpiry(), kT0 + absl::Seconds(3));
  m.RenewAll(kT0 + absl::Seconds(20));
  EXPECT_EQ(m.NextLeaseExpiry(), kT0 + absl::Seconds(20));
  EXPECT_FALSE(m.Renew("nobody", kT0, kT0, 0));
}

// Catches: Snapshot/Restore losing a worker's state, request id, dataset flag, or the
// current generation; and a restored generation with a lost member that counts as live.
TEST(MembershipTest, SnapshotRestore) {
  Membership m = ThreeReady();
  m.FormGeneration(Gen(1, {"a", "b"}));
  Membership r;
  const std::vector<v1::WorkerSnapshot> snap = m.Snapshot();
  r.Restore(snap, m.current(), kT0 + absl::Seconds(9));
  ASSERT_EQ(r.Snapshot().size(), snap.size());
  for (size_t i = 0; i < snap.size(); ++i) {
    EXPECT_EQ(r.Snapshot()[i].SerializeAsString(), snap[i].SerializeAsString());
  }
  EXPECT_TRUE(r.generation_live());
  EXPECT_EQ(r.RankOf("b"), 1);
  EXPECT_THAT(r.Standbys(), ElementsAre("c"));
  EXPECT_EQ(r.NextLeaseExpiry(), kT0 + absl::Seconds(9));

  m.MarkLost("a", 0);
  Membership broken;
  broken.Restore(m.Snapshot(), m.current(), kT0);
  EXPECT_FALSE(broken.generation_live());
  EXPECT_THAT(broken.Survivors(), ElementsAre("b"));
}

}  // namespace
}  // namespace trainstep
