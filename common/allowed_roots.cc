#include "common/allowed_roots.h"

#include <deque>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
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

}  // namespace

absl::StatusOr<AllowedRoots> AllowedRoots::Parse(absl::string_view flag) {
  AllowedRoots roots;
  for (absl::string_view part : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    const std::string dir(absl::StripAsciiWhitespace(part));
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--allowed-roots: ", dir, " is not an existing directory"));
    }
    ASSIGN_OR_RETURN(std::string resolved, Resolve(dir));
    roots.roots_.push_back(std::move(resolved));
  }
  return roots;
}

std::string AllowedRoots::ToString() const { return absl::StrJoin(roots_, ","); }

absl::Status AllowedRoots::Check(absl::string_view field, const std::string& path) const {
  if (roots_.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::string resolved, Resolve(path));
  for (const std::string& root : roots_) {
    if (IsWithin(resolved, root)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": ", path, resolved == path ? "" : absl::StrCat(" (resolves to ", resolved, ")"),
      " is outside this worker's --allowed-roots ", ToString()));
}

absl::Status CheckSpecPaths(const v1::JobSpec& spec, const AllowedRoots& roots) {
  const v1::Data& data = spec.data();
  for (int i = 0; i < data.text().paths_size(); ++i) {
    RETURN_IF_ERROR(roots.Check(absl::StrCat("data.text.paths[", i, "]"), data.text().paths(i)));
  }
  if (data.has_jsonl()) RETURN_IF_ERROR(roots.Check("data.jsonl.path", data.jsonl().path()));
  if (data.has_tokens()) RETURN_IF_ERROR(roots.Check("data.tokens.path", data.tokens().path()));
  if (spec.model().has_torchscript()) {
    RETURN_IF_ERROR(roots.Check("model.torchscript.path", spec.model().torchscript().path()));
  }
  if (!spec.checkpoint().dir().empty()) {
    RETURN_IF_ERROR(roots.Check("checkpoint.dir", spec.checkpoint().dir()));
  }
  return absl::OkStatus();
}

}  // namespace trainstep
