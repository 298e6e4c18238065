#include "core/window_outcome.h"

#include "absl/strings/str_cat.h"

namespace trainstep {
namespace {

struct ReasonSpelling {
  v1::WindowReason reason;
  const char* name;
};

constexpr ReasonSpelling kReasons[] = {
    {v1::WINDOW_REASON_NONE, ""},
    {v1::WINDOW_REASON_OVERFLOW, "OVERFLOW"},
    {v1::WINDOW_REASON_EMPTY_WINDOW, "EMPTY_WINDOW"},
    {v1::WINDOW_REASON_NONFINITE_LOSS, "NONFINITE_LOSS"},
    {v1::WINDOW_REASON_DESYNC, "DESYNC"},
    {v1::WINDOW_REASON_WORKER_LOST, "WORKER_LOST"},
    {v1::WINDOW_REASON_LOSS_SPIKE, "LOSS_SPIKE"},
    {v1::WINDOW_REASON_RERUN_INTERRUPTED, "RERUN_INTERRUPTED"},
};

}  // namespace

const char* OutcomeName(v1::WindowOutcome outcome) {
  switch (outcome) {
    case v1::COMMIT:
      return "commit";
    case v1::SKIP:
      return "skip";
    case v1::ABORT:
      return "abort";
    default:
      return "unknown";
  }
}

v1::WindowOutcome OutcomeOf(const v1::UpdateRecord& record) {
  if (record.outcome_code() != v1::WINDOW_OUTCOME_UNSPECIFIED) return record.outcome_code();
  for (v1::WindowOutcome o : {v1::COMMIT, v1::SKIP, v1::ABORT}) {
    if (record.outcome() == OutcomeName(o)) return o;
  }
  return v1::WINDOW_OUTCOME_UNSPECIFIED;
}

void SetOutcome(v1::UpdateRecord* record, v1::WindowOutcome outcome) {
  record->set_outcome_code(outcome);
  record->set_outcome(OutcomeName(outcome));
}

std::string OutcomeText(const v1::UpdateRecord& record) {
  if (record.reason().empty()) return record.outcome();
  return absl::StrCat(record.outcome(), " ", record.reason());
}

const char* ReasonName(v1::WindowReason reason) {
  for (const ReasonSpelling& s : kReasons) {
    if (s.reason == reason) return s.name;
  }
  return "";
}

v1::WindowReason ReasonOf(absl::string_view word) {
  for (const ReasonSpelling& s : kReasons) {
    if (word == s.name) return s.reason;
  }
  return v1::WINDOW_REASON_NONE;
}

void SetReason(v1::WindowDecision* decision, v1::WindowReason reason) {
  decision->set_reason_code(reason);
  decision->set_reason(ReasonName(reason));
}

v1::WindowReason ReasonCodeOf(const v1::UpdateRecord& record) {
  if (record.reason_code() != v1::WINDOW_REASON_NONE) return record.reason_code();
  return ReasonOf(record.reason());
}

const char* CauseName(v1::RerunCause cause) {
  switch (cause) {
    case v1::RERUN_CAUSE_NONFINITE:
      return "nonfinite";
    case v1::RERUN_CAUSE_SPIKE:
      return "spike";
    default:
      return "";
  }
}

const char* VerdictName(v1::RerunVerdict verdict) {
  switch (verdict) {
    case v1::RERUN_VERDICT_PERSISTENT:
      return "persistent";
    case v1::RERUN_VERDICT_TRANSIENT:
      return "transient";
    default:
      return "";
  }
}

v1::RerunCause CauseOf(const v1::Rerun& rerun) {
  if (rerun.cause_code() != v1::RERUN_CAUSE_UNSPECIFIED) return rerun.cause_code();
  for (v1::RerunCause c : {v1::RERUN_CAUSE_NONFINITE, v1::RERUN_CAUSE_SPIKE}) {
    if (rerun.cause() == CauseName(c)) return c;
  }
  return v1::RERUN_CAUSE_UNSPECIFIED;
}

v1::RerunVerdict VerdictOf(const v1::Rerun& rerun) {
  if (rerun.verdict_code() != v1::RERUN_VERDICT_UNSPECIFIED) return rerun.verdict_code();
  for (v1::RerunVerdict v : {v1::RERUN_VERDICT_PERSISTENT, v1::RERUN_VERDICT_TRANSIENT}) {
    if (rerun.verdict() == VerdictName(v)) return v;
  }
  return v1::RERUN_VERDICT_UNSPECIFIED;
}

void SetCause(v1::Rerun* rerun, v1::RerunCause cause) {
  rerun->set_cause_code(cause);
  rerun->set_cause(CauseName(cause));
}

void SetVerdict(v1::Rerun* rerun, v1::RerunVerdict verdict) {
  rerun->set_verdict_code(verdict);
  rerun->set_verdict(VerdictName(verdict));
}

}  // namespace trainstep
