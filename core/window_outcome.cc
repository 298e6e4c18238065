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
  for (v1::WindowOutcome o : {v1::COMMIT, v1::SKIP, v1::ABORT}) {
    if (record.outcome() == OutcomeName(o)) return o;
  }
  return v1::WINDOW_OUTCOME_UNSPECIFIED;
}

void SetOutcome(v1::UpdateRecord* record, v1::WindowOutcome outcome) {
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

}  // namespace trainstep
