// The channel every trainstep process opens to the coordinator (the worker, the client, the
// tests' simulated workers): one place for keepalives, retries and the message limit.
#ifndef TRAINSTEP_COMMON_CHANNEL_H_
#define TRAINSTEP_COMMON_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/tls.h"

namespace trainstep {

// The largest message the coordinator receives: gRPC's default, set explicitly on its server
// so that clients can check a request against it before sending it.
inline constexpr int kMaxMessageBytes = 4 * 1024 * 1024;

// A channel with the project's conventions: keepalive 30 s / 10 s, transparent retries of
// UNAVAILABLE (5 attempts, exponential backoff), default 4 MiB messages; plaintext, or TLS
// (and a bearer token) as `security` says (common/tls.h).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ChannelSecurity& security = {});

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_CHANNEL_H_
