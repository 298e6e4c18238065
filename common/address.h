#ifndef TRAINSTEP_COMMON_ADDRESS_H_
#define TRAINSTEP_COMMON_ADDRESS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace trainstep {

// Where the coordinator listens by default, and where its clients (the CLI, the workers) look
// for it without --coordinator or $TRAINSTEP_COORDINATOR.
inline constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";

// True when a host:port names this machine's loopback interface (127.0.0.0/8, localhost or
// [::1]): what the coordinator may serve without credentials, and where a worker's peers are
// reachable at 127.0.0.1.
bool IsLoopbackAddress(absl::string_view host_port);

// This machine's name (gethostname); "" when it cannot be read.
std::string LocalHostName();

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_ADDRESS_H_
