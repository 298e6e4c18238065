// A message's bytes for comparing and keying: equal messages give equal bytes. Protobuf's
// default serialization writes map entries (google.protobuf.Struct is one) in the map's
// iteration order, which a copy may change, so the same Struct can serialize two ways.
#ifndef TRAINSTEP_COMMON_PROTO_BYTES_H_
#define TRAINSTEP_COMMON_PROTO_BYTES_H_

#include <google/protobuf/message.h>

#include <string>

namespace trainstep {

// Deterministic serialization: map entries in key order. Stable within one build, not a
// canonical form across protobuf versions: never persist it or send it to compare.
std::string ComparableBytes(const google::protobuf::Message& message);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_PROTO_BYTES_H_
