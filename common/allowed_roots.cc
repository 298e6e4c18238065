#include "common/allowed_roots.h"

#include <deque>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace trainstep {
namespace {

namespace fs = std::filesystem;

// Resolves as the kernel would: component by component, following every symlink, even one
// whose target does not exist yet (a dangling link inside a root to a directory outside would
// otherwise look inside, and creating the checkpoint dir would create it outside). Components
// that do not exist are kept as they are.
absl::StatusOr<std::string> Resolve(const std::string& path) {
  std::error_code ec;
  const fs::path start = fs::absolute(path, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve ", path, ": ", ec.message()));
  std::deque<std::string> todo;
  for (const fs::path& part : start.relative_path()) todo.push_back(part.string());
  fs::path resolved = "/";
  int links = 0;
  while (!todo.empty()) {
    const std::string part = std::move(todo.front());
    todo.pop_front();
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      resolved = resolved.parent_path();
      continue;
    }
    const fs::path next = resolved / part;
    if (!fs::is_symlink(fs::symlink_status(next, ec))) {
      resolved = next;
      continue;
    }
    if (++links > 40) {  // the kernel's own limit (ELOOP)
      return absl::InvalidArgumentError(
          absl::StrCat("cannot resolve ", path, ": too many symlinks"));
    }
    const fs::path target = fs::read_symlink(next, ec);
    if (ec) {
      return absl::Status(
          absl::ErrnoToStatusCode(ec.value()),
          absl::StrCat("cannot resolve ", path, ": ", next.string(), ": ", ec.message()));
    }
    std::vector<std::string> parts;
    for (const fs::path& p : target.relative_path()) parts.push_back(p.string());
    todo.insert(todo.begin(), parts.begin(), parts.end());
    if (target.is_absolute()) resolved = "/";
  }
  return resolved.string();
}

bool IsWithin(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

constexpr char kOwner[] = "{owner}";
constexpr size_t kOwnerSize = sizeof(kOwner) - 1;

}  // namespace

std::vector<Secret> ProcessSecrets() {
  return {{"service-account token directory", "/var/run/secrets/kubernetes.io/serviceaccount"},
          {"process files (/proc: its memory, environment and open files)", "/proc"}};
}

std::string EncodeOwner(absl::string_view owner) {
  if (owner.empty()) owner = kUnauthenticatedOwner;
  const bool dots_only = owner == "." || owner == "..";
  std::string out;
  for (const char c : owner) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (!dots_only && (absl::ascii_isalnum(u) || c == '.' || c == '_' || c == '-')) {
      out.push_back(c);
    } else {
      absl::StrAppendFormat(&out, "%%%02X", u);
    }
  }
  return out;
}

absl::StatusOr<AllowedRoots> AllowedRoots::Parse(absl::string_view flag,
                                                 std::vector<Secret> secrets) {
  AllowedRoots roots;
  roots.secrets_ = std::move(secrets);
  for (absl::string_view part : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    Root root;
    root.given = std::string(absl::StripAsciiWhitespace(part));
    std::string dir = root.given;
    std::string owner_tail;  // "{owner}" and what follows it
    const size_t at = root.given.find(kOwner);
    if (at != std::string::npos) {
      // A whole component, once: /data/{owner} or /ckpt/{owner}/runs, never /data/x{owner}.
      const size_t end = at + kOwnerSize;
      if (at == 0 || root.given[at - 1] != '/' ||
          (end < root.given.size() && root.given[end] != '/') ||
          root.given.find(kOwner, end) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("--allowed-roots: ", root.given,
                         ": {owner} must be one whole path component, once (e.g. /data/{owner})"));
      }
      root.per_owner = true;
      dir = root.given.substr(0, at);
      owner_tail = root.given.substr(at);
    }
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      return absl::InvalidArgumentError(absl::StrCat("--allowed-roots: ", dir,
                                                     " is not an existing directory",
                                                     root.per_owner ? " (above {owner})" : ""));
    }
    ASSIGN_OR_RETURN(root.resolved, Resolve(dir));
    if (root.per_owner) {
      if (root.resolved != "/") root.resolved += "/";
      root.resolved += owner_tail;
    }
    roots.roots_.push_back(std::move(root));
  }
  return roots;
}

bool AllowedRoots::per_owner() const {
  for (const Root& root : roots_) {
    if (root.per_owner) return true;
  }
  return false;
}

std::string AllowedRoots::ToString() const {
  std::vector<absl::string_view> parts;
  for (const Root& root : roots_) parts.push_back(root.resolved);
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<AllowedRoots> AllowedRoots::ForOwner(absl::string_view owner) const {
  AllowedRoots bound = *this;
  const std::string component = EncodeOwner(owner);
  for (Root& root : bound.roots_) {
    if (!root.per_owner) continue;
    // The last {owner}: the one appended after the resolved directory above it.
    std::string dir = root.resolved;
    dir.replace(dir.rfind(kOwner), kOwnerSize, component);
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--allowed-roots ", root.given, ": ", dir, " does not exist for the job's owner \"",
          owner.empty() ? kUnauthenticatedOwner : owner,
          "\" (each owner's directory is made by whoever runs the workers)"));
    }
    ASSIGN_OR_RETURN(root.resolved, Resolve(dir));
    root.per_owner = false;
  }
  return bound;
}

absl::Status AllowedRoots::Check(absl::string_view field, const std::string& path) const {
  ASSIGN_OR_RETURN(const std::string resolved, Resolve(path));
  const std::string shown = absl::StrCat(
      field, ": ", path, resolved == path ? "" : absl::StrCat(" (resolves to ", resolved, ")"));
  for (const Secret& secret : secrets_) {
    if (secret.path.empty()) continue;
    absl::StatusOr<std::string> own = Resolve(secret.path);
    if (!own.ok()) continue;  // cannot be named if it cannot be resolved
    if (IsWithin(resolved, *own) || IsWithin(*own, resolved)) {
      return absl::PermissionDeniedError(
          absl::StrCat(shown,
                       resolved == *own           ? " is"
                       : IsWithin(resolved, *own) ? " is inside"
                                                  : " contains",
                       " this worker's own ", secret.what, " ", secret.path,
                       ": a job may never read or write it, whatever --allowed-roots says"));
    }
  }
  if (roots_.empty()) return absl::OkStatus();
  if (per_owner()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": --allowed-roots with {owner} are not yet bound to a job's owner"));
  }
  for (const Root& root : roots_) {
    if (IsWithin(resolved, root.resolved)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat(shown, " is outside this worker's --allowed-roots ", ToString()));
}

namespace {

absl::Status CheckDataPaths(absl::string_view prefix, const v1::Data& data,
                            const AllowedRoots& roots) {
  for (int i = 0; i < data.text().paths_size(); ++i) {
    RETURN_IF_ERROR(roots.Check(absl::StrCat(prefix, "text.paths[", i, "]"), data.text().paths(i)));
  }
  if (data.has_jsonl()) {
    RETURN_IF_ERROR(roots.Check(absl::StrCat(prefix, "jsonl.path"), data.jsonl().path()));
  }
  if (data.has_tokens()) {
    RETURN_IF_ERROR(roots.Check(absl::StrCat(prefix, "tokens.path"), data.tokens().path()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSpecPaths(const v1::JobSpec& spec, const AllowedRoots& roots) {
  RETURN_IF_ERROR(CheckDataPaths("data.", spec.data(), roots));
  if (spec.has_eval()) RETURN_IF_ERROR(CheckDataPaths("eval.data.", spec.eval().data(), roots));
  if (spec.model().has_torchscript()) {
    RETURN_IF_ERROR(roots.Check("model.torchscript.path", spec.model().torchscript().path()));
  }
  if (!spec.model().llama().path().empty()) {
    RETURN_IF_ERROR(roots.Check("model.llama.path", spec.model().llama().path()));
  }
  if (!spec.model().init_from().empty()) {
    RETURN_IF_ERROR(roots.Check("model.init_from", spec.model().init_from()));
  }
  if (!spec.checkpoint().dir().empty()) {
    RETURN_IF_ERROR(roots.Check("checkpoint.dir", spec.checkpoint().dir()));
  }
  return absl::OkStatus();
}

absl::Status RequireRootsWithTls(bool tls, const AllowedRoots& roots) {
  if (!tls || roots.restricted()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "--allowed-roots is required when the worker talks TLS to its coordinator: there, job "
      "specs come from tenants, and without roots a spec may make this worker read any file its "
      "user can and write checkpoints anywhere. Name the data and checkpoint directories "
      "(e.g. --allowed-roots /data/shared,/data/{owner},/checkpoints/{owner}), or pass "
      "--allowed-roots / to allow every path knowingly");
}

}  // namespace trainstep
