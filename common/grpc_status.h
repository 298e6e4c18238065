// The one conversion pair between absl::Status (inside) and grpc::Status (on the wire).
// Canonical codes map one to one; nothing is invented.
#ifndef TRAINSTEP_COMMON_GRPC_STATUS_H_
#define TRAINSTEP_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace trainstep {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_GRPC_STATUS_H_
