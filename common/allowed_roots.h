// The paths a worker lets job specs touch. A spec comes from whoever can submit a job; the
// worker runs with its own user's file permissions, so without limits a spec could train on
// (and its checkpoints, samples and loss curve reveal) any file that user can read — the
// worker's own TLS key among them.
//
// Two rules, both applied to every path after resolving ".." and every symlink (a symlink
// inside a root that points outside is outside):
//  * roots (worker flag --allowed-roots): a path must be a root or below one. A root may hold
//    the component {owner}: the job's owner, percent-encoded, so that each tenant gets a
//    subtree of its own (/data/{owner} is /data/DNS%3Atrainstep-client for that principal).
//  * the worker's own secrets (its TLS files, its token file, the Kubernetes service-account
//    token, /proc where its memory and environment are): whatever the roots, a path that is
//    one of them, lies inside one, or is a directory that contains one is refused.
// Thread-safe (immutable once made).
#ifndef TRAINSTEP_COMMON_ALLOWED_ROOTS_H_
#define TRAINSTEP_COMMON_ALLOWED_ROOTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainstep/v1/spec.pb.h"

namespace trainstep {

// A file or directory of the worker's own that no job may name, and what it is (for errors).
struct Secret {
  std::string what;  // "TLS key (--tls-key)", "service-account token", …
  std::string path;
};

// What every worker refuses besides the secrets it is given: the service-account token
// directory Kubernetes mounts into pods by default, and /proc (the process's memory, its
// environment with TRAINSTEP_TOKEN, its open files).
std::vector<Secret> ProcessSecrets();

// The owner {owner} stands for when the coordinator authenticates nobody (the local launcher).
inline constexpr char kUnauthenticatedOwner[] = "local";

// `owner` as one path component: every byte outside [A-Za-z0-9._-] as %XX (upper-case hex);
// "." and ".." wholly in %XX, so that no owner names its root's parent or the root itself;
// "" is kUnauthenticatedOwner.
std::string EncodeOwner(absl::string_view owner);

class AllowedRoots {
 public:
  // No roots: every path but the secrets is allowed (the worker warns at start).
  AllowedRoots() = default;
  // "DIR[,DIR…]": each an existing directory, resolved now; a root with {owner} (a whole path
  // component) needs the directory above that component to exist. Empty = no roots.
  static absl::StatusOr<AllowedRoots> Parse(absl::string_view flag,
                                            std::vector<Secret> secrets = ProcessSecrets());

  // Roots were given (--allowed-roots / counts: all paths, given on purpose).
  bool restricted() const { return !roots_.empty(); }
  // Some root holds {owner}: Check needs ForOwner first.
  bool per_owner() const;
  // The resolved roots ({owner} still in those not yet bound), comma-separated, for messages.
  std::string ToString() const;

  // These roots for one job: {owner} replaced by EncodeOwner(owner) ("" is
  // kUnauthenticatedOwner) and resolved. FAILED_PRECONDITION naming the root and the directory
  // if an owner's directory does not exist: an operator creates one per owner.
  absl::StatusOr<AllowedRoots> ForOwner(absl::string_view owner) const;

  // OK if `path` (relative to the working directory), once resolved, is no secret (nor inside
  // or above one) and is a root or below one. A path that does not exist yet (a checkpoint
  // dir) is resolved as far as it exists. PERMISSION_DENIED naming `field`, the path and what
  // it resolves to, and why; FAILED_PRECONDITION on roots with {owner} not yet bound.
  absl::Status Check(absl::string_view field, const std::string& path) const;

 private:
  struct Root {
    std::string given;     // as on the command line, for messages
    std::string resolved;  // without a trailing slash ("/" stays "/"); with {owner}: the
                           // resolved directory above it, then the rest as given
    bool per_owner = false;
  };
  std::vector<Root> roots_;
  std::vector<Secret> secrets_;
};

// Checks every path a resolved job spec names: the data (data.text.paths[i],
// data.jsonl.path, data.tokens.path), the held-out data (the same under eval.data), the model
// (model.torchscript.path, model.llama.path) and the checkpoint directory (checkpoint.dir).
// Files found inside a data or model directory are checked when they are read
// (data::Dataset::Load, the Llama loader). A path field added to the spec is added here.
absl::Status CheckSpecPaths(const v1::JobSpec& spec, const AllowedRoots& roots);

// A worker that talks TLS to its coordinator is a real deployment, where specs come from
// tenants: it must be given --allowed-roots (--allowed-roots / to allow every path knowingly).
// INVALID_ARGUMENT saying so otherwise.
absl::Status RequireRootsWithTls(bool tls, const AllowedRoots& roots);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_ALLOWED_ROOTS_H_
