// The job a request is about, read by reflection: the authorization checks it and the
// coordinator files a waiting call under it, and no handler can forget to pass it.
#ifndef TRAINSTEP_COORDINATOR_REQUEST_JOB_ID_H_
#define TRAINSTEP_COORDINATOR_REQUEST_JOB_ID_H_

#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace trainstep {

// The request's job_id field; "" for requests without one.
template <typename Req>
std::string JobIdOfRequest(const Req& req) {
  const google::protobuf::FieldDescriptor* f = Req::descriptor()->FindFieldByName("job_id");
  if (f == nullptr || f->type() != google::protobuf::FieldDescriptor::TYPE_STRING ||
      f->is_repeated()) {
    return "";
  }
  return req.GetReflection()->GetString(req, f);
}

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_REQUEST_JOB_ID_H_
