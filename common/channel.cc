#include "common/channel.h"

namespace trainstep {
namespace {

constexpr char kServiceConfig[] = R"({
  "methodConfig": [{
    "name": [{"service": "trainstep.v1.WorkerService"}, {"service": "trainstep.v1.JobService"}],
    "retryPolicy": {
      "maxAttempts": 5,
      "initialBackoff": "0.05s",
      "maxBackoff": "0.25s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
})";

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ChannelSecurity& security) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  // Reconnect quickly after a coordinator restart (gRPC's default backoff grows to 120 s):
  // a restarted coordinator is reached within ~0.3 s of listening, not seconds later.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 250);
  args.SetServiceConfigJSON(kServiceConfig);
  return grpc::CreateCustomChannel(address, ChannelCredentials(security), args);
}

}  // namespace trainstep
