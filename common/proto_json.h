// Protobuf messages as JSON the way trainstep prints them everywhere (logs, CLI, files):
// the .proto field names, every field present (zeros included), one line unless pretty.
#ifndef TRAINSTEP_COMMON_PROTO_JSON_H_
#define TRAINSTEP_COMMON_PROTO_JSON_H_

#include <string>

#include <google/protobuf/message.h>

namespace trainstep {

std::string ToJson(const google::protobuf::Message& message, bool pretty = false);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_PROTO_JSON_H_
