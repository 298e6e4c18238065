#include "coordinator/journal.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/fault_injection_env.h"
#include "tests/unit/coordinator/sync_gate.h"

namespace trainstep {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr char kDir[] = "/j";

std::string LogPath(int n) { return absl::StrFormat("/j/log-%06d", n); }
std::string SnapshotPath(int n) { return absl::StrFormat("/j/snapshot-%06d", n); }

// The on-disk format, written independently of journal.cc so a shared bug cannot hide.
std::string Fixed32(uint32_t v) {
  std::string out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}
std::string FileHeader(uint32_t kind, uint32_t version = 2) {
  return "TSJOURNL" + Fixed32(version) + Fixed32(kind);
}
std::string LogHeader() { return FileHeader(1); }
// Format 2: length, payload CRC, header CRC, payload, end marker.
std::string Frame(const std::string& payload) {
  std::string header =
      Fixed32(static_cast<uint32_t>(payload.size())) + Fixed32(MaskCrc(Crc32c(payload)));
  header += Fixed32(MaskCrc(Crc32c(header)));
  return header + payload + "\xA5";
}
std::string LogFile(const std::vector<std::string>& records) {
  std::string out = LogHeader();
  for (const std::string& r : records) out += Frame(r);
  return out;
}
std::string SnapshotFile(const std::string& state) { return FileHeader(2) + Frame(state); }
// Format 1 (before the file header and the header checksum): length, payload CRC, payload.
std::string LegacyFrame(const std::string& payload) {
  return Fixed32(static_cast<uint32_t>(payload.size())) + Fixed32(MaskCrc(Crc32c(payload))) +
         payload;
}

std::unique_ptr<Journal> OpenOrDie(Env* env, RecoveredJournal* recovered,
                                   JournalOptions options = {}) {
  auto journal = Journal::Open(env, kDir, std::move(options), recovered);
  EXPECT_TRUE(journal.ok()) << journal.status();
  return journal.ok() ? *std::move(journal) : nullptr;
}

// Appends every record and syncs once.
void AppendAll(Journal* journal, const std::vector<std::string>& records) {
  uint64_t seq = 0;
  for (const std::string& r : records) seq = journal->Append(r);
  ASSERT_TRUE(journal->Sync(seq).ok());
}

// What on_snapshot reported.
struct SnapshotReport {
  absl::Status outcome;
  bool journal_broken;
};

class JournalTest : public ::testing::Test {
 protected:
  // A held snapshot fsync would make ~Journal wait forever after a failed assertion.
  void TearDown() override {
    gate_.Release();
    journal_.reset();
  }
  RecoveredJournal Reopen() {
    RecoveredJournal recovered;
    journal_.reset();
    journal_ = OpenOrDie(&env_, &recovered);
    return recovered;
  }
  // Opens through gate_, recording what on_snapshot reports.
  RecoveredJournal ReopenGated() {
    RecoveredJournal recovered;
    journal_.reset();
    JournalOptions options;
    options.on_snapshot = [this](const absl::Status& outcome, bool broken, double seconds) {
      EXPECT_GE(seconds, 0.0);
      absl::MutexLock lock(&reports_mu_);
      reports_.push_back({outcome, broken});
    };
    journal_ = OpenOrDie(&gate_, &recovered, options);
    return recovered;
  }
  std::vector<SnapshotReport> reports() {
    absl::MutexLock lock(&reports_mu_);
    return reports_;
  }
  std::vector<std::string> Files() { return *env_.ListDir(kDir); }

  FaultInjectionEnv env_;
  SyncGate gate_{&env_};
  absl::Mutex reports_mu_;
  std::vector<SnapshotReport> reports_ ABSL_GUARDED_BY(reports_mu_);
  std::unique_ptr<Journal> journal_;
};

// Catches records lost, reordered or altered by a write/read round trip, and stray warnings.
TEST_F(JournalTest, RoundTripAcrossReopen) {
  RecoveredJournal first = Reopen();
  EXPECT_FALSE(first.snapshot.has_value());
  EXPECT_THAT(first.records, IsEmpty());
  EXPECT_THAT(first.warnings, IsEmpty());
  EXPECT_EQ(journal_->Append("a=1"), 1u);
  EXPECT_EQ(journal_->Append(std::string("b=\0\xff", 4)), 2u);
  EXPECT_EQ(journal_->Append("c=3"), 3u);
  EXPECT_EQ(journal_->last_appended(), 3u);
  ASSERT_TRUE(journal_->Sync(3).ok());
  RecoveredJournal second = Reopen();
  EXPECT_FALSE(second.snapshot.has_value());
  EXPECT_THAT(second.records, ElementsAre("a=1", std::string("b=\0\xff", 4), "c=3"));
  EXPECT_THAT(second.warnings, IsEmpty());
  EXPECT_THAT(Files(), UnorderedElementsAre("log-000001"));
}

// Catches Open truncating or rewriting the log instead of continuing after its last record.
TEST_F(JournalTest, AppendAfterReopenContinuesTheLog) {
  Reopen();
  AppendAll(journal_.get(), {"a", "b"});
  Reopen();
  EXPECT_EQ(journal_->Append("c"), 1u);  // Sequence numbers are per Journal object.
  ASSERT_TRUE(journal_->Sync(1).ok());
  EXPECT_THAT(Reopen().records, ElementsAre("a", "b", "c"));
  EXPECT_EQ(*env_.fs().Contents(LogPath(1)), LogFile({"a", "b", "c"}));
}

// Catches unsynced records leaking to disk when a Journal is destroyed (they were never acked).
TEST_F(JournalTest, UnsyncedRecordsAreNotWrittenOnClose) {
  Reopen();
  AppendAll(journal_.get(), {"a"});
  journal_->Append("never synced");
  EXPECT_THAT(Reopen().records, ElementsAre("a"));
}

// Catches framing bugs that only appear with many records or many batches.
TEST_F(JournalTest, ManyRecords) {
  Reopen();
  std::vector<std::string> expected;
  for (int i = 0; i < 5000; ++i) {
    expected.push_back(absl::StrCat("record-", i, std::string(i % 50, 'x')));
    const uint64_t seq = journal_->Append(expected.back());
    if (i % 97 == 0) {
      ASSERT_TRUE(journal_->Sync(seq).ok());
    }
  }
  ASSERT_TRUE(journal_->Sync(journal_->last_appended()).ok());
  EXPECT_EQ(Reopen().records, expected);
}

// Catches empty records being skipped, merged, or mistaken for a zero-filled torn tail.
TEST_F(JournalTest, EmptyRecordsRoundTrip) {
  Reopen();
  AppendAll(journal_.get(), {"", "x", "", ""});
  RecoveredJournal recovered = Reopen();
  EXPECT_THAT(recovered.records, ElementsAre("", "x", "", ""));
  EXPECT_THAT(recovered.warnings, IsEmpty());
}

// Catches size truncation in the length field or in partial-write handling for large payloads.
TEST_F(JournalTest, MebibyteRecordsAndSnapshot) {
  Reopen();
  std::mt19937 rng(7);
  std::vector<std::string> big(3, std::string(1 << 20, '\0'));
  for (std::string& r : big) {
    for (char& c : r) c = static_cast<char>(rng());
  }
  AppendAll(journal_.get(), big);
  EXPECT_EQ(Reopen().records, big);
  ASSERT_TRUE(journal_->WriteSnapshot(big[0]).ok());
  AppendAll(journal_.get(), {big[1]});
  RecoveredJournal recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, big[0]);
  EXPECT_EQ(recovered.records, std::vector<std::string>{big[1]});
}

// Catches Sync(seq) for a never-appended seq hanging forever instead of failing.
TEST_F(JournalTest, SyncBeyondLastAppendedIsInvalid) {
  Reopen();
  EXPECT_TRUE(journal_->Sync(0).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(journal_->Sync(1)));
  journal_->Append("a");
  EXPECT_TRUE(absl::IsInvalidArgument(journal_->Sync(2)));
  EXPECT_TRUE(journal_->Sync(1).ok());
}

// Catches the snapshot not replacing the records it covers, or old files never deleted.
TEST_F(JournalTest, SnapshotReplacesOlderRecordsAndFiles) {
  Reopen();
  AppendAll(journal_.get(), {"a=1", "b=2"});
  journal_->Append("c=3");  // Pending: WriteSnapshot must sync it first.
  EXPECT_EQ(journal_->records_since_snapshot(), 3u);
  ASSERT_TRUE(journal_->WriteSnapshot("a=1,b=2,c=3").ok());
  EXPECT_EQ(journal_->records_since_snapshot(), 0u);
  EXPECT_THAT(Files(), UnorderedElementsAre("snapshot-000002", "log-000002"));
  AppendAll(journal_.get(), {"d=4"});
  EXPECT_EQ(journal_->records_since_snapshot(), 1u);

  RecoveredJournal recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "a=1,b=2,c=3");
  EXPECT_THAT(recovered.records, ElementsAre("d=4"));
  EXPECT_EQ(journal_->records_since_snapshot(), 1u);

  ASSERT_TRUE(journal_->WriteSnapshot("second").ok());
  EXPECT_THAT(Files(), UnorderedElementsAre("snapshot-000003", "log-000003"));
  recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "second");
  EXPECT_THAT(recovered.records, IsEmpty());
}

// Catches recovery reading a stale snapshot or pre-snapshot logs left by a crash before cleanup,
// and catches temp files being taken for snapshots.
TEST_F(JournalTest, IgnoresAndDeletesObsoleteAndTempFiles) {
  ASSERT_TRUE(env_.CreateDirs(kDir).ok());
  auto put = [&](const std::string& path, const std::string& data) {
    auto f = env_.NewWritableFile(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Append(data).ok());
  };
  put(SnapshotPath(2), SnapshotFile("old snapshot"));
  put(LogPath(2), LogFile({"old record"}));
  put(SnapshotPath(3), SnapshotFile("new snapshot"));
  put(LogPath(3), LogFile({"new record"}));
  put(SnapshotPath(4) + ".tmp", "half a snap");
  put("/j/notes.txt", "not ours");
  put("/j/log-03", LogFile({"not canonical"}));
  RecoveredJournal recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "new snapshot");
  EXPECT_THAT(recovered.records, ElementsAre("new record"));
  EXPECT_THAT(Files(),
              UnorderedElementsAre("snapshot-000003", "log-000003", "notes.txt", "log-03"));
}

// Catches a snapshot whose log was never created (crash right after the rename) being unusable.
TEST_F(JournalTest, SnapshotWithoutItsLogStartsThatLog) {
  ASSERT_TRUE(env_.CreateDirs(kDir).ok());
  ASSERT_TRUE(env_.NewWritableFile(SnapshotPath(5)).ok());
  env_.fs().SetContents(SnapshotPath(5), SnapshotFile("state"));
  RecoveredJournal recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "state");
  AppendAll(journal_.get(), {"x"});
  EXPECT_EQ(*env_.fs().Contents(LogPath(5)), LogFile({"x"}));
}

// Catches recovery skipping over a missing log, which would silently lose its records.
TEST_F(JournalTest, MissingLogRefusesToOpen) {
  ASSERT_TRUE(env_.CreateDirs(kDir).ok());
  ASSERT_TRUE(env_.NewWritableFile(LogPath(2)).ok());
  auto journal = Journal::Open(&env_, kDir, {}, nullptr);
  EXPECT_TRUE(absl::IsDataLoss(journal.status())) << journal.status();
  EXPECT_THAT(std::string(journal.status().message()), HasSubstr("log-000001 is missing"));
}

// Catches bit rot in the middle being treated as a torn tail (dropping acknowledged records).
TEST_F(JournalTest, CorruptionInTheMiddleRefusesToOpen) {
  Reopen();
  AppendAll(journal_.get(), {"first", "second", "third"});
  journal_.reset();
  const size_t second_at = LogHeader().size() + Frame("first").size();
  env_.fs().CorruptByte(LogPath(1), second_at + 12 + 2);
  const std::string corrupted = *env_.fs().Contents(LogPath(1));
  auto journal = Journal::Open(&env_, kDir, {}, nullptr);
  ASSERT_TRUE(absl::IsDataLoss(journal.status())) << journal.status();
  const std::string message(journal.status().message());
  EXPECT_THAT(message, HasSubstr(LogPath(1)));
  EXPECT_THAT(message, HasSubstr(absl::StrCat("offset ", second_at)));
  EXPECT_THAT(message, HasSubstr("checksum mismatch"));
  EXPECT_THAT(message, HasSubstr("repaired or restored by hand"));
  EXPECT_EQ(*env_.fs().Contents(LogPath(1)), corrupted);  // Left untouched.
}

// Catches a corrupt snapshot being ignored in favour of an empty state.
TEST_F(JournalTest, CorruptSnapshotRefusesToOpen) {
  Reopen();
  ASSERT_TRUE(journal_->WriteSnapshot("state").ok());
  journal_.reset();
  env_.fs().CorruptByte(SnapshotPath(2), 16 + 12 + 1);
  auto journal = Journal::Open(&env_, kDir, {}, nullptr);
  ASSERT_TRUE(absl::IsDataLoss(journal.status())) << journal.status();
  EXPECT_THAT(std::string(journal.status().message()), HasSubstr(SnapshotPath(2)));
  // A snapshot is never torn (it is fsynced before its rename), so truncation is corruption too.
  env_.fs().SetContents(SnapshotPath(2), SnapshotFile("state").substr(0, 30));
  EXPECT_TRUE(absl::IsDataLoss(Journal::Open(&env_, kDir, {}, nullptr).status()));
}

// Catches a torn record in an older log being dropped; only the newest log may have a torn tail.
TEST_F(JournalTest, TornRecordInOlderLogRefusesToOpen) {
  ASSERT_TRUE(env_.CreateDirs(kDir).ok());
  ASSERT_TRUE(env_.NewWritableFile(LogPath(1)).ok());
  ASSERT_TRUE(env_.NewWritableFile(LogPath(2)).ok());
  env_.fs().SetContents(LogPath(1), LogFile({"a"}) + Frame("b").substr(0, 5));
  env_.fs().SetContents(LogPath(2), LogFile({"c"}));
  auto journal = Journal::Open(&env_, kDir, {}, nullptr);
  ASSERT_TRUE(absl::IsDataLoss(journal.status())) << journal.status();
  EXPECT_THAT(std::string(journal.status().message()), HasSubstr(LogPath(1)));
  EXPECT_THAT(std::string(journal.status().message()), HasSubstr("offset 30"));
  env_.fs().SetContents(LogPath(1), LogFile({"a", "b"}));
  EXPECT_THAT(Reopen().records, ElementsAre("a", "b", "c"));
}

// Catches each kind of torn tail either refusing to open or not being truncated away, which
// would make the next append land after garbage, and catches dropped bytes that are not
// kept aside (a misjudged tail would then be lost for good).
TEST_F(JournalTest, TornTailIsDroppedWithWarningKeptAsideAndTruncated) {
  const std::string intact = LogFile({"a=1", "b=2"});
  const std::string next = Frame("c=3");
  const std::string zeros(20, '\0');
  struct Case {
    const char* name;
    std::string tail;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {"partial header", next.substr(0, 5), "incomplete record header"},
      {"partial header then zeros", next.substr(0, 7) + zeros, "incomplete record header"},
      {"payload past EOF", next.substr(0, 14), "runs past end of file"},
      {"end marker past EOF", next.substr(0, next.size() - 1), "runs past end of file"},
      {"zero fill", zeros, "only zero bytes"},
      {"short zero fill", zeros.substr(0, 3), "only zero bytes"},
      {"zero-filled payload", next.substr(0, 12) + std::string(next.size() - 12, '\0'),
       "checksum mismatch"},
      {"payload cut, then zeros", next.substr(0, 13) + zeros, "checksum mismatch"},
      {"end marker zero", next.substr(0, next.size() - 1) + '\0' + zeros, "lacks its end marker"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FaultInjectionEnv env;
    ASSERT_TRUE(env.CreateDirs(kDir).ok());
    ASSERT_TRUE(env.NewWritableFile(LogPath(1)).ok());
    env.fs().SetContents(LogPath(1), intact + c.tail);
    RecoveredJournal recovered;
    std::unique_ptr<Journal> journal = OpenOrDie(&env, &recovered);
    ASSERT_NE(journal, nullptr);
    EXPECT_THAT(recovered.records, ElementsAre("a=1", "b=2"));
    ASSERT_EQ(recovered.warnings.size(), 1u);
    EXPECT_THAT(recovered.warnings[0],
                HasSubstr(absl::StrCat("dropped torn record at ", LogPath(1), " offset ",
                                       intact.size(), " (", c.tail.size(), " bytes)")));
    EXPECT_THAT(recovered.warnings[0], HasSubstr(c.reason));
    EXPECT_EQ(env.fs().SyncedContents(LogPath(1)), intact);  // Truncated durably.
    const std::string aside = absl::StrCat(LogPath(1), ".torn-", intact.size());
    if (c.tail.find_first_not_of('\0') == std::string::npos) {
      EXPECT_FALSE(env.fs().Contents(aside).has_value());  // Nothing but zeros: nothing kept.
    } else {
      EXPECT_THAT(recovered.warnings[0], HasSubstr(absl::StrCat("kept in ", aside)));
      EXPECT_EQ(env.fs().SyncedContents(aside), c.tail);
    }
    AppendAll(journal.get(), {"d=4"});
    journal.reset();
    journal = OpenOrDie(&env, &recovered);
    EXPECT_THAT(recovered.records, ElementsAre("a=1", "b=2", "d=4"));
    EXPECT_THAT(recovered.warnings, IsEmpty());
  }
}

// Catches a second torn tail at the same offset (crash, recovery, crash again) overwriting
// the bytes kept from the first.
TEST_F(JournalTest, TornTailsAtTheSameOffsetAreAllKept) {
  const std::string intact = LogFile({"a"});
  ASSERT_TRUE(env_.CreateDirs(kDir).ok());
  ASSERT_TRUE(env_.NewWritableFile(LogPath(1)).ok());
  const std::string aside = absl::StrCat(LogPath(1), ".torn-", intact.size());
  for (const std::string& tail : {Frame("first").substr(0, 9), Frame("second").substr(0, 10)}) {
    journal_.reset();
    env_.fs().SetContents(LogPath(1), intact + tail);
    EXPECT_THAT(Reopen().records, ElementsAre("a"));
  }
  EXPECT_EQ(*env_.fs().Contents(aside), Frame("first").substr(0, 9));
  EXPECT_EQ(*env_.fs().Contents(aside + ".1"), Frame("second").substr(0, 10));
}

// Each case is damage a crash cannot produce (it only cuts an append short or leaves zeros),
// so Open must refuse, name the file and the offset, and change nothing. Catches the bugs a
// probe found in format 1: one flipped length byte emptied the log (the length "ran past
// EOF"), a random-bytes file became 0 bytes, and a corrupted last record was dropped although
// it had been acknowledged.
TEST_F(JournalTest, DamageACrashCannotCauseRefusesToOpenAndChangesNothing) {
  const std::vector<std::string> records = {"first record", "second record", "third record"};
  const std::string good = LogFile(records);
  const size_t first_at = LogHeader().size();
  const size_t second_at = first_at + Frame(records[0]).size();
  const size_t third_at = second_at + Frame(records[1]).size();
  std::mt19937 rng(11);
  std::string random(4096, '\0');
  for (char& ch : random) ch = static_cast<char>(rng());
  struct Case {
    const char* name;
    std::string contents;
    size_t offset;
    const char* problem;
  };
  auto flip = [&good](size_t at, char mask) {
    std::string s = good;
    s[at] ^= mask;
    return s;
  };
  const std::vector<Case> cases = {
      {"first length, high byte", flip(first_at + 3, '\xff'), first_at, "header checksum"},
      {"second length, low byte", flip(second_at, 0x01), second_at, "header checksum"},
      {"second payload CRC", flip(second_at + 5, 0x10), second_at, "header checksum"},
      {"middle payload byte", flip(second_at + 12 + 3, 0x40), second_at, "checksum mismatch"},
      {"last record's payload", flip(third_at + 12 + 3, 0x40), third_at,
       "all its bytes are present"},
      {"last record's end marker", flip(good.size() - 1, 0x01), third_at, "lacks its end marker"},
      {"bad record, then data",
       good.substr(0, third_at) + Frame("x").substr(0, 12) + "y\xA5" + std::string(4, '\0') + "z",
       third_at, "checksum mismatch"},
      {"random bytes", random, 0, "not a journal file"},
      {"header, then random bytes", LogHeader() + random, first_at, "header checksum"},
      {"damaged file header", flip(2, 0x20), 0, "not a journal file"},
      {"newer format", FileHeader(1, 3) + Frame("a"), 8, "written by a newer trainstep"},
      {"a snapshot as a log", FileHeader(2) + Frame("a"), 12, "expected a log file"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FaultInjectionEnv env;
    ASSERT_TRUE(env.CreateDirs(kDir).ok());
    ASSERT_TRUE(env.NewWritableFile(LogPath(1)).ok());
    env.fs().SetContents(LogPath(1), c.contents);
    auto journal = Journal::Open(&env, kDir, {}, nullptr);
    ASSERT_TRUE(absl::IsDataLoss(journal.status())) << journal.status();
    const std::string message(journal.status().message());
    EXPECT_THAT(message,
                HasSubstr(absl::StrCat(LogPath(1), " is damaged at byte offset ", c.offset, ":")));
    EXPECT_THAT(message, HasSubstr(c.problem));
    EXPECT_THAT(message, HasSubstr("nothing was changed"));
    EXPECT_EQ(*env.fs().Contents(LogPath(1)), c.contents);
    EXPECT_THAT(*env.ListDir(kDir), ElementsAre("log-000001"));
  }
}

// Catches a newest log whose creation was cut short (its file header incomplete or zeroed)
// refusing to open, or later appends landing after the broken header.
TEST_F(JournalTest, TornFileHeaderOfNewestLogIsRewritten) {
  for (const std::string& contents :
       {std::string(), LogHeader().substr(0, 5), LogHeader().substr(0, 9) + std::string(7, '\0'),
        std::string(16, '\0'), std::string(40, '\0')}) {
    SCOPED_TRACE(contents.size());
    FaultInjectionEnv env;
    ASSERT_TRUE(env.CreateDirs(kDir).ok());
    ASSERT_TRUE(env.NewWritableFile(LogPath(1)).ok());
    env.fs().SetContents(LogPath(1), contents);
    RecoveredJournal recovered;
    std::unique_ptr<Journal> journal = OpenOrDie(&env, &recovered);
    ASSERT_NE(journal, nullptr);
    EXPECT_THAT(recovered.records, IsEmpty());
    AppendAll(journal.get(), {"a"});
    EXPECT_EQ(env.fs().SyncedContents(LogPath(1)), LogFile({"a"}));
  }
}

// Catches journals written before the format change becoming unreadable, records of both
// formats mixed in one file, or a format-1 torn tail / damaged length handled like format 2.
TEST_F(JournalTest, Format1JournalIsReadAndContinuedInFormat2) {
  ASSERT_TRUE(env_.CreateDirs(kDir).ok());
  ASSERT_TRUE(env_.NewWritableFile(SnapshotPath(2)).ok());
  ASSERT_TRUE(env_.NewWritableFile(LogPath(2)).ok());
  env_.fs().SetContents(SnapshotPath(2), LegacyFrame("state"));
  env_.fs().SetContents(LogPath(2), LegacyFrame("a") + LegacyFrame("") + LegacyFrame("b"));
  RecoveredJournal recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "state");
  EXPECT_THAT(recovered.records, ElementsAre("a", "", "b"));
  ASSERT_EQ(recovered.warnings.size(), 1u);
  EXPECT_THAT(recovered.warnings[0], HasSubstr("format 1"));
  AppendAll(journal_.get(), {"c"});
  EXPECT_EQ(*env_.fs().Contents(LogPath(2)),
            LegacyFrame("a") + LegacyFrame("") + LegacyFrame("b"));  // Never appended to.
  EXPECT_EQ(*env_.fs().Contents(LogPath(3)), LogFile({"c"}));
  recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "state");
  EXPECT_THAT(recovered.records, ElementsAre("a", "", "b", "c"));
  EXPECT_THAT(recovered.warnings, IsEmpty());
  ASSERT_TRUE(journal_->WriteSnapshot("state2").ok());
  EXPECT_THAT(Files(), UnorderedElementsAre("snapshot-000004", "log-000004"));
}

// Catches a journal that recovers once and then refuses to open: a format-1 log whose only
// record was torn was truncated to 0 bytes and left as an old log without a file header, which
// the next Open took for damage (found by journal_fuzz; tests/fuzz/corpus/journal/ has it).
TEST_F(JournalTest, Format1LogWithOnlyATornRecordStaysOpenable) {
  ASSERT_TRUE(env_.CreateDirs(kDir).ok());
  ASSERT_TRUE(env_.NewWritableFile(LogPath(1)).ok());
  env_.fs().SetContents(LogPath(1), LegacyFrame("lost").substr(0, 6));
  RecoveredJournal recovered = Reopen();
  EXPECT_THAT(recovered.records, IsEmpty());
  ASSERT_EQ(recovered.warnings.size(), 1u);
  EXPECT_THAT(recovered.warnings[0], HasSubstr("dropped torn record"));
  AppendAll(journal_.get(), {"a"});
  EXPECT_EQ(*env_.fs().Contents(LogPath(1)), LogFile({"a"}));  // Now a format-2 log.
  recovered = Reopen();
  EXPECT_THAT(recovered.records, ElementsAre("a"));
  EXPECT_THAT(recovered.warnings, IsEmpty());
}

// Format 1 could not protect its lengths; catches its damage being judged as loosely as
// before (a flipped length dropping every later record) or a real torn tail refusing to open.
TEST_F(JournalTest, Format1DamageIsJudgedStrictly) {
  const std::string a = LegacyFrame("first"), b = LegacyFrame("second"), c = LegacyFrame("third");
  const std::string good = a + b + c;
  std::mt19937 rng(5);
  std::string random(4096, '\0');
  for (char& ch : random) ch = static_cast<char>(rng());
  auto flip = [&good](size_t at, char mask) {
    std::string s = good;
    s[at] ^= mask;
    return s;
  };
  struct Refused {
    const char* name;
    std::string contents;
    size_t offset;
  };
  for (const Refused& r : std::vector<Refused>{
           {"first length, high byte", flip(3, '\xff'), 0},
           {"second length, high byte", flip(a.size() + 3, '\x7f'), a.size()},
           {"last record's payload", flip(good.size() - 2, 0x40), a.size() + b.size()},
           {"random bytes", random, 0},
       }) {
    SCOPED_TRACE(r.name);
    FaultInjectionEnv env;
    ASSERT_TRUE(env.CreateDirs(kDir).ok());
    ASSERT_TRUE(env.NewWritableFile(LogPath(1)).ok());
    env.fs().SetContents(LogPath(1), r.contents);
    auto journal = Journal::Open(&env, kDir, {}, nullptr);
    ASSERT_TRUE(absl::IsDataLoss(journal.status())) << journal.status();
    EXPECT_THAT(std::string(journal.status().message()),
                HasSubstr(absl::StrCat("damaged at byte offset ", r.offset, ":")));
    EXPECT_EQ(*env.fs().Contents(LogPath(1)), r.contents);
  }

  // A torn tail: kept aside, cut off, and the journal continues in a format-2 log.
  ASSERT_TRUE(env_.CreateDirs(kDir).ok());
  ASSERT_TRUE(env_.NewWritableFile(LogPath(1)).ok());
  const std::string tail = c.substr(0, c.size() - 2);
  env_.fs().SetContents(LogPath(1), a + b + tail);
  RecoveredJournal recovered = Reopen();
  EXPECT_THAT(recovered.records, ElementsAre("first", "second"));
  ASSERT_EQ(recovered.warnings.size(), 2u);
  EXPECT_THAT(recovered.warnings[0], HasSubstr("runs past end of file"));
  EXPECT_EQ(*env_.fs().Contents(absl::StrCat(LogPath(1), ".torn-", a.size() + b.size())), tail);
  EXPECT_EQ(env_.fs().SyncedContents(LogPath(1)), a + b);
  AppendAll(journal_.get(), {"fourth"});
  EXPECT_THAT(Reopen().records, ElementsAre("first", "second", "fourth"));
}

// Catches a failed fsync being reported as success, or the journal carrying on after it
// (fsync failure leaves the page cache state unknown: retrying can report false durability).
TEST_F(JournalTest, FsyncFailureBreaksTheJournal) {
  Reopen();
  AppendAll(journal_.get(), {"a"});
  env_.FailNext(FsOp::kSync, absl::DataLossError("fsync /j/log-000001: Input/output error"));
  const uint64_t seq = journal_->Append("b");
  absl::Status s = journal_->Sync(seq);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("Input/output error"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("accepts no more writes"));
  EXPECT_EQ(journal_->Sync(seq).code(), s.code());  // Retrying does not pretend success.
  const int syncs = env_.count(FsOp::kSync);
  EXPECT_FALSE(journal_->Sync(journal_->Append("c")).ok());
  EXPECT_FALSE(journal_->WriteSnapshot("state").ok());
  EXPECT_EQ(env_.count(FsOp::kSync), syncs);  // Nothing more was attempted.
}

// Catches a journal mended by writing on in the log whose fsync failed (its pages may be lost
// although a retried fsync reports success), a resume that loses or repeats a record, and one
// that reports success while the disk still fails.
TEST_F(JournalTest, ResumeWritesTheStateToAFreshLogAndNeverTrustsTheFailedOne) {
  Reopen();
  AppendAll(journal_.get(), {"a"});
  env_.FailNext(FsOp::kSync, absl::DataLossError("fsync /j/log-000001: Input/output error"));
  const uint64_t b = journal_->Append("b");
  ASSERT_FALSE(journal_->Sync(b).ok());
  EXPECT_FALSE(journal_->broken().ok());

  env_.FailNext(FsOp::kAppend, absl::ResourceExhaustedError("write: No space left on device"));
  absl::Status failed = journal_->Resume("a,b");
  EXPECT_TRUE(absl::IsResourceExhausted(failed)) << failed;
  EXPECT_FALSE(journal_->broken().ok());  // still broken: nothing was mended
  EXPECT_FALSE(journal_->Sync(b).ok());
  EXPECT_THAT(Files(), UnorderedElementsAre("log-000001"));  // no temp left behind

  ASSERT_TRUE(journal_->Resume("a,b").ok());
  EXPECT_TRUE(journal_->broken().ok());
  EXPECT_TRUE(journal_->Sync(b).ok());  // the snapshot holds it
  EXPECT_EQ(journal_->records_since_snapshot(), 0u);
  EXPECT_THAT(Files(), UnorderedElementsAre("snapshot-000002", "log-000002"));
  AppendAll(journal_.get(), {"c"});
  RecoveredJournal recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "a,b");
  EXPECT_THAT(recovered.records, ElementsAre("c"));
  EXPECT_TRUE(journal_->Resume("ignored").ok());  // a healthy journal: nothing to do
  EXPECT_THAT(Files(), UnorderedElementsAre("snapshot-000002", "log-000002"));
}

// Catches a resume that writes its new log before the snapshot: a crash between the two would
// leave the failed log followed by an empty one, and Open would replay the failed one's
// unknown tail. The directory fsync after the rename fails, as a crash there would leave it.
TEST_F(JournalTest, AResumeCutShortAfterItsSnapshotRecoversTheSnapshot) {
  Reopen();
  AppendAll(journal_.get(), {"a"});
  env_.FailNext(FsOp::kAppend, absl::ResourceExhaustedError("write: No space left on device"));
  ASSERT_FALSE(journal_->Sync(journal_->Append("b")).ok());
  env_.FailNext(FsOp::kSyncDir, absl::InternalError("fsync dir failed"));
  ASSERT_FALSE(journal_->Resume("a,b").ok());
  RecoveredJournal recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "a,b");
  EXPECT_THAT(recovered.records, IsEmpty());
  AppendAll(journal_.get(), {"c"});
  EXPECT_THAT(Reopen().records, ElementsAre("c"));
}

// Catches a failed write being followed by an fsync that then "acknowledges" missing records.
TEST_F(JournalTest, WriteFailureBreaksTheJournal) {
  Reopen();
  const int syncs = env_.count(FsOp::kSync);  // Open synced the new log's file header.
  env_.FailNext(FsOp::kAppend, absl::ResourceExhaustedError("write /j/log-000001: No space left"));
  absl::Status s = journal_->Sync(journal_->Append("a"));
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_EQ(env_.count(FsOp::kSync), syncs);
  EXPECT_FALSE(journal_->Sync(journal_->Append("b")).ok());
}

// Catches a snapshot failure before the rename wrongly breaking the journal, leaving a
// half-written snapshot behind, counting the records it failed to cover as covered, or leaving
// a state the next snapshot cannot supersede.
TEST_F(JournalTest, SnapshotFailureBeforeRenameKeepsJournalUsable) {
  ReopenGated();
  AppendAll(journal_.get(), {"a"});
  gate_.FailNext(absl::InternalError("fsync of temp failed"));
  absl::Status s = journal_->WriteSnapshot("state");
  EXPECT_THAT(std::string(s.message()), HasSubstr("fsync of temp failed"));
  // The log rotated before the snapshot was written: log-000002 takes what follows.
  EXPECT_THAT(Files(), UnorderedElementsAre("log-000001", "log-000002"));
  EXPECT_EQ(journal_->records_since_snapshot(), 1u);
  ASSERT_EQ(reports().size(), 1u);
  EXPECT_FALSE(reports()[0].outcome.ok());
  EXPECT_FALSE(reports()[0].journal_broken);
  AppendAll(journal_.get(), {"b"});
  EXPECT_EQ(journal_->records_since_snapshot(), 2u);
  EXPECT_EQ(*env_.fs().Contents(LogPath(2)), LogFile({"b"}));
  RecoveredJournal recovered = ReopenGated();
  EXPECT_FALSE(recovered.snapshot.has_value());
  EXPECT_THAT(recovered.records, ElementsAre("a", "b"));

  // The next snapshot covers both logs and deletes them.
  ASSERT_TRUE(journal_->WriteSnapshot("a,b").ok());
  EXPECT_THAT(Files(), UnorderedElementsAre("snapshot-000003", "log-000003"));
  EXPECT_EQ(journal_->records_since_snapshot(), 0u);
  recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "a,b");
  EXPECT_THAT(recovered.records, IsEmpty());
}

// Catches the journal appending to the old log after a failure past the rename (recovery would
// then prefer the new snapshot and drop those records), or on_snapshot not saying the owner
// must stop. The directory fsync after the rename fails; the rotation's own succeeded.
TEST_F(JournalTest, SnapshotFailureAfterRenameBreaksJournal) {
  ReopenGated();
  AppendAll(journal_.get(), {"a"});
  gate_.HoldNext();
  ASSERT_TRUE(journal_->StartSnapshot("state").ok());
  gate_.WaitUntilHeld();  // The rotation's SyncDir is done; the next one follows the rename.
  env_.FailNext(FsOp::kSyncDir, absl::InternalError("fsync dir failed"));
  gate_.Release();
  absl::Status s = journal_->WaitForSnapshot();
  EXPECT_THAT(std::string(s.message()), HasSubstr("fsync dir failed"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("accepts no more writes"));
  ASSERT_EQ(reports().size(), 1u);
  EXPECT_TRUE(reports()[0].journal_broken);
  EXPECT_FALSE(journal_->Sync(journal_->Append("b")).ok());
  RecoveredJournal recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "state");
  EXPECT_THAT(recovered.records, IsEmpty());
}

// Catches a failure to start the next log being survived: the records after the rotation point
// would then be written to the old log, or acknowledged without a durable log to hold them.
TEST_F(JournalTest, SnapshotFailureStartingTheNextLogBreaksJournal) {
  for (FsOp::Kind kind : {FsOp::kCreate, FsOp::kSync, FsOp::kSyncDir}) {
    SCOPED_TRACE(kind);
    FaultInjectionEnv env;
    std::unique_ptr<Journal> journal = OpenOrDie(&env, nullptr);
    ASSERT_NE(journal, nullptr);
    AppendAll(journal.get(), {"a"});
    env.FailNext(kind, absl::InternalError("cannot start log-000002"));
    absl::Status s = journal->WriteSnapshot("state");
    EXPECT_THAT(std::string(s.message()), HasSubstr("accepts no more writes"));
    EXPECT_FALSE(journal->Sync(journal->Append("b")).ok());
    journal.reset();
    RecoveredJournal recovered;
    journal = OpenOrDie(&env, &recovered);
    EXPECT_FALSE(recovered.snapshot.has_value());
    EXPECT_THAT(recovered.records, ElementsAre("a"));
  }
}

// The bug this guards against: a snapshot written while holding the writer role (as WriteSnapshot
// did, under the coordinator's lock) makes every Append + Sync wait for the snapshot's write,
// fsync, rename and directory fsync. Here the snapshot's fsync is held open; a Sync on another
// thread must still complete. The bounded wait only turns such a stall into a failure instead
// of a hang; it times nothing.
TEST_F(JournalTest, SyncCompletesWhileASnapshotIsBeingWritten) {
  ReopenGated();
  AppendAll(journal_.get(), {"a"});
  gate_.HoldNext();
  ASSERT_TRUE(journal_->StartSnapshot("a").ok());
  gate_.WaitUntilHeld();
  EXPECT_TRUE(journal_->snapshot_in_progress());
  absl::Notification synced;
  absl::Status result;
  std::thread rpc([&] {
    result = journal_->Sync(journal_->Append("b"));
    synced.Notify();
  });
  const bool in_time = synced.WaitForNotificationWithTimeout(absl::Seconds(60));
  EXPECT_TRUE(journal_->snapshot_in_progress());  // Still held: the Sync did not wait for it.
  gate_.Release();
  rpc.join();
  EXPECT_TRUE(in_time) << "Sync waited for the snapshot";
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_TRUE(journal_->WaitForSnapshot().ok());
}

// Catches records appended while a snapshot is written landing in the log the snapshot makes
// obsolete (lost at the next Open), being counted as covered by it, or being acknowledged
// before they are durable in the new log.
TEST_F(JournalTest, RecordsAppendedDuringASnapshotLandInTheNextLog) {
  ReopenGated();
  AppendAll(journal_.get(), {"a"});
  journal_->Append("b");  // Pending: it belongs to log-000001, which the snapshot covers.
  gate_.HoldNext();
  ASSERT_TRUE(journal_->StartSnapshot("a,b").ok());
  journal_->Append("c");
  gate_.WaitUntilHeld();
  AppendAll(journal_.get(), {"d"});
  EXPECT_EQ(env_.fs().SyncedContents(LogPath(1)), LogFile({"a", "b"}));
  EXPECT_EQ(env_.fs().SyncedContents(LogPath(2)), LogFile({"c", "d"}));
  EXPECT_EQ(journal_->records_since_snapshot(), 4u);  // Not in place yet.
  gate_.Release();
  ASSERT_TRUE(journal_->WaitForSnapshot().ok());
  EXPECT_EQ(journal_->records_since_snapshot(), 2u);
  EXPECT_THAT(Files(), UnorderedElementsAre("snapshot-000002", "log-000002"));
  AppendAll(journal_.get(), {"e"});
  RecoveredJournal recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "a,b");
  EXPECT_THAT(recovered.records, ElementsAre("c", "d", "e"));
  EXPECT_EQ(journal_->records_since_snapshot(), 3u);
}

// Catches a second snapshot started over a running one: two rotations with one snapshot, a
// snapshot numbered for a log it does not precede, or two threads writing temp files.
TEST_F(JournalTest, StartSnapshotWhileOneRunsStartsNothing) {
  ReopenGated();
  AppendAll(journal_.get(), {"a"});
  gate_.HoldNext();
  ASSERT_TRUE(journal_->StartSnapshot("first").ok());
  gate_.WaitUntilHeld();
  AppendAll(journal_.get(), {"b"});
  EXPECT_TRUE(journal_->StartSnapshot("second").ok());
  EXPECT_TRUE(journal_->snapshot_in_progress());
  gate_.Release();
  ASSERT_TRUE(journal_->WaitForSnapshot().ok());
  EXPECT_FALSE(journal_->snapshot_in_progress());
  ASSERT_EQ(reports().size(), 1u);
  EXPECT_TRUE(reports()[0].outcome.ok());
  EXPECT_THAT(Files(), UnorderedElementsAre("snapshot-000002", "log-000002"));
  AppendAll(journal_.get(), {"c"});
  RecoveredJournal recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "first");
  EXPECT_THAT(recovered.records, ElementsAre("b", "c"));
}

// Catches ~Journal abandoning a snapshot still being written (its thread outliving the object,
// or the snapshot never put in place).
TEST_F(JournalTest, DestructorFinishesARunningSnapshot) {
  Reopen();
  AppendAll(journal_.get(), {"a"});
  ASSERT_TRUE(journal_->StartSnapshot("a").ok());
  RecoveredJournal recovered = Reopen();
  EXPECT_EQ(recovered.snapshot, "a");
  EXPECT_THAT(recovered.records, IsEmpty());
}

// Catches StartSnapshot rotating the log, or starting a thread, on a journal that can no
// longer write.
TEST_F(JournalTest, StartSnapshotOnABrokenJournalStartsNothing) {
  Reopen();
  AppendAll(journal_.get(), {"a"});
  env_.FailNext(FsOp::kSync, absl::DataLossError("fsync: Input/output error"));
  EXPECT_FALSE(journal_->Sync(journal_->Append("b")).ok());
  EXPECT_THAT(std::string(journal_->StartSnapshot("state").message()),
              HasSubstr("accepts no more writes"));
  EXPECT_FALSE(journal_->snapshot_in_progress());
  EXPECT_THAT(Files(), UnorderedElementsAre("log-000001"));
}

// Counts which threads start the logs after log-000001 (Open's): a writer thread of the test
// (a Sync doing a snapshot's rotation) or another (the snapshot thread).
class LogStartCounter : public EnvWrapper {
 public:
  explicit LogStartCounter(Env* target) : EnvWrapper(target) {}
  void AddWriter(std::thread::id id) {
    absl::MutexLock lock(&mu_);
    writers_.push_back(id);
  }
  int by_writers() {
    absl::MutexLock lock(&mu_);
    return by_writers_;
  }
  int by_others() {
    absl::MutexLock lock(&mu_);
    return by_others_;
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    if (path.find("/log-") != std::string::npos && path.find("/log-000001") == std::string::npos) {
      absl::MutexLock lock(&mu_);
      const bool writer =
          std::find(writers_.begin(), writers_.end(), std::this_thread::get_id()) != writers_.end();
      ++(writer ? by_writers_ : by_others_);
    }
    return EnvWrapper::NewWritableFile(path);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::thread::id> writers_ ABSL_GUARDED_BY(mu_);
  int by_writers_ ABSL_GUARDED_BY(mu_) = 0;
  int by_others_ ABSL_GUARDED_BY(mu_) = 0;
};

// Catches races between snapshots and concurrent writers: records lost or duplicated across a
// rotation (whichever writer, a Sync or the snapshot thread, performs it), a snapshot that does
// not match the log it precedes, or records_since_snapshot drifting. Appends and StartSnapshot
// share a lock, as in the coordinator; Syncs run outside it. Which thread rotates is up to the
// scheduler; the test records how often each did, and asserts only the outcome.
TEST_F(JournalTest, ConcurrentSnapshotsAndWritersStress) {
  LogStartCounter counter(&env_);
  journal_ = OpenOrDie(&counter, nullptr);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  absl::Mutex caller_mu;              // The coordinator's lock.
  std::vector<std::string> appended;  // Guarded by caller_mu.
  std::atomic<int> failures{0};
  std::atomic<bool> writers_done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      counter.AddWriter(std::this_thread::get_id());
      for (int i = 0; i < kPerThread; ++i) {
        uint64_t seq;
        {
          absl::MutexLock lock(&caller_mu);
          appended.push_back(absl::StrCat(t, ":", i));
          seq = journal_->Append(appended.back());
        }
        if (!journal_->Sync(seq).ok()) ++failures;
      }
    });
  }
  int snapshots = 0;
  size_t last_covered = 0;  // Records the last snapshot covers.
  std::thread snapshotter([&] {
    do {
      size_t covers;
      {
        absl::MutexLock lock(&caller_mu);
        // The state after every record so far: how many there are.
        covers = appended.size();
        if (!journal_->StartSnapshot(absl::StrCat(covers)).ok()) ++failures;
      }
      if (!journal_->WaitForSnapshot().ok()) ++failures;
      last_covered = covers;
      ++snapshots;
    } while (!writers_done.load());
  });
  for (std::thread& t : threads) t.join();
  writers_done.store(true);
  snapshotter.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(snapshots, 0);
  RecordProperty("snapshots", snapshots);
  RecordProperty("rotations_by_syncs", counter.by_writers());
  RecordProperty("rotations_by_snapshot_thread", counter.by_others());
  EXPECT_EQ(journal_->records_since_snapshot(), appended.size() - last_covered);
  journal_.reset();  // Before `counter` goes.

  RecoveredJournal recovered = Reopen();
  size_t covered = 0;
  if (recovered.snapshot.has_value()) {
    ASSERT_TRUE(absl::SimpleAtoi(*recovered.snapshot, &covered)) << *recovered.snapshot;
  }
  EXPECT_EQ(covered, last_covered);
  ASSERT_EQ(covered + recovered.records.size(), appended.size());
  for (size_t i = 0; i < recovered.records.size(); ++i) {
    ASSERT_EQ(recovered.records[i], appended[covered + i]) << "record " << covered + i;
  }
}

// Catches the metrics hook never firing, firing per record instead of per fsync, or reporting
// a negative latency.
TEST_F(JournalTest, OnFsyncHookReportsEachGroupCommit) {
  std::vector<double> seconds;
  JournalOptions options;
  options.on_fsync = [&seconds](double s) { seconds.push_back(s); };
  RecoveredJournal recovered;
  journal_ = OpenOrDie(&env_, &recovered, options);
  AppendAll(journal_.get(), {"a", "b", "c"});
  AppendAll(journal_.get(), {"d"});
  ASSERT_EQ(seconds.size(), 2u);
  for (double s : seconds) EXPECT_GE(s, 0.0);
}

// Catches group commit degenerating to one fsync per record, or a Sync returning before its
// record is durable. The first fsync is held open until every thread has appended, so the
// grouping is deterministic.
TEST_F(JournalTest, GroupCommitSharesFsyncs) {
  Reopen();
  const int syncs_before = env_.count(FsOp::kSync);
  const int appends_before = env_.count(FsOp::kAppend);
  constexpr int kThreads = 8;
  absl::Notification all_appended;
  std::atomic<int> appended{0};
  std::atomic<bool> first_sync{true};
  env_.SetSyncHook([&] {
    if (first_sync.exchange(false)) all_appended.WaitForNotification();
  });
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string record = absl::StrCat("thread-", t);
      const uint64_t seq = journal_->Append(record);
      if (++appended == kThreads) all_appended.Notify();
      results[t] = journal_->Sync(seq);
      // Durable means in the synced prefix, not just written.
      if (results[t].ok() &&
          env_.fs().SyncedContents(LogPath(1)).find(Frame(record)) == std::string::npos) {
        results[t] = absl::InternalError(record + " acknowledged before it was durable");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_LE(env_.count(FsOp::kSync) - syncs_before, 2);
  EXPECT_EQ(env_.count(FsOp::kAppend) - appends_before,
            env_.count(FsOp::kSync) - syncs_before);  // One write per fsync.
  EXPECT_EQ(Reopen().records.size(), static_cast<size_t>(kThreads));
}

// Catches races between concurrent Append and Sync (lost, duplicated or early-acked records).
TEST_F(JournalTest, ConcurrentAppendAndSyncStress) {
  Reopen();
  const int syncs_before = env_.count(FsOp::kSync);
  constexpr int kThreads = 6;
  constexpr int kPerThread = 200;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string record = absl::StrCat(t, ":", i);
        if (!journal_->Sync(journal_->Append(record)).ok() ||
            env_.fs().SyncedContents(LogPath(1)).find(Frame(record)) == std::string::npos) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(env_.count(FsOp::kSync) - syncs_before, kThreads * kPerThread);
  std::vector<std::string> records = Reopen().records;
  ASSERT_EQ(records.size(), static_cast<size_t>(kThreads * kPerThread));
  std::map<int, int> next;  // Per thread, records must appear in the order appended.
  for (const std::string& r : records) {
    std::vector<std::string> parts = absl::StrSplit(r, ':');
    ASSERT_EQ(parts.size(), 2u);
    EXPECT_EQ(std::stoi(parts[1]), next[std::stoi(parts[0])]++) << r;
  }
}

// ---------------------------------------------------------------------------------------------
// The crash test: one recorded workload, crashed after every step it took.

// The tiny state machine: a record "k=v" sets k to v; an empty record does nothing.
using State = std::map<std::string, std::string>;

void ApplyRecord(State* state, const std::string& record) {
  if (record.empty()) return;
  const size_t eq = record.find('=');
  ASSERT_NE(eq, std::string::npos) << record;
  (*state)[record.substr(0, eq)] = record.substr(eq + 1);
}

std::string EncodeState(const State& state) {
  std::string out;
  for (const auto& [k, v] : state) absl::StrAppend(&out, k, "=", v, "\n");
  return out;
}

State DecodeState(const std::string& snapshot) {
  State state;
  for (absl::string_view line : absl::StrSplit(snapshot, '\n', absl::SkipEmpty())) {
    ApplyRecord(&state, std::string(line));
  }
  return state;
}

struct Workload {
  std::vector<std::string> records;
  size_t snapshot_covers = 0;  // The snapshot is the state after this many records.
  std::string snapshot;
  // (crash steps taken when a Sync/WriteSnapshot returned, records acknowledged by then).
  std::vector<std::pair<size_t, size_t>> acks;
};

// ~40 records of 0..~250 bytes, synced in groups of 1-4, with a snapshot (that itself syncs
// three pending records) after record 20. With `background`, StartSnapshot's write is held at
// its temp file's fsync while records 21..30 are appended and synced into the next log, then
// let go; so every step of the snapshot thread is a crash point, in a deterministic order.
Workload RunWorkload(FaultInjectionEnv* env, bool background) {
  Workload w;
  SyncGate gate(env);
  RecoveredJournal recovered;
  std::unique_ptr<Journal> journal = OpenOrDie(&gate, &recovered);
  if (journal == nullptr) return w;
  std::mt19937 rng(2024);
  State state;
  size_t group = 0;
  for (size_t i = 0; i < 40; ++i) {
    std::string record =
        i == 7 ? "" : absl::StrCat("k", i % 6, "=", i, std::string((i * 53) % 251, 'a' + i % 26));
    ApplyRecord(&state, record);
    w.records.push_back(record);
    journal->Append(std::move(record));
    if (i + 1 == 20) {
      w.snapshot_covers = 20;
      w.snapshot = EncodeState(state);
      if (background) {
        gate.HoldNext();
        EXPECT_TRUE(journal->StartSnapshot(w.snapshot).ok());
        gate.WaitUntilHeld();  // Records 18..20 are durable in log-000001; log-000002 exists.
      } else {
        EXPECT_TRUE(journal->WriteSnapshot(w.snapshot).ok());
      }
      w.acks.emplace_back(env->TotalSteps(), w.records.size());
      group = 0;
    } else if (i + 1 >= 18 && i + 1 < 20) {
      // Left pending: WriteSnapshot must sync them before the snapshot.
    } else if (++group >= 1 + rng() % 4 || i + 1 == 40) {
      EXPECT_TRUE(journal->Sync(journal->last_appended()).ok());
      w.acks.emplace_back(env->TotalSteps(), w.records.size());
      group = 0;
    }
    if (background && i + 1 == 30) {
      gate.Release();
      EXPECT_TRUE(journal->WaitForSnapshot().ok());
    }
  }
  return w;
}

struct CrashStats {
  int with_snapshot = 0;
  int with_warning = 0;
  int max_recovered = 0;
};

// Crashes a copy of `env` after `steps`, recovers, checks the recovered state, then appends and
// recovers again. Fatal failures are left for the caller to detect.
void CheckCrashAt(const FaultInjectionEnv& env, const Workload& w, size_t steps, CrashMode mode,
                  CrashStats* stats) {
  std::unique_ptr<FaultInjectionEnv> crashed = env.Fork();
  crashed->CrashAfter(steps, mode);

  size_t acked = 0;
  for (const auto& [at, count] : w.acks) {
    if (at <= steps) acked = count;
  }
  RecoveredJournal recovered;
  auto journal = Journal::Open(crashed.get(), kDir, {}, &recovered);
  ASSERT_TRUE(journal.ok()) << journal.status();

  // The recovery must be exactly [snapshot] + records[base, prefix): nothing reordered,
  // nothing half-applied, nothing from outside the workload.
  size_t base = 0;
  State state;
  if (recovered.snapshot.has_value()) {
    ASSERT_EQ(*recovered.snapshot, w.snapshot);
    base = w.snapshot_covers;
    state = DecodeState(*recovered.snapshot);
    ++stats->with_snapshot;
  }
  const size_t prefix = base + recovered.records.size();
  ASSERT_LE(prefix, w.records.size());
  for (size_t i = 0; i < recovered.records.size(); ++i) {
    ASSERT_EQ(recovered.records[i], w.records[base + i]) << "record " << base + i;
  }
  ASSERT_GE(prefix, acked) << "acknowledged records lost";
  for (const std::string& r : recovered.records) ApplyRecord(&state, r);
  State expected;
  for (size_t i = 0; i < prefix; ++i) ApplyRecord(&expected, w.records[i]);
  ASSERT_EQ(state, expected);
  if (!recovered.warnings.empty()) ++stats->with_warning;
  stats->max_recovered = std::max<int>(stats->max_recovered, prefix);

  // Appending after the recovered (maybe truncated) tail must produce a clean journal.
  const uint64_t seq = (*journal)->Append("after=1");
  (*journal)->Append("after=2");
  ASSERT_TRUE((*journal)->Sync(seq + 1).ok());
  journal->reset();
  RecoveredJournal again;
  auto reopened = Journal::Open(crashed.get(), kDir, {}, &again);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_THAT(again.warnings, IsEmpty());
  EXPECT_EQ(again.snapshot, recovered.snapshot);
  std::vector<std::string> expected_records = recovered.records;
  expected_records.push_back("after=1");
  expected_records.push_back("after=2");
  ASSERT_EQ(again.records, expected_records);
}

class JournalCrashTest : public ::testing::TestWithParam<std::tuple<CrashMode, bool>> {};

// Catches any crash point (mid-write, mid-rotation, mid-snapshot, between rename and deletions,
// between a write and its fsync, while records go to the next log during a background
// snapshot) where recovery fails, loses an acknowledged record, yields a state that no prefix
// of the workload produces, or leaves a tail that breaks later appends.
TEST_P(JournalCrashTest, EveryCrashPointRecoversAnAcknowledgedPrefix) {
  const auto [mode, background] = GetParam();
  FaultInjectionEnv env;
  const Workload w = RunWorkload(&env, background);
  ASSERT_FALSE(HasFailure());
  const size_t total = env.TotalSteps();
  RecordProperty("crash_points", static_cast<int>(total + 1));
  CrashStats stats;
  for (size_t steps = 0; steps <= total; ++steps) {
    CheckCrashAt(env, w, steps, mode, &stats);
    if (HasFailure()) {
      ADD_FAILURE() << "first failure after crash step " << steps << " of " << total;
      return;
    }
  }
  // Guards the test itself: the cut points must cover the snapshot and the whole workload.
  EXPECT_GT(stats.with_snapshot, 0);
  EXPECT_EQ(stats.max_recovered, 40);
  if (mode == CrashMode::kKeepUnsynced) {
    EXPECT_GT(stats.with_warning, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(AllModes, JournalCrashTest,
                         ::testing::Combine(::testing::Values(CrashMode::kKeepUnsynced,
                                                              CrashMode::kDropUnsynced,
                                                              CrashMode::kZeroUnsynced),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<CrashMode, bool>>& info) {
                           return absl::StrCat(
                               CrashModeName(std::get<0>(info.param)),
                               std::get<1>(info.param) ? "_BackgroundSnapshot" : "_WriteSnapshot");
                         });

}  // namespace
}  // namespace trainstep
