// The rendezvous store's calls through the Coordinator: waiting reads, and the reads that an
// ended generation's ranks must not wait out.
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/coordinator_fixture.h"

namespace trainstep {
namespace {

using testing_util::Call;

class StoreCallsTest : public testing_util::CoordinatorTest {};

// Catches: a StoreGet that answers before the key exists, or never after StoreSet.
TEST_F(StoreCallsTest, StoreGetWaitsUntilStoreSet) {
  const std::string job = Submit(1);
  Call<v1::StoreGetResponse> get;
  v1::StoreGetRequest req;
  req.set_job_id(job);
  req.set_key("job-1/g1/addr");
  coordinator_->StoreGet(req, get.done(), std::make_shared<CallHandle>());
  Call<v1::StoreWaitResponse> wait;
  v1::StoreWaitRequest wreq;
  wreq.set_job_id(job);
  wreq.add_keys("job-1/g1/addr");
  wreq.add_keys("job-1/g1/other");
  coordinator_->StoreWait(wreq, wait.done(), std::make_shared<CallHandle>());
  EXPECT_FALSE(get.answered());
  EXPECT_FALSE(wait.answered());

  v1::StoreSetRequest set;
  set.set_job_id(job);
  set.set_key("job-1/g1/addr");
  set.set_value("10.0.0.1:29500");
  ASSERT_TRUE(Sync<v1::StoreSetResponse>([&](Done<v1::StoreSetResponse> d) {
                coordinator_->StoreSet(set, std::move(d));
              }).ok());
  absl::StatusOr<v1::StoreGetResponse> got = get.Get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value(), "10.0.0.1:29500");
  EXPECT_FALSE(wait.answered());  // one key is still missing

  v1::StoreAddRequest add;
  add.set_job_id(job);
  add.set_key("job-1/g1/other");
  add.set_delta(3);
  absl::StatusOr<v1::StoreAddResponse> added = Sync<v1::StoreAddResponse>(
      [&](Done<v1::StoreAddResponse> d) { coordinator_->StoreAdd(add, std::move(d)); });
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(added->value(), 3);
  EXPECT_TRUE(wait.Get().ok());

  v1::StoreGetRequest unknown;
  unknown.set_job_id("job-404");
  unknown.set_key("k");
  EXPECT_EQ(Sync<v1::StoreGetResponse>([&](Done<v1::StoreGetResponse> d) {
              coordinator_->StoreGet(unknown, std::move(d), nullptr);
            })
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

// Catches a rank left waiting in an ended generation's rendezvous until its store timeout, or a
// coordinator that tells generations apart by the key's words instead of the request's field.
TEST_F(StoreCallsTest, RendezvousReadOfAnEndedGenerationIsAbortedByItsGenerationField) {
  const std::string job = Submit(2);
  const std::vector<std::string> ranks = StartWorkers(job, 2);
  auto get = [&](int64_t generation, Call<v1::StoreGetResponse>& call) {
    v1::StoreGetRequest req;
    req.set_job_id(job);
    req.set_key("peer-address");  // no generation in its words
    req.set_generation(generation);
    coordinator_->StoreGet(req, call.done(), std::make_shared<CallHandle>());
  };
  Call<v1::StoreGetResponse> of_generation_1;
  Call<v1::StoreGetResponse> of_none;
  get(1, of_generation_1);
  get(0, of_none);
  EXPECT_FALSE(of_generation_1.answered());  // generation 1 is live: the key is not set yet
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(Heartbeat(job, ranks[0]).ok());
  clock_.Advance(absl::Seconds(5));
  coordinator_->Tick();  // rank 1's lease expired: generation 1 ends
  absl::StatusOr<v1::StoreGetResponse> r = of_generation_1.Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_FALSE(of_none.answered());  // outside any generation: it waits for its key
  Call<v1::StoreGetResponse> late;
  get(1, late);
  EXPECT_EQ(late.Get().status().code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace trainstep
