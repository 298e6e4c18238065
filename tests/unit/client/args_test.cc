// The command line as users type it: noun–verb commands, global flags anywhere, --help at
// every level, and bad usage answered with exit code 2 and the problem named.
#include "client/args.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "client/cli.h"

namespace trainstep::client {
namespace {

using Kind = ParsedArgs::Kind;

ParsedArgs Parse(const std::vector<std::string>& args, const std::string& env = "") {
  return ParseArgs(args, env);
}

Invocation MustRun(const std::vector<std::string>& args, const std::string& env = "") {
  ParsedArgs p = Parse(args, env);
  EXPECT_EQ(p.kind, Kind::kRun) << p.text;
  return p.invocation;
}

// Catches: a verb wired to the wrong command, or its operand dropped.
TEST(ArgsTest, EveryCommandParses) {
  Invocation i = MustRun({"job", "submit", "spec.json"});
  EXPECT_EQ(i.command, Command::kJobSubmit);
  EXPECT_EQ(i.spec_path, "spec.json");
  EXPECT_FALSE(i.watch);
  EXPECT_EQ(i.request_id, "");

  i = MustRun({"job", "submit", "-", "--request-id", "r1", "--watch"});
  EXPECT_EQ(i.spec_path, "-");  // stdin
  EXPECT_EQ(i.request_id, "r1");
  EXPECT_TRUE(i.watch);

  const std::vector<std::pair<std::string, Command>> with_id = {{"get", Command::kJobGet},
                                                                {"watch", Command::kJobWatch},
                                                                {"cancel", Command::kJobCancel},
                                                                {"logs", Command::kJobLogs}};
  for (const auto& [verb, command] : with_id) {
    i = MustRun({"job", verb, "job-7"});
    EXPECT_EQ(i.command, command) << verb;
    EXPECT_EQ(i.job_id, "job-7") << verb;
  }
  EXPECT_EQ(MustRun({"job", "list"}).command, Command::kJobList);
  i = MustRun({"worker", "list"});
  EXPECT_EQ(i.command, Command::kWorkerList);
  EXPECT_EQ(i.job_id, "");
  i = MustRun({"worker", "list", "--job", "job-2"});
  EXPECT_EQ(i.job_id, "job-2");
  EXPECT_EQ(MustRun({"worker", "list", "--job=job-3"}).job_id, "job-3");
}

// Catches the export's operand or flags dropped or swapped, sizes read in the wrong unit, and
// a default that is not "the source dtype, 5GB".
TEST(ArgsTest, CheckpointExportParses) {
  Invocation i = MustRun({"checkpoint", "export", "/ck/ckpt-3", "--out", "/hf/model"});
  EXPECT_EQ(i.command, Command::kCheckpointExport);
  EXPECT_EQ(i.export_options.checkpoint_dir, "/ck/ckpt-3");
  EXPECT_EQ(i.export_options.out_dir, "/hf/model");
  EXPECT_EQ(i.export_options.dtype, "");  // the checkpoint's source dtype
  EXPECT_EQ(i.export_options.max_shard_bytes, 5'000'000'000u);
  EXPECT_FALSE(NeedsCoordinator(i.command));
  EXPECT_TRUE(NeedsCoordinator(Command::kJobList));

  i = MustRun(
      {"checkpoint", "--dtype=bfloat16", "export", "--max-shard-size", "2GiB", "c", "--out=o"});
  EXPECT_EQ(i.export_options.checkpoint_dir, "c");
  EXPECT_EQ(i.export_options.out_dir, "o");
  EXPECT_EQ(i.export_options.dtype, "bfloat16");
  EXPECT_EQ(i.export_options.max_shard_bytes, uint64_t{2} << 30);
  for (const char* dtype : {"float32", "float16"}) {
    EXPECT_EQ(
        MustRun({"checkpoint", "export", "c", "--out", "o", "--dtype", dtype}).export_options.dtype,
        dtype);
  }
  EXPECT_EQ(MustRun({"checkpoint", "export", "c", "--out", "o", "--max-shard-size", "500MB"})
                .export_options.max_shard_bytes,
            500'000'000u);
}

// Catches: global flags accepted only before the command words, or only in one spelling.
TEST(ArgsTest, GlobalFlagsAnywhere) {
  const std::vector<std::vector<std::string>> lines = {
      {"--coordinator", "h:1", "-o", "json", "--timeout", "2m", "job", "get", "j"},
      {"job", "--coordinator", "h:1", "get", "-o", "json", "j", "--timeout", "2m"},
      {"job", "get", "j", "--coordinator=h:1", "--output=json", "--timeout=2m"},
      {"job", "get", "-ojson", "j", "--coordinator", "h:1", "--timeout", "2m"},
      {"-o=json", "job", "get", "--timeout=2m", "j", "--coordinator=h:1"},
  };
  for (const auto& line : lines) {
    const Invocation i = MustRun(line);
    EXPECT_EQ(i.command, Command::kJobGet);
    EXPECT_EQ(i.job_id, "j");
    EXPECT_EQ(i.coordinator, "h:1");
    EXPECT_EQ(i.output, Output::kJson);
    EXPECT_EQ(i.timeout, absl::Minutes(2));
  }
}

// Catches: the env var ignored, or winning over an explicit flag.
TEST(ArgsTest, CoordinatorFlagThenEnvThenDefault) {
  EXPECT_EQ(MustRun({"job", "list"}).coordinator, "127.0.0.1:7070");
  EXPECT_EQ(MustRun({"job", "list"}, "env:5").coordinator, "env:5");
  EXPECT_EQ(MustRun({"job", "list", "--coordinator", "flag:6"}, "env:5").coordinator, "flag:6");
}

// Catches: durations read as plain numbers, or a zero / negative deadline let through.
TEST(ArgsTest, Timeouts) {
  EXPECT_EQ(MustRun({"job", "list"}).timeout, absl::Seconds(10));
  EXPECT_EQ(MustRun({"job", "list", "--timeout", "500ms"}).timeout, absl::Milliseconds(500));
  EXPECT_EQ(MustRun({"job", "list", "--timeout", "10s"}).timeout, absl::Seconds(10));
  EXPECT_EQ(MustRun({"job", "list", "--timeout", "2m"}).timeout, absl::Minutes(2));
  // job watch waits without a limit unless --timeout is on the line (the default is not one).
  EXPECT_FALSE(MustRun({"job", "watch", "j"}).timeout_given);
  EXPECT_TRUE(MustRun({"job", "watch", "j", "--timeout", "10s"}).timeout_given);
  for (const char* bad : {"abc", "10", "0s", "-1s", "inf"}) {
    const ParsedArgs p = Parse({"job", "list", "--timeout", bad});
    EXPECT_EQ(p.kind, Kind::kUsageError) << bad;
    EXPECT_NE(p.text.find("--timeout"), std::string::npos) << p.text;
  }
}

// Catches: jsonl accepted where it means nothing, or logs not accepting it.
TEST(ArgsTest, OutputFormats) {
  EXPECT_EQ(MustRun({"job", "list"}).output, Output::kTable);
  EXPECT_EQ(MustRun({"job", "logs", "j"}).output, Output::kTable);
  EXPECT_EQ(MustRun({"job", "logs", "j", "-o", "jsonl"}).output, Output::kJsonl);
  EXPECT_EQ(MustRun({"job", "logs", "j", "-o", "json"}).output, Output::kJson);
  ParsedArgs p = Parse({"job", "list", "-o", "jsonl"});
  EXPECT_EQ(p.kind, Kind::kUsageError);
  EXPECT_NE(p.text.find("jsonl"), std::string::npos);
  p = Parse({"job", "list", "-o", "yaml"});
  EXPECT_EQ(p.kind, Kind::kUsageError);
  EXPECT_NE(p.text.find("\"yaml\""), std::string::npos) << p.text;
}

// Catches: bad usage that runs anyway, or an error that does not say what is wrong.
TEST(ArgsTest, BadUsageNamesTheProblem) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "missing command"},
      {{"jobs", "list"}, "unknown command \"jobs\""},
      {{"job"}, "missing verb"},
      {{"job", "lst"}, "unknown verb \"lst\""},
      {{"worker", "get"}, "unknown verb \"get\""},
      {{"job", "submit"}, "needs SPEC.json"},
      {{"job", "get"}, "needs a job ID"},
      {{"job", "cancel"}, "needs a job ID"},
      {{"job", "get", "a", "b"}, "unexpected argument \"b\""},
      {{"job", "list", "extra"}, "unexpected argument \"extra\""},
      {{"job", "list", "--verbose"}, "unknown flag --verbose"},
      {{"job", "list", "-x"}, "unknown flag -x"},
      {{"job", "list", "--coordinator"}, "--coordinator needs a value"},
      {{"job", "get", "j", "--watch"}, "--watch is not a flag of 'job get'"},
      {{"job", "get", "j", "--request-id", "r"}, "--request-id is not a flag of 'job get'"},
      {{"job", "list", "--job", "j"}, "--job is not a flag of 'job list'"},
      {{"job", "submit", "s.json", "--watch=yes"}, "--watch takes no value"},
      {{"job", "get", "j", "--coordinator="}, "--coordinator must not be empty"},
      {{"checkpoint"}, "missing verb"},
      {{"checkpoint", "import", "c"}, "unknown verb \"import\""},
      {{"checkpoint", "export"}, "needs CKPT_DIR"},
      {{"checkpoint", "export", "c"}, "checkpoint export needs --out DIR"},
      {{"checkpoint", "export", "c", "--out="}, "checkpoint export needs --out DIR"},
      {{"checkpoint", "export", "c", "d", "--out", "o"}, "unexpected argument \"d\""},
      {{"checkpoint", "export", "c", "--out", "o", "--dtype", "bf16"},
       "--dtype must be float32, bfloat16 or float16, got \"bf16\""},
      {{"checkpoint", "export", "c", "--out", "o", "--max-shard-size", "0"}, "--max-shard-size"},
      {{"checkpoint", "export", "c", "--out", "o", "--max-shard-size", "-5GB"},
       "--max-shard-size must be positive"},
      {{"checkpoint", "export", "c", "--out", "o", "--max-shard-size", "lots"}, "\"lots\""},
      {{"checkpoint", "export", "c", "--out", "o", "--max-shard-size", "99999999999GiB"},
       "--max-shard-size too large"},
      {{"checkpoint", "export", "c", "--out", "o", "--max-shard-size"},
       "--max-shard-size needs a value"},
      {{"checkpoint", "export", "c", "--out", "o", "--watch"},
       "--watch is not a flag of 'checkpoint export'"},
      {{"job", "list", "--dtype", "float16"}, "--dtype is not a flag of 'job list'"},
      {{"job", "get", "j", "--max-shard-size", "1GB"},
       "--max-shard-size is not a flag of 'job get'"},
      {{"worker", "list", "--out", "x"}, "--out is not a flag of 'worker list'"},
  };
  for (const auto& [args, want] : cases) {
    const ParsedArgs p = Parse(args);
    EXPECT_EQ(p.kind, Kind::kUsageError) << want;
    EXPECT_NE(p.text.find(want), std::string::npos) << "want \"" << want << "\" in: " << p.text;
    EXPECT_NE(p.text.find("--help"), std::string::npos) << p.text;  // says where the usage is
  }
}

// Catches: an operand that starts with a dash being taken for a flag after "--".
TEST(ArgsTest, DoubleDashEndsFlags) {
  EXPECT_EQ(MustRun({"job", "get", "--", "-odd-id"}).job_id, "-odd-id");
}

// Catches: --help that needs a valid line, prints the wrong level, or loses to an error.
TEST(ArgsTest, HelpAtEveryLevel) {
  ParsedArgs p = Parse({"--help"});
  ASSERT_EQ(p.kind, Kind::kHelp);
  EXPECT_NE(p.text.find("Exit codes"), std::string::npos);
  EXPECT_NE(p.text.find("job submit SPEC.json"), std::string::npos);
  EXPECT_NE(p.text.find("TRAINSTEP_COORDINATOR"), std::string::npos);
  for (const char* code : {"0  success", "1  any other", "2  usage", "3  coordinator unavailable",
                           "4  not found", "5  the job failed", "6  the job was cancelled"}) {
    EXPECT_NE(p.text.find(code), std::string::npos) << code;
  }

  p = Parse({"job", "-h"});
  ASSERT_EQ(p.kind, Kind::kHelp);
  EXPECT_NE(p.text.find("trainstep job <verb>"), std::string::npos) << p.text;
  EXPECT_NE(p.text.find("watch ID"), std::string::npos);
  EXPECT_EQ(p.text.find("Exit codes"), std::string::npos);

  p = Parse({"worker", "--help"});
  ASSERT_EQ(p.kind, Kind::kHelp);
  EXPECT_NE(p.text.find("trainstep worker <verb>"), std::string::npos);

  p = Parse({"job", "submit", "--help"});
  ASSERT_EQ(p.kind, Kind::kHelp);
  EXPECT_NE(p.text.find("--request-id"), std::string::npos);
  EXPECT_NE(p.text.find("--watch"), std::string::npos);

  p = Parse({"--help", "worker", "list"});
  ASSERT_EQ(p.kind, Kind::kHelp);
  EXPECT_NE(p.text.find("--job ID"), std::string::npos);

  p = Parse({"job", "logs", "-h"});
  ASSERT_EQ(p.kind, Kind::kHelp);
  EXPECT_NE(p.text.find("jsonl"), std::string::npos);

  // Help wins over whatever else is wrong on the line.
  p = Parse({"job", "get", "--bogus", "--help"});
  ASSERT_EQ(p.kind, Kind::kHelp);
  EXPECT_NE(p.text.find("trainstep job get"), std::string::npos);
  EXPECT_EQ(Parse({"nope", "-h"}).kind, Kind::kHelp);

  p = Parse({"--help"});
  EXPECT_NE(p.text.find("checkpoint export CKPT_DIR"), std::string::npos) << p.text;
  p = Parse({"checkpoint", "--help"});
  ASSERT_EQ(p.kind, Kind::kHelp);
  EXPECT_NE(p.text.find("trainstep checkpoint <verb>"), std::string::npos) << p.text;
  EXPECT_NE(p.text.find("export CKPT_DIR"), std::string::npos) << p.text;
  EXPECT_EQ(p.text.find("--coordinator"), std::string::npos) << p.text;
  p = Parse({"checkpoint", "export", "--help"});
  ASSERT_EQ(p.kind, Kind::kHelp);
  for (const char* want :
       {"trainstep checkpoint export CKPT_DIR --out DIR", "--dtype DTYPE", "--max-shard-size SIZE",
        "default", "5GB", "trainstep_source_dtype", "model.safetensors.index.json",
        "model-00001-of-0000N.safetensors", "DIR.tmp-<pid>"}) {
    EXPECT_NE(p.text.find(want), std::string::npos) << want << " in:\n" << p.text;
  }
  // It never contacts the coordinator: the coordinator's flags are not offered.
  EXPECT_EQ(p.text.find("--coordinator"), std::string::npos) << p.text;
}

struct CliResult {
  int rc;
  std::string out, err;
};

CliResult Cli(const std::vector<std::string>& args) {
  std::istringstream in;
  std::ostringstream out, err;
  ProcessEnvironment env;
  env.coordinator = "127.0.0.1:1";  // never contacted: help and usage errors need no coordinator
  const int rc = RunCli(args, env, in, out, err);
  return {rc, out.str(), err.str()};
}

// Catches: the TLS and token flags refused on some commands, swapped, or an empty one taken
// for "not given" (which would fall back to the environment silently).
TEST(ArgsTest, TlsAndTokenFlagsAreGlobal) {
  Invocation i = MustRun({"--tls-ca", "ca.crt", "job", "list", "--tls-cert=c.crt", "--tls-key",
                          "c.key", "--token-file", "tok"});
  EXPECT_EQ(i.security.tls_ca, "ca.crt");
  EXPECT_EQ(i.security.tls_cert, "c.crt");
  EXPECT_EQ(i.security.tls_key, "c.key");
  EXPECT_EQ(i.security.token_file, "tok");
  EXPECT_EQ(MustRun({"job", "list"}).security.tls_ca, "");
  ParsedArgs p = Parse({"job", "list", "--tls-ca="});
  EXPECT_EQ(p.kind, Kind::kUsageError);
  EXPECT_NE(p.text.find("need a file"), std::string::npos) << p.text;
  EXPECT_NE(UsageText("").find("TRAINSTEP_TOKEN"), std::string::npos);
  EXPECT_NE(UsageText("").find("8  denied"), std::string::npos);
}

// Catches: help printed on stderr or with a non-zero code; usage errors on stdout.
TEST(CliTest, HelpOnStdoutUsageErrorsOnStderr) {
  CliResult r = Cli({"job", "watch", "--help"});
  EXPECT_EQ(r.rc, kExitOk);
  EXPECT_NE(r.out.find("trainstep job watch"), std::string::npos);
  EXPECT_EQ(r.err, "");

  r = Cli({"job", "frobnicate"});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("error: unknown verb \"frobnicate\""), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("\033["), std::string::npos);  // not a terminal: no colour
}

// Catches: a token that would go out in plaintext (no CA), or a TLS file that cannot be
// read, found only at the first call instead of refused as usage (exit 2) before connecting.
TEST(CliTest, SecurityFromFlagsAndEnvironmentIsCheckedBeforeConnecting) {
  ProcessEnvironment env;
  env.security_env = [](const char* name) {
    return std::string(name) == "TRAINSTEP_TOKEN" ? "secret-token" : "";
  };
  std::istringstream in;
  std::ostringstream out, err;
  EXPECT_EQ(RunCli({"job", "list"}, env, in, out, err), kExitUsage);
  EXPECT_NE(err.str().find("TRAINSTEP_TOKEN needs TLS"), std::string::npos) << err.str();
  std::ostringstream out2, err2;
  EXPECT_EQ(RunCli({"job", "list", "--tls-ca", "/nonexistent/ca.crt"}, ProcessEnvironment(), in,
                   out2, err2),
            kExitUsage);
  EXPECT_NE(err2.str().find("--tls-ca /nonexistent/ca.crt: cannot read it"), std::string::npos)
      << err2.str();
}

}  // namespace
}  // namespace trainstep::client
