#include "coordinator/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/worker_client.h"

namespace trainstep {

CoordinatorServer::CoordinatorServer(Coordinator* coordinator)
    : coordinator_(coordinator), worker_service_(coordinator), job_service_(coordinator) {}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    Coordinator* coordinator, const std::string& address) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer(coordinator));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(&s->worker_service_);
  builder.RegisterService(&s->job_service_);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  // Long-lived worker channels ping every 30 s; accept pings down to 10 s without calls.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, " (in use, or not host:port?)"));
  }
  CoordinatorServer* raw = s.get();
  s->driver_ = std::thread([raw] {
    while (!raw->stop_.HasBeenNotified()) {
      const absl::Time next = raw->coordinator_->Tick();
      raw->stop_.WaitForNotificationWithDeadline(std::min(next, absl::Now() + absl::Seconds(1)));
    }
  });
  return s;
}

void CoordinatorServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  coordinator_->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::microseconds(absl::ToInt64Microseconds(grace)));
  stop_.Notify();
  if (driver_.joinable()) driver_.join();
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::ZeroDuration()); }

}  // namespace trainstep
