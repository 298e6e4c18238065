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

// The job a request is about: its job_id field ("" for requests without one). Read by
// reflection so that no handler can forget to pass it to the authorization.
template <typename Req>
std::string JobIdOfRequest(const Req& req) {
  const google::protobuf::FieldDescriptor* f = Req::descriptor()->FindFieldByName("job_id");
  if (f == nullptr || f->type() != google::protobuf::FieldDescriptor::TYPE_STRING ||
      f->is_repeated()) {
    return "";
  }
  return req.GetReflection()->GetString(req, f);
}

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

// Authorizes the call, then starts `call(done, handle, caller)`; `done` fills `*response` and
// finishes the RPC. A PERMISSION_DENIED answer (the coordinator's own-jobs check) is counted
// and logged as the authorizer's refusals are.
template <typename Req, typename Resp, typename Call>
grpc::ServerUnaryReactor* ServeUnary(RpcAuthorizer* auth, grpc::CallbackServerContext* ctx,
                                     const char* method, const Req& req, Resp* response,
                                     Call&& call) {
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
  call(std::move(done), handle, *std::move(caller));
  return reactor;
}

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_GRPC_ADAPTERS_H_
