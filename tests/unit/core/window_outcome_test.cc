// The per-update log's spellings and the enums the code decides on convert both ways, so a
// caller that compares enums sees exactly what the JSON log says.
#include "core/window_outcome.h"

#include <gtest/gtest.h>

namespace trainstep {
namespace {

// Catches: an outcome spelled differently on write than on read (every record would count as
// an abort in the metrics, the throughput and the plot).
TEST(WindowOutcomeTest, OutcomesRoundTripThroughTheLogSpelling) {
  for (v1::WindowOutcome o : {v1::COMMIT, v1::SKIP, v1::ABORT}) {
    v1::UpdateRecord r;
    SetOutcome(&r, o);
    EXPECT_EQ(OutcomeOf(r), o) << r.outcome();
  }
  v1::UpdateRecord r;
  SetOutcome(&r, v1::COMMIT);
  EXPECT_EQ(r.outcome(), "commit");  // the JSON log's spelling, which users' tools parse
  SetOutcome(&r, v1::SKIP);
  EXPECT_EQ(r.outcome(), "skip");
  SetOutcome(&r, v1::ABORT);
  EXPECT_EQ(r.outcome(), "abort");
}

// Catches: an unknown or empty spelling (a log written by something else) read as a commit.
TEST(WindowOutcomeTest, UnknownSpellingIsUnspecified) {
  v1::UpdateRecord r;
  EXPECT_EQ(OutcomeOf(r), v1::WINDOW_OUTCOME_UNSPECIFIED);
  r.set_outcome("Commit");
  EXPECT_EQ(OutcomeOf(r), v1::WINDOW_OUTCOME_UNSPECIFIED);
  EXPECT_STREQ(OutcomeName(v1::WINDOW_OUTCOME_UNSPECIFIED), "unknown");
}

// Catches: the scaler's overflow test or the desync counter missing their reason because the
// word changed on one side only.
TEST(WindowOutcomeTest, ReasonsRoundTrip) {
  for (int i = v1::WindowReason_MIN; i <= v1::WindowReason_MAX; ++i) {
    const v1::WindowReason reason = static_cast<v1::WindowReason>(i);
    EXPECT_EQ(ReasonOf(ReasonName(reason)), reason) << ReasonName(reason);
  }
  EXPECT_STREQ(ReasonName(v1::WINDOW_REASON_NONE), "");
  EXPECT_STREQ(ReasonName(v1::WINDOW_REASON_OVERFLOW), "OVERFLOW");
  EXPECT_STREQ(ReasonName(v1::WINDOW_REASON_WORKER_LOST), "WORKER_LOST");
}

// Catches: a worker's free-text abort reason mistaken for one the coordinator acts on.
TEST(WindowOutcomeTest, FreeTextReasonIsNone) {
  EXPECT_EQ(ReasonOf("collective failed: connection reset"), v1::WINDOW_REASON_NONE);
  EXPECT_EQ(ReasonOf("overflow"), v1::WINDOW_REASON_NONE);  // case matters: the log is upper-case
}

// Catches the scaler or the desync count reading the word where the code is set, or ignoring
// the word of a record journaled before the code existed.
TEST(WindowOutcomeTest, CodeFirstThenTheWordOfOldRecords) {
  v1::WindowDecision d;
  SetReason(&d, v1::WINDOW_REASON_OVERFLOW);
  EXPECT_EQ(d.reason_code(), v1::WINDOW_REASON_OVERFLOW);
  EXPECT_EQ(d.reason(), "OVERFLOW");
  v1::UpdateRecord fresh;
  fresh.set_reason_code(v1::WINDOW_REASON_DESYNC);
  fresh.set_reason("DESYNC");
  EXPECT_EQ(ReasonCodeOf(fresh), v1::WINDOW_REASON_DESYNC);
  v1::UpdateRecord old;  // journaled before reason_code: only the word
  old.set_reason("DESYNC");
  EXPECT_EQ(ReasonCodeOf(old), v1::WINDOW_REASON_DESYNC);
}

// Catches: an outcome, cause or verdict written as a word without its code (the next reader
// would compare words), or a record journaled before the codes existed read as unspecified.
TEST(WindowOutcomeTest, OutcomeCauseAndVerdictCarryCodeAndWordAndOldRecordsReadTheWord) {
  v1::UpdateRecord r;
  SetOutcome(&r, v1::SKIP);
  EXPECT_EQ(r.outcome_code(), v1::SKIP);
  EXPECT_EQ(r.outcome(), "skip");
  v1::Rerun rerun;
  SetCause(&rerun, v1::RERUN_CAUSE_SPIKE);
  SetVerdict(&rerun, v1::RERUN_VERDICT_TRANSIENT);
  EXPECT_EQ(rerun.cause_code(), v1::RERUN_CAUSE_SPIKE);
  EXPECT_EQ(rerun.cause(), "spike");  // the JSON log's and Prometheus's spellings
  EXPECT_EQ(rerun.verdict_code(), v1::RERUN_VERDICT_TRANSIENT);
  EXPECT_EQ(rerun.verdict(), "transient");
  EXPECT_EQ(CauseOf(rerun), v1::RERUN_CAUSE_SPIKE);
  EXPECT_EQ(VerdictOf(rerun), v1::RERUN_VERDICT_TRANSIENT);

  v1::UpdateRecord old;  // journaled before the codes: words only
  old.set_outcome("commit");
  old.mutable_rerun()->set_cause("nonfinite");
  old.mutable_rerun()->set_verdict("persistent");
  EXPECT_EQ(OutcomeOf(old), v1::COMMIT);
  EXPECT_EQ(CauseOf(old.rerun()), v1::RERUN_CAUSE_NONFINITE);
  EXPECT_EQ(VerdictOf(old.rerun()), v1::RERUN_VERDICT_PERSISTENT);
  EXPECT_EQ(VerdictOf(v1::Rerun()), v1::RERUN_VERDICT_UNSPECIFIED);
  for (int i = v1::RerunCause_MIN; i <= v1::RerunCause_MAX; ++i) {
    v1::Rerun w;
    w.set_cause(CauseName(static_cast<v1::RerunCause>(i)));
    EXPECT_EQ(CauseOf(w), static_cast<v1::RerunCause>(i)) << w.cause();
  }
  for (int i = v1::RerunVerdict_MIN; i <= v1::RerunVerdict_MAX; ++i) {
    v1::Rerun w;
    w.set_verdict(VerdictName(static_cast<v1::RerunVerdict>(i)));
    EXPECT_EQ(VerdictOf(w), static_cast<v1::RerunVerdict>(i)) << w.verdict();
  }
}

// Catches: a commit printed with a trailing space, or a reason run into its outcome.
TEST(WindowOutcomeTest, OutcomeTextAddsTheReasonIfAny) {
  v1::UpdateRecord r;
  SetOutcome(&r, v1::COMMIT);
  EXPECT_EQ(OutcomeText(r), "commit");
  SetOutcome(&r, v1::SKIP);
  r.set_reason(ReasonName(v1::WINDOW_REASON_OVERFLOW));
  EXPECT_EQ(OutcomeText(r), "skip OVERFLOW");
  SetOutcome(&r, v1::ABORT);
  r.set_reason("collective failed: connection reset");
  EXPECT_EQ(OutcomeText(r), "abort collective failed: connection reset");
}

}  // namespace
}  // namespace trainstep
