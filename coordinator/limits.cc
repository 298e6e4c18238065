#include "coordinator/limits.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainstep {

absl::Status ValidateLimits(const Limits& l) {
  const struct {
    const char* flag;
    int64_t value;
    int64_t min;
    int64_t max;
  } checks[] = {
      {"--max-request-id-bytes", l.max_request_id_bytes, 16, 64 << 10},
      {"--max-name-bytes", l.max_name_bytes, 16, 64 << 10},
      {"--max-message-bytes", l.max_message_bytes, 256, 256 << 10},
      {"--max-spec-bytes", l.max_spec_bytes, 1 << 10, l.list_page_bytes / 2},
      {"--max-jobs", l.max_jobs, 1, 1'000'000},
      {"--store-max-keys", l.store_max_keys, 16, 100'000'000},
      {"--store-max-bytes", l.store_max_bytes, 1 << 10, int64_t{64} << 30},
  };
  for (const auto& c : checks) {
    if (c.value < c.min || c.value > c.max) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.flag, " must be in [", c.min, ", ", c.max, "], got ", c.value));
    }
  }
  if (l.finished_worker_retention < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--finished-worker-retention must be ≥ 0 (or inf), got ",
                     absl::FormatDuration(l.finished_worker_retention)));
  }
  return absl::OkStatus();
}

absl::Status CheckSize(absl::string_view field, absl::string_view value, int64_t limit,
                       absl::string_view flag) {
  if (static_cast<int64_t>(value.size()) <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", value.size(), " bytes; the limit is ", limit, " (", flag, ")"));
}

std::string TruncateMessage(std::string message, int64_t limit) {
  if (static_cast<int64_t>(message.size()) <= limit) return message;
  const std::string note = absl::StrCat("… (truncated from ", message.size(), " bytes)");
  int64_t keep = std::max<int64_t>(0, limit - static_cast<int64_t>(note.size()));
  // Back up to the start of a UTF-8 sequence: never cut a character in half.
  while (keep > 0 && (static_cast<unsigned char>(message[keep]) & 0xC0) == 0x80) --keep;
  message.resize(static_cast<size_t>(keep));
  message += note;
  return message;
}

absl::StatusOr<PageRequest> ParsePageRequest(int32_t page_size, const std::string& page_token,
                                             int32_t default_size, int32_t max_size) {
  if (page_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_size must be ≥ 0, got ", page_size));
  }
  PageRequest page;
  page.size = page_size == 0 ? default_size : std::min(page_size, max_size);
  if (!page_token.empty() && (!absl::SimpleAtoi(page_token, &page.token) || page.token < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token \"", page_token, "\" is not one this server issued"));
  }
  return page;
}

bool PageHasRoom(int64_t count, int64_t bytes, int64_t entry_bytes, const PageRequest& page,
                 int64_t budget_bytes) {
  if (count == 0) return true;
  return count < page.size && bytes + entry_bytes <= budget_bytes;
}

}  // namespace trainstep
