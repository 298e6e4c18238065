#include "tests/observability/observability_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

extern char** environ;

namespace trainstep::obs {
namespace {

void Nap(absl::Duration d) {
  std::this_thread::sleep_for(std::chrono::microseconds(absl::ToInt64Microseconds(d)));
}

// Closes a descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

absl::StatusOr<std::string> DecodeChunked(const std::string& body) {
  std::string out;
  size_t at = 0;
  while (true) {
    const size_t eol = body.find("\r\n", at);
    if (eol == std::string::npos) return absl::DataLossError("truncated chunked body");
    const std::string size_hex = body.substr(at, eol - at);
    const size_t n = std::strtoul(size_hex.c_str(), nullptr, 16);
    at = eol + 2;
    if (n == 0) return out;
    if (at + n > body.size()) return absl::DataLossError("truncated chunk");
    out.append(body, at, n);
    at += n + 2;  // the chunk's trailing CRLF
  }
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_' || c == ':'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '_' || c == ':'; }

bool ParseSampleValue(absl::string_view s, double* out) {
  const std::string lower = absl::AsciiStrToLower(s);
  if (lower == "nan") {
    *out = std::nan("");
    return true;
  }
  if (lower == "+inf" || lower == "inf") {
    *out = HUGE_VAL;
    return true;
  }
  if (lower == "-inf") {
    *out = -HUGE_VAL;
    return true;
  }
  return absl::SimpleAtod(s, out);
}

}  // namespace

std::string SourceDir() { return TRAINSTEP_TEST_SOURCE_DIR; }
std::string BinDir() { return TRAINSTEP_TEST_BIN_DIR; }

absl::StatusOr<int> ConnectLoopback(int port, absl::Duration timeout) {
  Fd s{socket(AF_INET, SOCK_STREAM, 0)};
  if (s.fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(absl::ToInt64Seconds(timeout));
  tv.tv_usec = static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout) % 1000000);
  setsockopt(s.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(s.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("connect 127.0.0.1:", port, ": ", std::strerror(errno)));
  }
  return std::exchange(s.fd, -1);
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& target, absl::Duration timeout) {
  absl::StatusOr<int> connected = ConnectLoopback(port, timeout);
  if (!connected.ok()) return connected.status();
  Fd s{*connected};
  const std::string request = absl::StrCat("GET ", target, " HTTP/1.0\r\nHost: 127.0.0.1:", port,
                                           "\r\nAccept: */*\r\nConnection: close\r\n\r\n");
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(s.fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[16384];
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    const ssize_t n = recv(s.fd, buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::DeadlineExceededError(
          absl::StrCat("GET 127.0.0.1:", port, target, ": ", std::strerror(errno)));
    }
    response.append(buf, static_cast<size_t>(n));
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat("GET 127.0.0.1:", port, target, " too slow"));
    }
  }
  const size_t head_end = response.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("no HTTP header in: ", response.substr(0, 200)));
  }
  const std::string head = response.substr(0, head_end);
  std::string body = response.substr(head_end + 4);
  // "HTTP/1.1 200 OK"
  const std::vector<std::string> status_line =
      absl::StrSplit(head.substr(0, head.find("\r\n")), ' ');
  int code = 0;
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &code)) {
    return absl::DataLossError(absl::StrCat("bad status line: ", head.substr(0, 80)));
  }
  if (absl::StrContains(absl::AsciiStrToLower(head), "transfer-encoding: chunked")) {
    absl::StatusOr<std::string> decoded = DecodeChunked(body);
    if (!decoded.ok()) return decoded.status();
    body = std::move(*decoded);
  }
  if (code < 200 || code > 299) {
    return absl::FailedPreconditionError(
        absl::StrCat("GET 127.0.0.1:", port, target, ": HTTP ", code, ": ", body.substr(0, 500)));
  }
  return body;
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

absl::StatusOr<int> PickFreePort() {
  Fd s{socket(AF_INET, SOCK_STREAM, 0)};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("bind: ", std::strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  getsockname(s.fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return static_cast<int>(ntohs(addr.sin_port));
}

std::optional<std::string> FindProgram(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) dirs = absl::StrSplit(path, ':', absl::SkipEmpty());
  dirs.push_back("/usr/bin");
  dirs.push_back("/usr/sbin");
  for (const std::string& d : dirs) {
    const std::string p = absl::StrCat(d, "/", name);
    struct stat st;
    if (stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0) return p;
  }
  return std::nullopt;
}

ProcessResult RunProgram(const std::vector<std::string>& argv, const std::string& input,
                         absl::Duration timeout) {
  ProcessResult result;
  int in_pipe[2], out_pipe[2];
  if (pipe(in_pipe) != 0) return result;
  if (pipe(out_pipe) != 0) {
    close(in_pipe[0]);
    close(in_pipe[1]);
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, in_pipe[1]);
  posix_spawn_file_actions_addclose(&actions, out_pipe[0]);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in_pipe[0]);
  close(out_pipe[1]);
  if (rc != 0) {
    close(in_pipe[1]);
    close(out_pipe[0]);
    result.output = absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc));
    return result;
  }
  // Feed stdin and drain stdout together, so that neither side can block the other.
  int to_child = in_pipe[1];
  fcntl(to_child, F_SETFL, O_NONBLOCK);
  size_t written = 0;
  if (input.empty()) {
    close(to_child);
    to_child = -1;
  }
  const absl::Time give_up = absl::Now() + timeout;
  bool killed = false;
  while (true) {
    pollfd fds[2];
    int nfds = 0;
    fds[nfds++] = {out_pipe[0], POLLIN, 0};
    if (to_child >= 0) fds[nfds++] = {to_child, POLLOUT, 0};
    const int ready = poll(fds, nfds, 100);
    if (ready < 0 && errno != EINTR) break;
    if (absl::Now() > give_up && !killed) {
      kill(pid, SIGKILL);
      killed = true;
      absl::StrAppend(&result.output, "\n[killed after ", absl::FormatDuration(timeout), "]\n");
    }
    if (ready <= 0) continue;
    if (to_child >= 0 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t n = write(to_child, input.data() + written, input.size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN) written = input.size();  // the child closed its stdin
      if (written >= input.size()) {
        close(to_child);
        to_child = -1;
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[8192];
      const ssize_t n = read(out_pipe[0], buf, sizeof(buf));
      if (n <= 0) break;  // EOF: the child (and anything it started) closed stdout
      result.output.append(buf, static_cast<size_t>(n));
    }
  }
  if (to_child >= 0) close(to_child);
  close(out_pipe[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = ExitCodeOf(status);
  return result;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, const std::string& log_path) {
  std::unique_ptr<ChildProcess> p(new ChildProcess());
  p->log_path_ = log_path;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int rc = posix_spawn(&p->pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc)));
  }
  return p;
}

ChildProcess::~ChildProcess() { Stop(absl::Seconds(5)); }

bool ChildProcess::running() {
  if (exit_code_.has_value() || pid_ <= 0) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_code_ = ExitCodeOf(status);
    return false;
  }
  return r == 0;
}

int ChildProcess::Stop(absl::Duration grace) {
  if (!running()) return exit_code_.value_or(-1);
  kill(pid_, SIGTERM);
  const absl::Time give_up = absl::Now() + grace;
  while (running()) {
    if (absl::Now() > give_up) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      exit_code_ = ExitCodeOf(status);
      break;
    }
    Nap(absl::Milliseconds(10));
  }
  return exit_code_.value_or(-1);
}

std::string ChildProcess::LogTail(int lines) const {
  std::vector<std::string> all = absl::StrSplit(ReadFileOrEmpty(log_path_), '\n');
  const size_t from = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  std::string out = absl::StrCat("---- ", log_path_, "\n");
  for (size_t i = from; i < all.size(); ++i) absl::StrAppend(&out, all[i], "\n");
  return out;
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    if (condition()) return true;
    if (absl::Now() > give_up) return false;
    Nap(absl::Milliseconds(20));
  }
}

std::map<std::string, int64_t> ParsePortFile(const std::string& text) {
  std::map<std::string, int64_t> out;
  absl::StatusOr<google::protobuf::Value> v = ParseJson(text);
  if (!v.ok() || !v->has_struct_value()) return out;
  for (const auto& [key, value] : v->struct_value().fields()) {
    if (value.has_number_value()) out[key] = static_cast<int64_t>(value.number_value());
  }
  return out;
}

absl::StatusOr<google::protobuf::Value> ParseJson(const std::string& text) {
  google::protobuf::Value v;
  const auto status = google::protobuf::util::JsonStringToMessage(text, &v);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not JSON (", status.ToString(), "): ", text.substr(0, 300)));
  }
  return v;
}

const google::protobuf::Value* JsonPath(const google::protobuf::Value& v,
                                        const std::vector<std::string>& keys) {
  const google::protobuf::Value* at = &v;
  for (const std::string& k : keys) {
    if (!at->has_struct_value()) return nullptr;
    auto it = at->struct_value().fields().find(k);
    if (it == at->struct_value().fields().end()) return nullptr;
    at = &it->second;
  }
  return at;
}

absl::StatusOr<std::vector<Sample>> ParseExposition(const std::string& text) {
  std::vector<Sample> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, " (", why, "): ", line));
    };
    Sample s;
    size_t i = 0;
    if (!IsNameStart(line[0])) return bad("metric name");
    while (i < line.size() && IsNameChar(line[i])) ++i;
    s.name = std::string(line.substr(0, i));
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t name_start = i;
        while (i < line.size() && IsNameChar(line[i])) ++i;
        const std::string label(line.substr(name_start, i - name_start));
        if (label.empty() || i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') {
          return bad("label");
        }
        i += 2;
        std::string value;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\' && i + 1 < line.size()) {
            ++i;
            value += line[i] == 'n' ? '\n' : line[i];
          } else {
            value += line[i];
          }
          ++i;
        }
        if (i >= line.size()) return bad("unterminated label value");
        ++i;  // closing quote
        s.labels[label] = value;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) return bad("unterminated labels");
      ++i;  // '}'
    }
    const std::vector<absl::string_view> rest =
        absl::StrSplit(line.substr(i), ' ', absl::SkipEmpty());
    if (rest.empty() || rest.size() > 2 || !ParseSampleValue(rest[0], &s.value)) {
      return bad("value");
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::set<std::string> SampleNames(const std::vector<Sample>& samples) {
  std::set<std::string> names;
  for (const Sample& s : samples) names.insert(s.name);
  return names;
}

std::optional<double> FindSample(const std::vector<Sample>& samples, const std::string& name,
                                 const std::map<std::string, std::string>& labels) {
  std::optional<double> found;
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) match = false;
    }
    if (!match) continue;
    if (found.has_value()) return std::nullopt;  // ambiguous
    found = s.value;
  }
  return found;
}

PromqlRefs ReadPromql(const std::string& e) {
  static const std::set<std::string> kKeywords = {
      "by",     "without", "on",     "ignoring", "group_left", "group_right", "and", "or",
      "unless", "bool",    "offset", "inf",      "nan",        "Inf",         "NaN"};
  static const std::set<std::string> kGrouping = {"by",       "without",    "on",
                                                  "ignoring", "group_left", "group_right"};
  // Aggregations may be followed by a by / without clause instead of their parenthesis.
  static const std::set<std::string> kAggregations = {
      "sum",   "min",          "max",     "avg",  "group",    "stddev", "stdvar",
      "count", "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"};
  PromqlRefs out;
  auto skip_spaces = [&e](size_t i) {
    while (i < e.size() && absl::ascii_isspace(e[i])) ++i;
    return i;
  };
  auto read_name = [&e](size_t i) {
    size_t j = i;
    while (j < e.size() && IsNameChar(e[j])) ++j;
    return j;
  };
  // Reads a quoted string starting at e[i]; returns the index after it.
  auto read_string = [&e](size_t i, std::string* value) {
    const char quote = e[i++];
    while (i < e.size() && e[i] != quote) {
      if (e[i] == '\\' && i + 1 < e.size()) ++i;
      if (value != nullptr) *value += e[i];
      ++i;
    }
    return i + 1;
  };
  // Reads {a="x", b=~"y"} starting at the brace; returns the index after it.
  auto read_matchers = [&](size_t i, std::vector<PromqlMatcher>* matchers) {
    ++i;
    while (i < e.size() && e[i] != '}') {
      i = skip_spaces(i);
      if (i < e.size() && e[i] == ',') {
        ++i;
        continue;
      }
      if (i >= e.size() || e[i] == '}') break;
      PromqlMatcher m;
      const size_t end = read_name(i);
      m.label = e.substr(i, end - i);
      i = skip_spaces(end);
      while (i < e.size() && (e[i] == '=' || e[i] == '!' || e[i] == '~')) m.op += e[i++];
      i = skip_spaces(i);
      if (i < e.size() && (e[i] == '"' || e[i] == '\'' || e[i] == '`')) {
        i = read_string(i, &m.value);
      } else {
        ++i;  // malformed: move on
      }
      if (!m.label.empty()) matchers->push_back(std::move(m));
    }
    return i + 1;
  };
  size_t i = 0;
  while (i < e.size()) {
    const char c = e[i];
    if (c == '"' || c == '\'' || c == '`') {
      i = read_string(i, nullptr);
    } else if (c == '[') {  // a range or subquery duration
      while (i < e.size() && e[i] != ']') ++i;
      ++i;
    } else if (c == '$') {  // a Grafana variable: $x, ${x}, $__rate_interval
      ++i;
      if (i < e.size() && e[i] == '{') {
        while (i < e.size() && e[i] != '}') ++i;
        ++i;
      } else {
        i = read_name(i);
      }
    } else if (absl::ascii_isdigit(c) ||
               (c == '.' && i + 1 < e.size() && absl::ascii_isdigit(e[i + 1]))) {
      while (i < e.size() && (absl::ascii_isalnum(e[i]) || e[i] == '.')) ++i;  // 0.5, 1e3, 5m
    } else if (c == '{') {  // a selector without a metric name
      std::vector<PromqlMatcher> ignored;
      i = read_matchers(i, &ignored);
    } else if (IsNameStart(c)) {
      const size_t end = read_name(i);
      const std::string name = e.substr(i, end - i);
      const size_t next = skip_spaces(end);
      if (kGrouping.count(name) && next < e.size() && e[next] == '(') {
        size_t j = next + 1;
        while (j < e.size() && e[j] != ')') {
          const size_t label_end = read_name(j);
          if (label_end > j) {
            out.grouping_labels.insert(e.substr(j, label_end - j));
            j = label_end;
          } else {
            ++j;  // a comma or a space
          }
        }
        i = j + 1;
      } else if (kKeywords.count(name) || kAggregations.count(name) ||
                 (next < e.size() && e[next] == '(')) {
        i = end;  // a keyword, or a function / aggregation call
      } else {
        PromqlSelector sel;
        sel.metric = name;
        i = end;
        if (next < e.size() && e[next] == '{') i = read_matchers(next, &sel.matchers);
        out.metrics.insert(name);
        out.selectors.push_back(std::move(sel));
      }
    } else {
      ++i;
    }
  }
  return out;
}

}  // namespace trainstep::obs
