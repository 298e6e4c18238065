// Protobuf messages as JSON the way trainstep prints them everywhere (logs, CLI, files):
// the .proto field names, every field present (zeros included), one line unless pretty.
#ifndef TRAINSTEP_COMMON_PROTO_JSON_H_
#define TRAINSTEP_COMMON_PROTO_JSON_H_

#include <google/protobuf/message.h>

#include <string>

namespace trainstep {

std::string ToJson(const google::protobuf::Message& message, bool pretty = false);

// A flat record (scalar fields only, like UpdateRecord) as one JSON line the way data tools
// want it: 64-bit integers as numbers (protobuf's mapping quotes them), doubles at full
// precision, non-finite doubles and unset `optional` fields as null (JSON has no NaN). Nested
// fields use ToJson.
std::string RecordToJson(const google::protobuf::Message& record);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_PROTO_JSON_H_
