// Reactors that connect the Coordinator's callback API to gRPC's callback server API.
// Exactly one party finishes an RPC: the coordinator's answer or gRPC's cancellation
// (deadline, client gone), whichever claims the call first.
#ifndef TRAINSTEP_COORDINATOR_GRPC_ADAPTERS_H_
#define TRAINSTEP_COORDINATOR_GRPC_ADAPTERS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <utility>

#include "common/grpc_status.h"
#include "coordinator/coordinator.h"

namespace trainstep {

class UnaryReactor : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor() : handle_(std::make_shared<CallHandle>()) {}
  const std::shared_ptr<CallHandle>& handle() const { return handle_; }
  void OnCancel() override {
    if (handle_->Claim()) Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<CallHandle> handle_;
};

// Starts `call(done, handle)`; `done` fills `*response` and finishes the RPC.
template <typename Resp, typename Call>
grpc::ServerUnaryReactor* ServeUnary(Resp* response, Call&& call) {
  auto* reactor = new UnaryReactor();
  std::shared_ptr<CallHandle> handle = reactor->handle();
  Done<Resp> done = [reactor, handle, response](absl::StatusOr<Resp> result) {
    if (!handle->Claim()) return;
    if (result.ok()) *response = std::move(*result);
    reactor->Finish(ToGrpcStatus(result.status()));
  };
  call(std::move(done), handle);
  return reactor;
}

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_GRPC_ADAPTERS_H_
