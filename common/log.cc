#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainstep {
namespace {

std::atomic<LogFormat> g_format{LogFormat::kText};

std::string Timestamp() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
}

void WriteLine(const std::string& line) {
  // One write(2) per line keeps lines from interleaving between threads.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

void Log(absl::string_view level, absl::string_view message) {
  if (g_format.load() == LogFormat::kJson) {
    WriteLine(absl::StrCat("{\"time\":\"", Timestamp(), "\",\"level\":\"", level,
                           "\",\"msg\":", JsonQuote(message), "}\n"));
  } else {
    WriteLine(absl::StrCat(Timestamp(), " ", level, " ", message, "\n"));
  }
}

}  // namespace

void SetLogFormat(LogFormat format) { g_format.store(format); }
LogFormat GetLogFormat() { return g_format.load(); }

bool ParseLogFormat(absl::string_view s, LogFormat* out) {
  if (s == "text") {
    *out = LogFormat::kText;
    return true;
  }
  if (s == "json") {
    *out = LogFormat::kJson;
    return true;
  }
  return false;
}

void LogInfo(absl::string_view message) { Log("INFO", message); }
void LogWarning(absl::string_view message) { Log("WARN", message); }
void LogError(absl::string_view message) { Log("ERROR", message); }

void LogEvent(absl::string_view text, absl::string_view json_object) {
  if (g_format.load() == LogFormat::kJson) {
    WriteLine(absl::StrCat(json_object, "\n"));
  } else {
    Log("INFO", text);
  }
}

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += "\"";
  return out;
}

}  // namespace trainstep
