#ifndef TRAINSTEP_CORE_WINDOW_OUTCOME_H_
#define TRAINSTEP_CORE_WINDOW_OUTCOME_H_

// How a window ended, as code decides on it. The per-update log (UpdateRecord) spells the
// outcome, the reason and a re-run's cause and verdict as words, which its JSON keeps beside
// their enums; this is the one place that converts between the two, and the one place that
// reads a record journaled before the enums existed (words only), so no caller compares words.

#include <string>

#include "absl/strings/string_view.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep {

// "commit" | "skip" | "abort"; "unknown" for WINDOW_OUTCOME_UNSPECIFIED.
const char* OutcomeName(v1::WindowOutcome outcome);
// The record's outcome: outcome_code, else (a record journaled before it) its word;
// WINDOW_OUTCOME_UNSPECIFIED for a word it does not know.
v1::WindowOutcome OutcomeOf(const v1::UpdateRecord& record);
// Sets the outcome's code and its word.
void SetOutcome(v1::UpdateRecord* record, v1::WindowOutcome outcome);

// The record's outcome, then its reason when it has one: "commit", "skip OVERFLOW", "abort
// collective failed: ...". How every reader of the log prints a window's end (the coordinator's
// log lines, `job logs`, the marks of `job plot`).
std::string OutcomeText(const v1::UpdateRecord& record);

// "" for WINDOW_REASON_NONE, the log's upper-case word otherwise.
const char* ReasonName(v1::WindowReason reason);
// The reason a word of the log names; WINDOW_REASON_NONE for "" and for any other text (a
// worker's own abort message).
v1::WindowReason ReasonOf(absl::string_view word);
// A decision's reason: its code and, for the log, its word.
void SetReason(v1::WindowDecision* decision, v1::WindowReason reason);
// A record's reason as code reads it: reason_code; a record journaled before that field
// existed has only its word, which is read instead (the one place a word is parsed).
v1::WindowReason ReasonCodeOf(const v1::UpdateRecord& record);

// "nonfinite" | "spike"; "" for RERUN_CAUSE_UNSPECIFIED.
const char* CauseName(v1::RerunCause cause);
// "persistent" | "transient"; "" for RERUN_VERDICT_UNSPECIFIED.
const char* VerdictName(v1::RerunVerdict verdict);
// A re-run's cause and verdict: the code, else (a record journaled before it) the word.
v1::RerunCause CauseOf(const v1::Rerun& rerun);
v1::RerunVerdict VerdictOf(const v1::Rerun& rerun);
// Sets the code and its word.
void SetCause(v1::Rerun* rerun, v1::RerunCause cause);
void SetVerdict(v1::Rerun* rerun, v1::RerunVerdict verdict);

}  // namespace trainstep

#endif  // TRAINSTEP_CORE_WINDOW_OUTCOME_H_
