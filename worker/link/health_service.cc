#include "worker/link/health_service.h"

#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace trainstep {

absl::StatusOr<std::unique_ptr<WorkerHealth>> WorkerHealth::Start(const std::string& address,
                                                                  const ComputePhase* phase,
                                                                  absl::Duration every) {
  std::unique_ptr<WorkerHealth> h(new WorkerHealth());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &h->port_);
  builder.RegisterCallbackGenericService(&h->unimplemented_);
  h->server_ = builder.BuildAndStart();
  if (h->server_ == nullptr || h->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address,
                                               " (--health-listen: in use, or not host:port?)"));
  }
  grpc::HealthCheckServiceInterface* health = h->server_->GetHealthCheckService();
  health->SetServingStatus(true);
  h->watch_ = std::thread([raw = h.get(), health, phase, every] {
    bool serving = true;
    while (!raw->stop_.WaitForNotificationWithTimeout(every)) {
      const bool now = !phase->Stuck();
      if (now == serving) continue;
      serving = now;
      health->SetServingStatus(serving);
      if (!serving) {
        const ComputePhase::Reading r = phase->Read();
        LogError(absl::StrCat("health: NOT_SERVING, the compute thread has been in ",
                              PhaseName(r.phase), " for ", absl::FormatDuration(r.in_phase),
                              ", past the hang deadline"));
      } else {
        LogInfo("health: SERVING again, the compute thread moved on");
      }
    }
  });
  return h;
}

WorkerHealth::~WorkerHealth() {
  stop_.Notify();
  if (watch_.joinable()) watch_.join();
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
}

}  // namespace trainstep
