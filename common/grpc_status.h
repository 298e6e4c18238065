// The one conversion pair between absl::Status (inside) and grpc::Status (on the wire).
// Canonical codes map one to one; nothing is invented. An error the coordinator answers carries
// a v1::ErrorStatus in its details, so that a client tells it from gRPC's own errors of the
// same code by that, never by the words of the message.
#ifndef TRAINSTEP_COMMON_GRPC_STATUS_H_
#define TRAINSTEP_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  v1::ErrorStatus detail;
  detail.set_code(static_cast<int32_t>(status.code()));
  detail.set_message(std::string(status.message()));
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), detail.message(),
                      detail.SerializeAsString());
}

// Whether the coordinator answered this error itself (ToGrpcStatus), rather than gRPC or the
// transport on its way (a message over the size limit, a deadline, a reset connection).
inline bool IsCoordinatorError(const grpc::Status& status) {
  v1::ErrorStatus detail;
  return !status.ok() && !status.error_details().empty() &&
         detail.ParseFromString(status.error_details()) &&
         detail.code() == static_cast<int32_t>(status.error_code());
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_GRPC_STATUS_H_
