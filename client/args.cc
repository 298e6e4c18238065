#include "client/args.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/address.h"

namespace trainstep::client {
namespace {

struct Verb {
  const char* noun;
  const char* verb;
  Command command;
  const char* operand;  // "" = none
  const char* summary;
};

constexpr Verb kVerbs[] = {
    {"job", "submit", Command::kJobSubmit, "SPEC.json",
     "submit a job (SPEC.json may be - for stdin)"},
    {"job", "get", Command::kJobGet, "ID", "show a job: state, progress and its resolved spec"},
    {"job", "list", Command::kJobList, "", "list jobs"},
    {"job", "watch", Command::kJobWatch, "ID", "follow a job's progress until it ends"},
    {"job", "cancel", Command::kJobCancel, "ID", "cancel a job"},
    {"job", "logs", Command::kJobLogs, "ID", "print a job's per-update log"},
    {"job", "plot", Command::kJobPlot, "ID",
     "draw a job's loss, lr, loss scale and grad norm as an SVG file"},
    {"worker", "list", Command::kWorkerList, "", "list workers"},
    {"checkpoint", "export", Command::kCheckpointExport, "CKPT_DIR",
     "write a llama checkpoint as a Hugging Face model directory"},
};

const Verb* FindVerb(const std::string& noun, const std::string& verb) {
  for (const Verb& v : kVerbs) {
    if (noun == v.noun && verb == v.verb) return &v;
  }
  return nullptr;
}

bool IsNoun(const std::string& s) { return s == "job" || s == "worker" || s == "checkpoint"; }

// The width of the command column of a usage text: the longest entry and two spaces.
size_t CommandColumn(bool with_noun, size_t at_least) {
  size_t width = at_least;
  for (const Verb& v : kVerbs) {
    const size_t call = (with_noun ? std::strlen(v.noun) + 1 : 0) + std::strlen(v.verb) +
                        (*v.operand ? 1 + std::strlen(v.operand) : 0);
    width = std::max(width, call + 2);
  }
  return width;
}

constexpr char kGlobalFlags[] =
    "Global flags (accepted anywhere on the line):\n"
    "  --coordinator HOST:PORT  coordinator address (default: $TRAINSTEP_COORDINATOR, else "
    "127.0.0.1:7070)\n"
    "  -o, --output FORMAT      table (default) or json; job logs also takes jsonl\n"
    "  --timeout DURATION       deadline of each call, e.g. 500ms, 10s, 2m (default 10s); job\n"
    "                           watch: give up when the job makes no progress for that long\n"
    "  --tls-ca FILE            talk TLS, verifying the coordinator against this PEM CA\n"
    "                           (default: $TRAINSTEP_TLS_CA; none: plaintext)\n"
    "  --tls-cert FILE          client certificate for mTLS (default: $TRAINSTEP_TLS_CERT)\n"
    "  --tls-key FILE           its private key (default: $TRAINSTEP_TLS_KEY)\n"
    "  --token-file FILE        send the bearer token in FILE on every call (default:\n"
    "                           $TRAINSTEP_TOKEN, the token itself); needs TLS\n"
    "  -h, --help               print the usage of the command given and exit\n";

std::string TopUsage() {
  std::string s =
      "trainstep: submit, follow and inspect training jobs on a trainstep coordinator, and\n"
      "export their checkpoints.\n"
      "\n"
      "Usage:\n"
      "  trainstep [global flags] <noun> <verb> [arguments] [flags]\n"
      "\n"
      "Commands:\n";
  for (const Verb& v : kVerbs) {
    std::string call = absl::StrCat(v.noun, " ", v.verb, *v.operand ? " " : "", v.operand);
    call.resize(CommandColumn(/*with_noun=*/true, 24), ' ');
    absl::StrAppend(&s, "  ", call, v.summary, "\n");
  }
  absl::StrAppend(
      &s, "\n", kGlobalFlags,
      "\n"
      "Environment:\n"
      "  TRAINSTEP_COORDINATOR  default for --coordinator\n"
      "  TRAINSTEP_TLS_CA, TRAINSTEP_TLS_CERT, TRAINSTEP_TLS_KEY\n"
      "                         defaults for --tls-ca, --tls-cert, --tls-key\n"
      "  TRAINSTEP_TOKEN        the bearer token, when --token-file is not given\n"
      "  NO_COLOR               when set, never print colours (they are also off when the\n"
      "                         output is not a terminal)\n"
      "\n"
      "Exit codes:\n"
      "  0  success\n"
      "  1  any other error\n"
      "  2  usage or invalid input: bad flags, unreadable SPEC file, a spec or request the\n"
      "     coordinator rejects (INVALID_ARGUMENT; its message names the field)\n"
      "  3  coordinator unavailable: not reachable, or no answer within --timeout\n"
      "  4  not found: no such job\n"
      "  5  the job failed (job watch, job submit --watch)\n"
      "  6  the job was cancelled (job watch, job submit --watch)\n"
      "  7  no progress: job watch --timeout passed without a new state or update\n"
      "  8  denied: no credential or a bad one (UNAUTHENTICATED), or a role that does not\n"
      "     allow the call (PERMISSION_DENIED)\n"
      "\n"
      "Run 'trainstep <noun> <verb> --help' for the flags of a command.\n");
  return s;
}

std::string NounUsage(const std::string& noun) {
  std::string s =
      absl::StrCat("Usage:\n  trainstep ", noun, " <verb> [arguments] [flags]\n\nVerbs:\n");
  bool remote = false;  // the coordinator's flags apply to some verb
  for (const Verb& v : kVerbs) {
    if (noun != v.noun) continue;
    std::string call = absl::StrCat(v.verb, *v.operand ? " " : "", v.operand);
    call.resize(CommandColumn(/*with_noun=*/false, 18), ' ');
    absl::StrAppend(&s, "  ", call, v.summary, "\n");
    remote = remote || NeedsCoordinator(v.command);
  }
  absl::StrAppend(&s, "\n", remote ? kGlobalFlags : "", remote ? "\n" : "", "Run 'trainstep ", noun,
                  " <verb> --help' for the flags of a verb.\n");
  return s;
}

std::string VerbUsage(const Verb& v) {
  std::string s =
      absl::StrCat("trainstep ", v.noun, " ", v.verb, ": ", v.summary, ".\n\nUsage:\n  trainstep ",
                   v.noun, " ", v.verb, *v.operand ? " " : "", v.operand);
  switch (v.command) {
    case Command::kJobSubmit:
      absl::StrAppend(
          &s,
          " [--request-id ID] [--watch]\n\n"
          "The coordinator parses and validates the spec; its errors name the field.\n\n"
          "Flags:\n"
          "  --request-id ID  idempotency key; a repeated submit with the same key returns the\n"
          "                   job the first one created (default: a hash of the spec's bytes\n"
          "                   and the current minute, so an accidental double submit within a\n"
          "                   minute returns the same job)\n"
          "  --watch          after submitting, follow the job as `trainstep job watch` does\n"
          "                   (exit code 5 if it fails, 6 if it is cancelled; with --timeout,\n"
          "                   7 if it makes no progress for that long)\n\n"
          "A request id reused with a different spec is refused (exit code 2). A spec larger\n"
          "than the coordinator's message limit (4 MiB) is refused before it is sent.\n");
      break;
    case Command::kJobWatch:
      absl::StrAppend(
          &s,
          " [--timeout DURATION]\n\n"
          "On a terminal, one live progress line on stderr; otherwise one line per update.\n"
          "Ends when the job ends, with a one-line summary. Exit code 0 if the job succeeded,\n"
          "5 if it failed, 6 if it was cancelled.\n\n"
          "Flags:\n"
          "  --timeout DURATION  give up (exit code 7) when the job shows no progress, neither\n"
          "                      a new state nor a new update, for this long (default: wait as\n"
          "                      long as the job runs; a PENDING job may wait for workers)\n");
      break;
    case Command::kJobLogs:
      absl::StrAppend(&s,
                      " [-o table|json|jsonl]\n\n"
                      "Every update record, oldest first. -o jsonl prints one JSON object per\n"
                      "line, with the .proto field names.\n");
      break;
    case Command::kJobPlot:
      absl::StrAppend(
          &s,
          " --out FILE.svg\n\n"
          "Draws the job's per-update log as one SVG picture, no other program needed: loss,\n"
          "learning rate, loss scale (log2 axis) and gradient norm before and after clipping,\n"
          "in stacked panels against optimizer_update_id. Skipped windows are marked in orange\n"
          "and aborted ones in red, across every panel. On a running job, what is logged so far.\n"
          "\n"
          "Flags:\n"
          "  --out FILE.svg  where to write the picture (- for stdout); written whole or not at\n"
          "                  all\n");
      break;
    case Command::kWorkerList:
      absl::StrAppend(&s,
                      " [--job ID]\n\n"
                      "Flags:\n"
                      "  --job ID  only the workers of this job\n");
      break;
    case Command::kCheckpointExport:
      // Works on local files only: the coordinator's flags mean nothing here.
      absl::StrAppend(
          &s,
          " --out DIR [--dtype DTYPE] [--max-shard-size SIZE]\n\n"
          "CKPT_DIR is a llama job's checkpoint (ckpt-<id>/: config.json and model.safetensors\n"
          "with the fp32 master weights). DIR receives what transformers' from_pretrained loads:\n"
          "config.json, its torch_dtype set to DTYPE, and model.safetensors, or, when the tensors\n"
          "exceed SIZE, model-00001-of-0000N.safetensors ... and model.safetensors.index.json.\n"
          "Tokenizer files are not part of a checkpoint: copy them from the base model. No\n"
          "coordinator is contacted.\n\n"
          "Flags:\n"
          "  --out DIR              the directory to create: it must not exist, or be empty. It\n"
          "                         is written as DIR.tmp-<pid> and renamed when complete, so\n"
          "                         DIR appears whole or not at all\n"
          "  --dtype DTYPE          float32, bfloat16 or float16 (default: the dtype the job's\n"
          "                         model was loaded in, its config's trainstep_source_dtype;\n"
          "                         float32 if it has none). fp32 weights are rounded to\n"
          "                         nearest, ties to even; tensors in another dtype are copied\n"
          "                         as they are\n"
          "  --max-shard-size SIZE  the most tensor bytes in one file, e.g. 5GB, 500MB, 2GiB\n"
          "                         (KB, MB, GB are 1000-based as in transformers; default\n"
          "                         5GB); a larger tensor gets a file of its own\n"
          "  -h, --help             print this usage and exit\n\n"
          "Prints one line per file written and a summary on stdout. Exit code 1, with nothing\n"
          "left behind, if the checkpoint cannot be read or DIR cannot be written.\n");
      return s;
    default:
      absl::StrAppend(&s, "\n");
      break;
  }
  absl::StrAppend(&s, "\n", kGlobalFlags);
  return s;
}

// Everything on the line, sorted into flags and positionals; the first problem is kept.
struct RawArgs {
  std::vector<std::string> positionals;
  std::optional<std::string> coordinator, output, timeout, request_id, job, out;
  std::optional<std::string> dtype, max_shard_size;
  std::optional<std::string> tls_ca, tls_cert, tls_key, token_file;
  bool watch = false;
  bool help = false;
  std::string error;
};

RawArgs Scan(const std::vector<std::string>& args) {
  RawArgs raw;
  auto fail = [&raw](std::string message) {
    if (raw.error.empty()) raw.error = std::move(message);
  };
  bool only_positionals = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (only_positionals || a.size() < 2 || a[0] != '-') {
      raw.positionals.push_back(a);  // "-" (stdin) is an operand too
      continue;
    }
    if (a == "--") {
      only_positionals = true;
      continue;
    }
    std::string name = a;
    std::optional<std::string> value;
    if (absl::StartsWith(a, "--")) {
      const size_t eq = a.find('=');
      if (eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
      }
    } else if (absl::StartsWith(a, "-o")) {  // -ojson, -o=json
      name = "-o";
      if (a.size() > 2) value = a.substr(a[2] == '=' ? 3 : 2);
    }
    if (name == "-h" || name == "--help") {
      raw.help = true;
      continue;
    }
    if (name == "--watch") {
      if (value.has_value()) fail("--watch takes no value");
      raw.watch = true;
      continue;
    }
    std::optional<std::string>* slot = nullptr;
    if (name == "--coordinator") slot = &raw.coordinator;
    if (name == "-o" || name == "--output") slot = &raw.output;
    if (name == "--timeout") slot = &raw.timeout;
    if (name == "--request-id") slot = &raw.request_id;
    if (name == "--job") slot = &raw.job;
    if (name == "--out") slot = &raw.out;
    if (name == "--dtype") slot = &raw.dtype;
    if (name == "--max-shard-size") slot = &raw.max_shard_size;
    if (name == "--tls-ca") slot = &raw.tls_ca;
    if (name == "--tls-cert") slot = &raw.tls_cert;
    if (name == "--tls-key") slot = &raw.tls_key;
    if (name == "--token-file") slot = &raw.token_file;
    if (slot == nullptr) {
      fail(absl::StrCat("unknown flag ", name));
      continue;
    }
    if (!value.has_value()) {
      if (i + 1 >= args.size()) {
        fail(absl::StrCat("flag ", name, " needs a value"));
        continue;
      }
      value = args[++i];
    }
    *slot = std::move(*value);
  }
  return raw;
}

ParsedArgs UsageError(const std::string& problem, const std::string& level) {
  ParsedArgs p;
  p.kind = ParsedArgs::Kind::kUsageError;
  p.text = absl::StrCat(problem, "\nRun 'trainstep", level.empty() ? "" : " ", level,
                        " --help' for usage.");
  return p;
}

}  // namespace

std::string CommandName(Command command) {
  for (const Verb& v : kVerbs) {
    if (v.command == command) return absl::StrCat(v.noun, " ", v.verb);
  }
  return "";
}

bool NeedsCoordinator(Command command) { return command != Command::kCheckpointExport; }

std::string UsageText(const std::string& level) {
  if (level.empty()) return TopUsage();
  if (IsNoun(level)) return NounUsage(level);
  const size_t space = level.find(' ');
  if (space != std::string::npos) {
    const Verb* v = FindVerb(level.substr(0, space), level.substr(space + 1));
    if (v != nullptr) return VerbUsage(*v);
  }
  return TopUsage();
}

namespace {

// Each step below fills its part of `inv` and returns the first problem, or "" when none.

// The command's operand (SPEC.json or a job ID), after the noun and the verb.
std::string TakeOperand(const Verb& verb, const std::vector<std::string>& pos, Invocation* inv) {
  const std::string name = CommandName(verb.command);
  const size_t want = *verb.operand ? 1 : 0;
  if (pos.size() - 2 < want) {
    switch (verb.command) {
      case Command::kJobSubmit:
        return absl::StrCat(name, " needs SPEC.json (a file, or - for stdin)");
      case Command::kCheckpointExport:
        return absl::StrCat(name, " needs CKPT_DIR (a checkpoint directory, ckpt-<id>)");
      default:
        return absl::StrCat(name, " needs a job ID");
    }
  }
  if (pos.size() - 2 > want) {
    return absl::StrCat("unexpected argument \"", pos[2 + want], "\" for ", name);
  }
  if (want == 0) return "";
  if (pos[2].empty()) return absl::StrCat(name, ": ", verb.operand, " is empty");
  switch (verb.command) {
    case Command::kJobSubmit:
      inv->spec_path = pos[2];
      break;
    case Command::kCheckpointExport:
      inv->export_options.checkpoint_dir = pos[2];
      break;
    default:
      inv->job_id = pos[2];
      break;
  }
  return "";
}

// Flags that belong to one command only: refused on the others.
std::string TakeCommandFlags(const RawArgs& raw, Invocation* inv) {
  const std::string name = CommandName(inv->command);
  const auto not_a_flag = [&name](absl::string_view flag) {
    return absl::StrCat(flag, " is not a flag of '", name, "'");
  };
  if (inv->command != Command::kJobSubmit) {
    if (raw.request_id.has_value()) return not_a_flag("--request-id");
    if (raw.watch) return not_a_flag("--watch");
  }
  if (inv->command != Command::kWorkerList && raw.job.has_value()) return not_a_flag("--job");
  const bool exporting = inv->command == Command::kCheckpointExport;
  if (inv->command != Command::kJobPlot && !exporting && raw.out.has_value()) {
    return not_a_flag("--out");
  }
  if (!exporting) {
    if (raw.dtype.has_value()) return not_a_flag("--dtype");
    if (raw.max_shard_size.has_value()) return not_a_flag("--max-shard-size");
  }
  if (inv->command == Command::kJobPlot) {
    if (!raw.out.has_value() || raw.out->empty()) {
      return "job plot needs --out FILE.svg (- for stdout)";
    }
    inv->out_path = *raw.out;
  }
  if (exporting) {
    if (!raw.out.has_value() || raw.out->empty()) {
      return "checkpoint export needs --out DIR (a directory to create)";
    }
    inv->export_options.out_dir = *raw.out;
    if (raw.dtype.has_value()) {
      if (!IsExportDtype(*raw.dtype)) {
        return absl::StrCat("--dtype must be float32, bfloat16 or float16, got \"", *raw.dtype,
                            "\"");
      }
      inv->export_options.dtype = *raw.dtype;
    }
    if (raw.max_shard_size.has_value()) {
      absl::StatusOr<uint64_t> bytes = ParseByteSize(*raw.max_shard_size);
      if (!bytes.ok()) return absl::StrCat("--max-shard-size ", bytes.status().message());
      inv->export_options.max_shard_bytes = *bytes;
    }
  }
  if (raw.request_id.has_value()) {
    if (raw.request_id->empty()) return "--request-id must not be empty";
    inv->request_id = *raw.request_id;
  }
  inv->watch = raw.watch;
  if (raw.job.has_value()) {
    if (raw.job->empty()) return "--job must not be empty";
    inv->job_id = *raw.job;
  }
  return "";
}

// Flags every command takes: output format, timeout, coordinator address.
std::string TakeGlobalFlags(const RawArgs& raw, const std::string& env_coordinator,
                            Invocation* inv) {
  if (raw.output.has_value()) {
    const std::string& o = *raw.output;
    const bool logs = inv->command == Command::kJobLogs;
    if (o == "table") {
      inv->output = Output::kTable;
    } else if (o == "json") {
      inv->output = Output::kJson;
    } else if (o == "jsonl" && logs) {
      inv->output = Output::kJsonl;
    } else if (o == "jsonl") {
      return "-o jsonl is only for 'job logs'; use -o json";
    } else {
      return absl::StrCat("-o must be ", logs ? "table, json or jsonl" : "table or json",
                          ", got \"", o, "\"");
    }
  }
  if (raw.timeout.has_value()) {
    absl::Duration d;
    if (!absl::ParseDuration(*raw.timeout, &d) || d <= absl::ZeroDuration() ||
        d == absl::InfiniteDuration()) {
      return absl::StrCat("--timeout must be a positive duration like 500ms, 10s or 2m, got \"",
                          *raw.timeout, "\"");
    }
    inv->timeout = d;
    inv->timeout_given = true;
  }
  const std::pair<const std::optional<std::string>*, std::string*> files[] = {
      {&raw.tls_ca, &inv->security.tls_ca},
      {&raw.tls_cert, &inv->security.tls_cert},
      {&raw.tls_key, &inv->security.tls_key},
      {&raw.token_file, &inv->security.token_file},
  };
  for (const auto& [given, into] : files) {
    if (!given->has_value()) continue;
    if ((*given)->empty()) return "--tls-ca, --tls-cert, --tls-key and --token-file need a file";
    *into = **given;
  }
  if (raw.coordinator.has_value()) {
    if (raw.coordinator->empty()) return "--coordinator must not be empty";
    inv->coordinator = *raw.coordinator;
  } else if (!env_coordinator.empty()) {
    inv->coordinator = env_coordinator;
  } else {
    inv->coordinator = kDefaultCoordinator;
  }
  return "";
}

}  // namespace

ParsedArgs ParseArgs(const std::vector<std::string>& args, const std::string& env_coordinator) {
  const RawArgs raw = Scan(args);
  const std::vector<std::string>& pos = raw.positionals;

  // The deepest level the words name: help prints it, errors point at it.
  std::string level;
  const Verb* verb = nullptr;
  if (!pos.empty() && IsNoun(pos[0])) {
    level = pos[0];
    if (pos.size() >= 2) verb = FindVerb(pos[0], pos[1]);
    if (verb != nullptr) level = CommandName(verb->command);
  }
  if (raw.help) {
    ParsedArgs p;
    p.kind = ParsedArgs::Kind::kHelp;
    p.text = UsageText(level);
    return p;
  }
  if (!raw.error.empty()) return UsageError(raw.error, level);
  if (pos.empty()) return UsageError("missing command (job, worker or checkpoint)", "");
  if (!IsNoun(pos[0])) {
    return UsageError(
        absl::StrCat("unknown command \"", pos[0], "\" (commands: job, worker, checkpoint)"), "");
  }
  if (pos.size() < 2) return UsageError(absl::StrCat("missing verb after \"", pos[0], "\""), level);
  if (verb == nullptr) {
    return UsageError(absl::StrCat("unknown verb \"", pos[1], "\" for ", pos[0]), level);
  }

  Invocation inv;
  inv.command = verb->command;
  std::string problem = TakeOperand(*verb, pos, &inv);
  if (problem.empty()) problem = TakeCommandFlags(raw, &inv);
  if (problem.empty()) problem = TakeGlobalFlags(raw, env_coordinator, &inv);
  if (!problem.empty()) return UsageError(problem, level);
  ParsedArgs p;
  p.kind = ParsedArgs::Kind::kRun;
  p.invocation = std::move(inv);
  return p;
}

}  // namespace trainstep::client
