// The directories a worker lets job specs touch (worker flag --allowed-roots). A spec comes
// from whoever can submit a job; the worker runs with its own user's file permissions, so
// without roots a spec could train on (and its checkpoints reveal) any file that user can read.
// Paths are resolved (".." and every symlink) before they are compared: a symlink inside a
// root that points outside is outside. Thread-safe (immutable after Parse).
#ifndef TRAINSTEP_COMMON_ALLOWED_ROOTS_H_
#define TRAINSTEP_COMMON_ALLOWED_ROOTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainstep/v1/spec.pb.h"

namespace trainstep {

class AllowedRoots {
 public:
  // No roots: every path is allowed (the worker warns at start).
  AllowedRoots() = default;
  // "DIR[,DIR…]"; each must be an existing directory, resolved now. Empty = no roots.
  static absl::StatusOr<AllowedRoots> Parse(absl::string_view flag);

  bool restricted() const { return !roots_.empty(); }
  // The resolved roots, comma-separated, for messages.
  std::string ToString() const;

  // OK if `path` (relative to the working directory), once resolved, is a root or below one.
  // A path that does not exist yet (a checkpoint dir) is resolved as far as it exists.
  // PERMISSION_DENIED naming `field`, the path, what it resolves to and the roots otherwise.
  absl::Status Check(absl::string_view field, const std::string& path) const;

 private:
  std::vector<std::string> roots_;  // resolved, without a trailing slash ("/" stays "/")
};

// Checks every path a resolved job spec names: the data (data.text.paths[i],
// data.jsonl.path, data.tokens.path), the model (model.torchscript.path) and the checkpoint
// directory (checkpoint.dir). Files found inside a data directory are checked when the
// dataset reads them (data::Dataset::Load).
absl::Status CheckSpecPaths(const v1::JobSpec& spec, const AllowedRoots& roots);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_ALLOWED_ROOTS_H_
