// The coordinator's resource limits: how much one client or job may make it hold, and the
// page budget that keeps every list response under gRPC's message limit. Pure helpers;
// every limit is a coordinator flag (main.cc), named in the errors so users know which to
// raise.
#ifndef TRAINSTEP_COORDINATOR_LIMITS_H_
#define TRAINSTEP_COORDINATOR_LIMITS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trainstep {

struct Limits {
  int64_t max_request_id_bytes = 256;  // --max-request-id-bytes (AIP-155 ids are UUIDs)
  int64_t max_name_bytes = 256;        // --max-name-bytes: job names, worker names and hosts
  int64_t max_message_bytes = 4096;    // --max-message-bytes: failure messages, truncated
  int64_t max_spec_bytes = 1 << 20;    // --max-spec-bytes: the resolved spec, serialized
  int64_t max_jobs = 1000;             // --max-jobs: jobs retained, live and finished
  int64_t store_max_keys = 65536;      // --store-max-keys: per job
  int64_t store_max_bytes = 64 << 20;  // --store-max-bytes: per job, keys + values
  // --finished-worker-retention: how long ListWorkers still shows a worker after it was lost
  // or its job ended (then it is noise: a pod restarted under a new id); inf = for ever.
  absl::Duration finished_worker_retention = absl::Minutes(10);
  // Serialized bytes per list page: half the 4 MiB default message limit, so a page of
  // entries that are each bounded by the limits above always fits.
  int64_t list_page_bytes = 2 << 20;
};

// INVALID_ARGUMENT naming the flag when a limit is out of its range: the page budget must
// hold any one entry the other limits admit.
absl::Status ValidateLimits(const Limits& limits);

// INVALID_ARGUMENT naming `field`, its size, the limit and the flag that sets it, when
// `value` is longer than `limit` bytes.
absl::Status CheckSize(absl::string_view field, absl::string_view value, int64_t limit,
                       absl::string_view flag);

// `message` cut to at most `limit` bytes on a UTF-8 boundary, with a note saying how long it
// was. Failure messages are truncated, not refused: a failing worker's report must land.
std::string TruncateMessage(std::string message, int64_t limit);

// A list request's page: where it starts and how many entries it may hold.
struct PageRequest {
  int64_t token = -1;  // the previous page's next_page_token; -1 = from the start
  int32_t size = 0;
};

// Parses page_size (0 = `default_size`, capped at `max_size`, negative refused) and
// page_token (empty, or a decimal position this server issued).
absl::StatusOr<PageRequest> ParsePageRequest(int32_t page_size, const std::string& page_token,
                                             int32_t default_size, int32_t max_size);

// Whether a page of `count` entries holding `bytes` so far may take one more of
// `entry_bytes`: within the page size and the byte budget; the first entry always goes in.
bool PageHasRoom(int64_t count, int64_t bytes, int64_t entry_bytes, const PageRequest& page,
                 int64_t budget_bytes);

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_LIMITS_H_
