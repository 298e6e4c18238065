#include "coordinator/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/channel.h"

namespace trainstep {
namespace {

// Leaves the reflection plugin (registered process-wide) out of one server: its service
// answers anyone, so it has no place on a secured port or on the health-only one.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return p->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

}  // namespace

CoordinatorServer::CoordinatorServer(Coordinator* coordinator, RpcAuthorizer* auth)
    : coordinator_(coordinator),
      worker_service_(coordinator, auth),
      job_service_(coordinator, auth) {}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    Coordinator* coordinator, const std::string& address) {
  ServerOptions options;
  options.address = address;
  return Start(coordinator, options);
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    Coordinator* coordinator, const ServerOptions& options) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer(coordinator, options.auth));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(
      options.address,
      options.credentials ? options.credentials : grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(&s->worker_service_);
  builder.RegisterService(&s->job_service_);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  // Long-lived worker channels ping every 30 s; accept pings down to 10 s without calls.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  if (options.auth != nullptr) builder.SetOption(std::make_unique<WithoutReflection>());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.address, " (in use, or not host:port?)"));
  }
  if (!options.health_address.empty()) {
    grpc::ServerBuilder health;
    health.AddListeningPort(options.health_address, grpc::InsecureServerCredentials(),
                            &s->health_port_);
    health.RegisterCallbackGenericService(&s->unimplemented_);
    health.SetOption(std::make_unique<WithoutReflection>());
    s->health_server_ = health.BuildAndStart();
    if (s->health_server_ == nullptr || s->health_port_ == 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", options.health_address,
                                                 " (--health-listen: in use, or not host:port?)"));
    }
  }
  CoordinatorServer* raw = s.get();
  raw->SetDeciding(coordinator->deciding());
  s->driver_ = std::thread([raw] {
    bool deciding = raw->coordinator_->deciding();
    while (!raw->stop_.HasBeenNotified()) {
      const absl::Time next = raw->coordinator_->Tick();
      if (raw->coordinator_->deciding() != deciding) {
        deciding = !deciding;
        raw->SetDeciding(deciding);
      }
      raw->coordinator_->WaitForTick(std::min(next, absl::Now() + absl::Seconds(1)));
    }
  });
  return s;
}

void CoordinatorServer::SetDeciding(bool deciding) {
  server_->GetHealthCheckService()->SetServingStatus(kDecisionsHealthService, deciding);
  if (health_server_ != nullptr) {
    health_server_->GetHealthCheckService()->SetServingStatus(kDecisionsHealthService, deciding);
  }
}

void CoordinatorServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  if (health_server_ != nullptr) health_server_->GetHealthCheckService()->SetServingStatus(false);
  coordinator_->Shutdown();
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::microseconds(absl::ToInt64Microseconds(grace));
  server_->Shutdown(deadline);
  if (health_server_ != nullptr) health_server_->Shutdown(deadline);
  stop_.Notify();
  coordinator_->WakeDriver();
  if (driver_.joinable()) driver_.join();
}

CoordinatorServer::~CoordinatorServer() {
  if (server_ != nullptr) Shutdown(absl::ZeroDuration());
}

}  // namespace trainstep
