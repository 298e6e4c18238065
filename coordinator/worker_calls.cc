// The WorkerService calls' bodies but the store's (rpc_table.h), run under the Coordinator's
// lock: membership, the window barriers, checkpoints, evaluation, and the Attach stream.
#include "common/proto_bytes.h"
#include "common/status_macros.h"
#include "coordinator/coordinator.h"

namespace trainstep {

std::string PlaceKey(v1::HeartbeatResponse place) {
  place.clear_state_version();
  return ComparableBytes(place);
}

template <typename Resp, typename Call>
absl::StatusOr<Answer<Resp>> Coordinator::ObservedBarrier(const char* rpc, const char* phase,
                                                          const std::string& job_id,
                                                          absl::Time arrived, absl::Time now,
                                                          Call call) {
  ASSIGN_OR_RETURN(StepMachine * m, registry_.Machine(job_id));
  absl::StatusOr<Answer<Resp>> answer = call(m);
  if (options_.metrics == nullptr) return answer;
  if (!answer.ok()) {
    options_.metrics->OnRejected(rpc, absl::StatusCodeToString(answer.status().code()));
  } else if (answer->ready && phase != nullptr) {
    options_.metrics->OnBarrierWait(phase, absl::ToDoubleSeconds(now - arrived));
  }
  return answer;
}

absl::StatusOr<Answer<v1::RegisterWorkerResponse>> Coordinator::AnswerRegisterWorker(
    const v1::RegisterWorkerRequest& req, const CallContext&, absl::Time now) {
  ASSIGN_OR_RETURN(v1::RegisterWorkerResponse resp, registry_.RegisterWorker(req, now));
  return Ready(std::move(resp));
}

absl::StatusOr<Answer<v1::HeartbeatResponse>> Coordinator::AnswerHeartbeat(
    const v1::HeartbeatRequest& req, const CallContext&, absl::Time now) {
  ASSIGN_OR_RETURN(StepMachine * m, registry_.Machine(req.job_id()));
  ASSIGN_OR_RETURN(v1::HeartbeatResponse resp, m->Heartbeat(req, now));
  resp.set_coordinator_id(id_);
  resp.set_state_version(m->version());
  return Ready(std::move(resp));
}

absl::StatusOr<Answer<v1::BeginWindowResponse>> Coordinator::AnswerBeginWindow(
    const v1::BeginWindowRequest& req, const CallContext& ctx, absl::Time now) {
  return ObservedBarrier<v1::BeginWindowResponse>(
      "BeginWindow", "begin", req.job_id(), ctx.arrived, now,
      [&](StepMachine* m) { return m->BeginWindow(req, now); });
}

absl::StatusOr<Answer<v1::CompleteWindowResponse>> Coordinator::AnswerCompleteWindow(
    const v1::CompleteWindowRequest& req, const CallContext& ctx, absl::Time now) {
  return ObservedBarrier<v1::CompleteWindowResponse>(
      "CompleteWindow", "complete", req.job_id(), ctx.arrived, now,
      [&](StepMachine* m) { return m->CompleteWindow(req, now); });
}

absl::StatusOr<Answer<v1::AckCheckpointResponse>> Coordinator::AnswerAckCheckpoint(
    const v1::AckCheckpointRequest& req, const CallContext&, absl::Time now) {
  ASSIGN_OR_RETURN(StepMachine * m, registry_.Machine(req.job_id()));
  RETURN_IF_ERROR(m->AckCheckpoint(req, now));
  return Ready(v1::AckCheckpointResponse());
}

absl::StatusOr<Answer<v1::ReportEvalResponse>> Coordinator::AnswerReportEval(
    const v1::ReportEvalRequest& req, const CallContext& ctx, absl::Time now) {
  return ObservedBarrier<v1::ReportEvalResponse>(
      "ReportEval", /*phase=*/nullptr, req.job_id(), ctx.arrived, now,
      [&](StepMachine* m) { return m->ReportEval(req, now); });
}

absl::StatusOr<Answer<v1::ReportFailureResponse>> Coordinator::AnswerReportFailure(
    const v1::ReportFailureRequest& req, const CallContext&, absl::Time now) {
  RETURN_IF_ERROR(registry_.ReportFailure(req, now));
  return Ready(v1::ReportFailureResponse());
}

absl::StatusOr<Answer<v1::HeartbeatResponse>> Coordinator::NextPlace(const v1::AttachRequest& req,
                                                                     uint64_t seq,
                                                                     const std::string& last_sent,
                                                                     absl::Time now) {
  ASSIGN_OR_RETURN(StepMachine * m, registry_.Machine(req.job_id()));
  Answer<v1::HeartbeatResponse> a;
  ASSIGN_OR_RETURN(a.response, m->Attach(req, seq, now));
  a.response.set_coordinator_id(id_);
  a.ready = PlaceKey(a.response) != last_sent;  // not every change of the job: its place
  a.response.set_state_version(m->version());
  return a;
}

}  // namespace trainstep
