// A journal written by an earlier coordinator replays, in today's coordinator, to the job that
// coordinator had. testdata/ holds the files a coordinator wrote for a small job (two workers,
// fp16 with an overflow, checkpoints, a lost worker and its replacement, 5 updates) — as one log,
// and as a snapshot plus the log after it — and the state it had replayed them to. Catches a
// change in how a record is read or applied (a renamed meaning, a string that now maps to
// another enum, a default that moved) that would make an upgraded coordinator rebuild a
// different job from the same files. The files are never rewritten: they are the promise.
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_registry.h"
#include "coordinator/journal.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/fault_injection_env.h"

namespace trainstep {
namespace {

constexpr char kDir[] = "/state";

std::string ReadTestData(const std::filesystem::path& path) {
  absl::StatusOr<std::string> bytes = Env::Default()->ReadFile(path.string());
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *std::move(bytes) : std::string();
}

// The job a coordinator restarted on the fixture's files holds: the journal's files copied
// into an Env, recovered by Journal::Open and replayed as the coordinator's start replays them.
v1::CoordinatorSnapshot Replay(const std::string& fixture) {
  InMemoryEnv env;
  EXPECT_TRUE(env.CreateDirs(kDir).ok());
  const std::filesystem::path dir = std::filesystem::path(TRAINSTEP_COORDINATOR_TESTDATA) / fixture;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    auto file = env.NewWritableFile(std::string(kDir) + "/" + entry.path().filename().string());
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return {};
    EXPECT_TRUE((*file)->Append(ReadTestData(entry.path())).ok());
    EXPECT_TRUE((*file)->Sync().ok());
    EXPECT_TRUE((*file)->Close().ok());
  }
  RecoveredJournal recovered;
  absl::StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(&env, kDir, {}, &recovered);
  EXPECT_TRUE(journal.ok()) << journal.status();
  EXPECT_TRUE(recovered.warnings.empty()) << recovered.warnings.front();
  JobRegistry registry(MachineOptions{});
  const absl::Status replayed =
      ReplayJournal(recovered, kDir, absl::FromUnixSeconds(1'700'000'000), &registry);
  EXPECT_TRUE(replayed.ok()) << replayed;
  return registry.Snapshot();
}

// Every field the earlier coordinator's state had, with its value; fields added since (set
// only by today's code) are allowed, changed or missing ones are not.
void ExpectHoldsTheEarlierState(const v1::CoordinatorSnapshot& replayed) {
  v1::CoordinatorSnapshot expected;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      ReadTestData(std::filesystem::path(TRAINSTEP_COORDINATOR_TESTDATA) /
                   "journal_replayed.textproto"),
      &expected));
  ASSERT_GT(expected.ByteSizeLong(), 0u);
  google::protobuf::util::MessageDifferencer differ;
  differ.set_scope(google::protobuf::util::MessageDifferencer::PARTIAL);
  std::string differences;
  differ.ReportDifferencesToString(&differences);
  EXPECT_TRUE(differ.Compare(expected, replayed)) << differences;
}

TEST(JournalCompatTest, AnEarlierLogReplaysToTheSameJob) {
  ExpectHoldsTheEarlierState(Replay("journal_log"));
}

TEST(JournalCompatTest, AnEarlierSnapshotAndTheLogAfterItReplayToTheSameJob) {
  ExpectHoldsTheEarlierState(Replay("journal_snapshot_and_log"));
}

}  // namespace
}  // namespace trainstep
