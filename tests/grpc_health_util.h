// Unary gRPC calls with raw request and response bytes (no generated stubs needed) and the
// grpc.health.v1 check built on them, for the coordinator's, the worker's and the process-level
// tests of health services. Header-only: each of those test binaries links gRPC already.
#ifndef TRAINSTEP_TESTS_GRPC_HEALTH_UTIL_H_
#define TRAINSTEP_TESTS_GRPC_HEALTH_UTIL_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainstep::testing_util {

inline constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";  // for RawCall
inline constexpr char kServing[] = "\x08\x01";     // HealthCheckResponse{status: SERVING}
inline constexpr char kNotServing[] = "\x08\x02";  // HealthCheckResponse{status: NOT_SERVING}

// One unary call of `method` with raw request bytes, bounded at 10 s. Fills `response` with the
// raw answer (when the call succeeds) and `server_pem` with the certificate the server presented.
inline grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& method, const std::string& request,
                            std::string* response = nullptr, std::string* server_pem = nullptr) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), resp;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  done.WaitForNotification();
  if (status.ok() && response != nullptr) {
    std::vector<grpc::Slice> slices;
    (void)resp.Dump(&slices);
    response->clear();
    for (const grpc::Slice& s : slices) response->append(s.begin(), s.end());
  }
  if (server_pem != nullptr && ctx.auth_context() != nullptr) {
    for (const grpc::string_ref& v : ctx.auth_context()->FindPropertyValues("x509_pem_cert")) {
      *server_pem = std::string(v.data(), v.size());
    }
  }
  return status;
}

// grpc.health.v1.Health/Check of `service` ("" = the server as a whole): the raw answer
// (kServing, kNotServing), or "error: " and the call's message.
inline std::string HealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                               const std::string& service = "") {
  // HealthCheckRequest{service} by hand (field 1, a name shorter than 128 bytes).
  std::string request;
  if (!service.empty()) request = absl::StrCat("\x0a", std::string(1, service.size()), service);
  std::string answer;
  const grpc::Status status = RawCall(channel, kHealthCheckMethod, request, &answer);
  if (!status.ok()) return absl::StrCat("error: ", status.error_message());
  return answer;
}

// Waits (bounded, 30 s) until `service`'s health answer is `want`: a health service updates
// its status on a tick of its own, not at once.
inline bool HealthBecomes(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                          const std::string& want) {
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30); absl::Now() < give_up;) {
    if (HealthCheck(channel, service) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace trainstep::testing_util

#endif  // TRAINSTEP_TESTS_GRPC_HEALTH_UTIL_H_
