// Minimal structured logging to stderr: "2026-11-29T12:00:00.123Z INFO message" lines, or
// one JSON object per line with --log-format json. Thread-safe (one write per line).
#ifndef TRAINSTEP_COMMON_LOG_H_
#define TRAINSTEP_COMMON_LOG_H_

#include <string>

#include "absl/strings/string_view.h"

namespace trainstep {

enum class LogFormat { kText, kJson };

void SetLogFormat(LogFormat format);
LogFormat GetLogFormat();
// Parses "text" | "json".
bool ParseLogFormat(absl::string_view s, LogFormat* out);

void LogInfo(absl::string_view message);
void LogWarning(absl::string_view message);
void LogError(absl::string_view message);
// A pre-rendered JSON object (one line) in json mode; `text` otherwise.
void LogEvent(absl::string_view text, absl::string_view json_object);

// JSON string literal for `s` (quotes and escapes).
std::string JsonQuote(absl::string_view s);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_LOG_H_
