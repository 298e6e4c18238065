// The rendezvous store's calls (rpc_table.h), run under the Coordinator's lock: each job's
// KvStore, and the reads that end an over generation's waits (the request's generation).
#include "common/status_macros.h"
#include "coordinator/coordinator.h"

namespace trainstep {

absl::StatusOr<Answer<v1::StoreSetResponse>> Coordinator::AnswerStoreSet(
    const v1::StoreSetRequest& req, const CallContext&, absl::Time) {
  ASSIGN_OR_RETURN(KvStore * store, KnownJobStore(req.job_id()));
  RETURN_IF_ERROR(store->Set(req.key(), req.value()));
  return Ready(v1::StoreSetResponse());
}

absl::StatusOr<Answer<v1::StoreGetResponse>> Coordinator::AnswerStoreGet(
    const v1::StoreGetRequest& req, const CallContext&, absl::Time now) {
  ASSIGN_OR_RETURN(StepMachine * m, registry_.Machine(req.job_id()));
  RETURN_IF_ERROR(m->CheckRendezvousKey(req.generation(), req.key()));
  Answer<v1::StoreGetResponse> a;
  std::optional<std::string> value = StoreOf(req.job_id()).Get(req.key());
  if (value.has_value()) {
    a.ready = true;
    a.response.set_value(std::move(*value));
  } else {
    RETURN_IF_ERROR(m->RendezvousKeyMissing(req.generation(), req.key(), now));
  }
  return a;
}

absl::StatusOr<Answer<v1::StoreAddResponse>> Coordinator::AnswerStoreAdd(
    const v1::StoreAddRequest& req, const CallContext&, absl::Time) {
  ASSIGN_OR_RETURN(KvStore * store, KnownJobStore(req.job_id()));
  ASSIGN_OR_RETURN(int64_t value, store->Add(req.key(), req.delta()));
  v1::StoreAddResponse resp;
  resp.set_value(value);
  return Ready(std::move(resp));
}

absl::StatusOr<Answer<v1::StoreCompareSetResponse>> Coordinator::AnswerStoreCompareSet(
    const v1::StoreCompareSetRequest& req, const CallContext&, absl::Time) {
  ASSIGN_OR_RETURN(KvStore * store, KnownJobStore(req.job_id()));
  v1::StoreCompareSetResponse resp;
  ASSIGN_OR_RETURN(*resp.mutable_value(),
                   store->CompareSet(req.key(), req.expected(), req.desired()));
  return Ready(std::move(resp));
}

absl::StatusOr<Answer<v1::StoreCheckResponse>> Coordinator::AnswerStoreCheck(
    const v1::StoreCheckRequest& req, const CallContext&, absl::Time) {
  ASSIGN_OR_RETURN(KvStore * store, KnownJobStore(req.job_id()));
  v1::StoreCheckResponse resp;
  resp.set_all_present(store->HasAll({req.keys().begin(), req.keys().end()}));
  return Ready(std::move(resp));
}

absl::StatusOr<Answer<v1::StoreWaitResponse>> Coordinator::AnswerStoreWait(
    const v1::StoreWaitRequest& req, const CallContext&, absl::Time now) {
  ASSIGN_OR_RETURN(StepMachine * m, registry_.Machine(req.job_id()));
  for (const std::string& key : req.keys()) {
    RETURN_IF_ERROR(m->CheckRendezvousKey(req.generation(), key));
  }
  Answer<v1::StoreWaitResponse> a;
  KvStore& store = StoreOf(req.job_id());
  a.ready = store.HasAll({req.keys().begin(), req.keys().end()});
  for (const std::string& key : req.keys()) {
    if (!a.ready && !store.Get(key).has_value()) {
      RETURN_IF_ERROR(m->RendezvousKeyMissing(req.generation(), key, now));
    }
  }
  return a;
}

absl::StatusOr<Answer<v1::StoreDeleteKeyResponse>> Coordinator::AnswerStoreDeleteKey(
    const v1::StoreDeleteKeyRequest& req, const CallContext&, absl::Time) {
  ASSIGN_OR_RETURN(KvStore * store, KnownJobStore(req.job_id()));
  v1::StoreDeleteKeyResponse resp;
  resp.set_deleted(store->Delete(req.key()));
  return Ready(std::move(resp));
}

absl::StatusOr<Answer<v1::StoreNumKeysResponse>> Coordinator::AnswerStoreNumKeys(
    const v1::StoreNumKeysRequest& req, const CallContext&, absl::Time) {
  ASSIGN_OR_RETURN(KvStore * store, KnownJobStore(req.job_id()));
  v1::StoreNumKeysResponse resp;
  resp.set_num_keys(store->size());
  return Ready(std::move(resp));
}

}  // namespace trainstep
