#include "common/address.h"

#include <unistd.h>

#include "absl/strings/match.h"

namespace trainstep {

bool IsLoopbackAddress(absl::string_view host_port) {
  return absl::StartsWith(host_port, "127.") || absl::StartsWith(host_port, "localhost:") ||
         absl::StartsWith(host_port, "[::1]:");
}

std::string LocalHostName() {
  char host[256] = {0};
  // A name longer than the buffer is truncated, and may then lack its terminator: keep one.
  if (gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

}  // namespace trainstep
