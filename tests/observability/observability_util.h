// Small tools for the observability tests: a plain HTTP GET on loopback (no curl), child
// processes (spawned with a log file, or run to completion with their output), JSON parsed
// with protobuf's google.protobuf.Value (no new dependency), and the Prometheus text format
// read just enough to list the metric names an endpoint exports.
#ifndef TRAINSTEP_TESTS_OBSERVABILITY_OBSERVABILITY_UTIL_H_
#define TRAINSTEP_TESTS_OBSERVABILITY_OBSERVABILITY_UTIL_H_

#include <google/protobuf/struct.pb.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainstep::obs {

// The source tree and the build's bin/ directory, set by CMake.
std::string SourceDir();
std::string BinDir();

// A TCP connection to 127.0.0.1:port whose sends and receives give up after `timeout`; the
// caller closes the descriptor.
absl::StatusOr<int> ConnectLoopback(int port, absl::Duration timeout = absl::Seconds(5));

// GET http://127.0.0.1:port<target> (HTTP/1.0, so no keep-alive). Non-2xx is an error
// carrying the body. Chunked responses are decoded.
absl::StatusOr<std::string> HttpGet(int port, const std::string& target,
                                    absl::Duration timeout = absl::Seconds(5));

// "a b&c" → "a%20b%26c" (for PromQL in a query string).
std::string UrlEncode(const std::string& s);

// A TCP port on 127.0.0.1 that was free a moment ago (for servers that need one named).
absl::StatusOr<int> PickFreePort();

// The absolute path of `name` on $PATH or in /usr/bin, /usr/sbin; nullopt if absent.
std::optional<std::string> FindProgram(const std::string& name);

struct ProcessResult {
  int exit_code = -1;  // 128 + signal if killed; -1 if it could not start
  std::string output;  // stdout and stderr together
};
// Runs argv[0] (an absolute path) with `input` on stdin; kills it after `timeout`.
ProcessResult RunProgram(const std::vector<std::string>& argv, const std::string& input = "",
                         absl::Duration timeout = absl::Seconds(60));

// A background process whose stdout and stderr go to a log file; killed (SIGTERM, then
// SIGKILL after a grace period) when destroyed.
class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::vector<std::string>& argv,
                                                             const std::string& log_path);
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  bool running();
  // SIGTERM, wait up to `grace`, then SIGKILL. Returns the exit code (128 + signal).
  int Stop(absl::Duration grace = absl::Seconds(10));
  std::string LogTail(int lines = 40) const;

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::string log_path_;
};

std::string ReadFileOrEmpty(const std::string& path);
absl::Status WriteFile(const std::string& path, const std::string& text);

// Polls `condition` every 20 ms until it is true or `timeout` passes.
bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout);

// `{"grpc_port": 1, "metrics_port": 2}` → its integer fields.
std::map<std::string, int64_t> ParsePortFile(const std::string& text);

// Any JSON document; an error names where it failed.
absl::StatusOr<google::protobuf::Value> ParseJson(const std::string& text);
// obj["a"]["b"]... ; nullptr when a key is missing or a level is not an object.
const google::protobuf::Value* JsonPath(const google::protobuf::Value& v,
                                        const std::vector<std::string>& keys);

// One sample line of the Prometheus text format.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
// Every sample; comment and blank lines are skipped. Malformed lines are an error.
absl::StatusOr<std::vector<Sample>> ParseExposition(const std::string& text);
// The names that occur in sample lines (histograms as their _bucket, _sum and _count).
std::set<std::string> SampleNames(const std::vector<Sample>& samples);
// The value of the one sample with this name whose labels include `labels`.
std::optional<double> FindSample(const std::vector<Sample>& samples, const std::string& name,
                                 const std::map<std::string, std::string>& labels);

// A PromQL expression read just enough to check it against an endpoint: the metric names it
// selects (not functions, keywords, label names or Grafana variables), each selector's
// label matchers, and the labels of by / without / on / ignoring clauses.
struct PromqlMatcher {
  std::string label, op, value;  // op: = != =~ !~
};
struct PromqlSelector {
  std::string metric;
  std::vector<PromqlMatcher> matchers;
};
struct PromqlRefs {
  std::set<std::string> metrics;
  std::vector<PromqlSelector> selectors;  // only those with a metric name
  std::set<std::string> grouping_labels;
};
PromqlRefs ReadPromql(const std::string& expr);

}  // namespace trainstep::obs

#endif  // TRAINSTEP_TESTS_OBSERVABILITY_OBSERVABILITY_UTIL_H_
