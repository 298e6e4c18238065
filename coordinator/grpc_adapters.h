// Reactors that connect the Coordinator's callback API to gRPC's callback server API.
// Exactly one party finishes an RPC: the coordinator's answer or gRPC's cancellation
// (deadline, client gone), whichever claims the call first. Every call is authorized here
// first (rpc_auth.h), so no handler holds a policy `if`.
#ifndef TRAINSTEP_COORDINATOR_GRPC_ADAPTERS_H_
#define TRAINSTEP_COORDINATOR_GRPC_ADAPTERS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "coordinator/coordinator.h"
#include "coordinator/request_job_id.h"
#include "coordinator/rpc_auth.h"

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

// The one authorization check of every RPC: the caller, or the refusal to answer with.
// Without an authorizer (no TLS or auth flag) everyone is an anonymous caller.
template <typename Req>
absl::StatusOr<Caller> AuthorizeCall(RpcAuthorizer* auth, const grpc::CallbackServerContext* ctx,
                                     absl::string_view method, const Req& req) {
  if (auth == nullptr) return Caller();
  return auth->Check(*ctx, method, JobIdOfRequest(req));
}

// A server stream refused before it started.
template <typename Event>
class RefusedWriteReactor : public grpc::ServerWriteReactor<Event> {
 public:
  explicit RefusedWriteReactor(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// Authorizes the call, then starts the Coordinator's `call`; its `done` fills `*response` and
// finishes the RPC. A PERMISSION_DENIED answer (the coordinator's own-jobs check) is counted
// and logged as the authorizer's refusals are.
template <typename Req, typename Resp>
grpc::ServerUnaryReactor* ServeUnary(RpcAuthorizer* auth, grpc::CallbackServerContext* ctx,
                                     const char* method, const Req& req, Resp* response,
                                     Coordinator* c,
                                     void (Coordinator::*call)(const Req&, Done<Resp>,
                                                               CallContext)) {
  auto* reactor = new UnaryReactor();
  std::shared_ptr<CallHandle> handle = reactor->handle();
  absl::StatusOr<Caller> caller = AuthorizeCall(auth, ctx, method, req);
  if (!caller.ok()) {
    if (handle->Claim()) reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  Done<Resp> done = [reactor, handle, response, auth, method,
                     principal = caller->principal](absl::StatusOr<Resp> result) {
    if (!handle->Claim()) return;
    if (result.ok()) {
      *response = std::move(*result);
    } else if (auth != nullptr && result.status().code() == absl::StatusCode::kPermissionDenied) {
      auth->Refused(method, absl::StrCat("\"", principal, "\""), result.status());
    }
    reactor->Finish(ToGrpcStatus(result.status()));
  };
  (c->*call)(req, std::move(done), CallContext(handle, *std::move(caller)));
  return reactor;
}

// What a service's handlers use: the coordinator they forward to and the authorizer (not
// owned; null: everyone may call everything).
class ServiceWiring {
 public:
  explicit ServiceWiring(Coordinator* coordinator, RpcAuthorizer* auth = nullptr)
      : c_(coordinator), auth_(auth) {}

 protected:
  Coordinator* const c_;
  RpcAuthorizer* const auth_;
};

// A service's handler of a unary line of rpc_table.h, declared in its class and defined (for
// `Service`, whose members c_ and auth_ it uses) in its .cc.
#define TRAINSTEP_DECLARE_UNARY_HANDLER(Method, Req, Resp, access)                       \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* ctx, const v1::Req* req, \
                                   v1::Resp* resp) override;
#define TRAINSTEP_DEFINE_UNARY_HANDLER(Service, Method, Req, Resp)                                \
  grpc::ServerUnaryReactor* Service::Method(grpc::CallbackServerContext* ctx, const v1::Req* req, \
                                            v1::Resp* resp) {                                     \
    return ServeUnary(auth_, ctx, #Method, *req, resp, c_, &Coordinator::Method);                 \
  }

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_GRPC_ADAPTERS_H_
