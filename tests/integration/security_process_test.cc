// TLS, mTLS, roles and the health port through real processes: the coordinator binary, the
// `trainstep` CLI binary, worker binaries, with certificates from scripts/dev-certs.sh.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/tls.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/grpc_health_util.h"
#include "tests/integration/process_cluster.h"
#include "tests/observability/observability_util.h"
#include "worker/link/worker_client.h"

namespace trainstep {
namespace {

using testing::BinDir;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ProcessCluster;
using testing::ReadFile;
using testing::RunToExit;
using testing::TempDir;
using testing_util::HealthCheck;
using testing_util::kHealthCheckMethod;
using testing_util::kServing;
using testing_util::RawCall;

constexpr char kAdminToken[] = "tok-admin-0123456789";
constexpr char kAliceToken[] = "tok-alice-0123456789";
constexpr char kBobToken[] = "tok-bob-000123456789";
constexpr char kViewerToken[] = "tok-vic-000123456789";

constexpr char kSpec[] =
    R"({"model":{"mlp":{}},"data":{"synthetic_regression":{"samples":64}},)"
    R"("batch":{"micro_batch_size":8},"stop":{"max_updates":4},"workers":{"count":2}})";

void Nap(absl::Duration d) {
  std::this_thread::sleep_for(std::chrono::microseconds(absl::ToInt64Microseconds(d)));
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  std::filesystem::rename(path + ".tmp", path);  // as a Secret volume swaps its files
}

constexpr char kReflection[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
constexpr char kListServices[] = "\x3a\x00";  // ServerReflectionRequest{list_services: ""}

// A channel of its own (no subchannel shared with earlier channels): a new handshake.
std::shared_ptr<grpc::Channel> FreshChannel(const std::string& address,
                                            const ChannelSecurity& security) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, ChannelCredentials(security), args);
}

class SecurityProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    certs_ = dir_ + "/certs";
    ASSERT_EQ(DevCerts(certs_), 0) << ReadFile(dir_ + "/dev-certs.log");
    ASSERT_EQ(DevCerts(dir_ + "/other"), 0) << ReadFile(dir_ + "/dev-certs.log");  // another CA
    tokens_ = dir_ + "/tokens.txt";
    WriteFile(tokens_, absl::StrCat(kAdminToken, " root admin\n", kAliceToken, " alice submitter\n",
                                    kBobToken, " bob submitter\n", kViewerToken, " vic viewer\n"));
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  int DevCerts(const std::string& out) {
    absl::StatusOr<int> rc = RunToExit(
        {"/bin/bash", std::string(TRAINSTEP_TEST_SOURCE_DIR) + "/scripts/dev-certs.sh", out},
        dir_ + "/dev-certs.log", absl::Seconds(60));
    return rc.ok() ? *rc : -1;
  }

  ChannelSecurity Client(const std::string& who) const {
    ChannelSecurity s;
    s.files.ca = certs_ + "/ca.crt";
    if (!who.empty()) {
      s.files.cert = certs_ + "/" + who + ".crt";
      s.files.key = certs_ + "/" + who + ".key";
    }
    return s;
  }

  // mTLS (client certificates optional beside tokens), both auth files, a health port.
  std::vector<std::string> SecuredFlags() const {
    return {"--listen=0.0.0.0:0",
            "--tls-cert=" + certs_ + "/coordinator.crt",
            "--tls-key=" + certs_ + "/coordinator.key",
            "--tls-client-ca=" + certs_ + "/ca.crt",
            "--auth-certs=" + certs_ + "/auth-certs.txt",
            "--auth-tokens=" + tokens_,
            "--health-listen=127.0.0.1:0",
            "--tls-reload-interval=1s"};
  }

  std::unique_ptr<ProcessCluster> StartSecured() {
    absl::StatusOr<std::unique_ptr<ProcessCluster>> c = ProcessCluster::Start(
        dir_ + "/cluster", absl::Seconds(10), SecuredFlags(), false, Client("client"));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  struct Run {
    int code = -1;
    std::string output;  // stdout and stderr
  };
  // The CLI binary with `env` (VAR=value...) added to its environment.
  Run Cli(const std::string& address, const std::vector<std::string>& args,
          const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {"/usr/bin/env", "-u", "TRAINSTEP_TOKEN", "-u",
                                     "TRAINSTEP_TLS_CA"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.push_back(BinDir() + "/trainstep");
    argv.push_back("--coordinator=" + address);
    argv.push_back("--timeout=5s");
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = absl::StrCat(dir_, "/cli-", ++cli_runs_, ".log");
    absl::StatusOr<int> rc = RunToExit(argv, log, absl::Seconds(60));
    return {rc.ok() ? *rc : -1, ReadFile(log)};
  }
  // The CLI as the holder of `token`.
  Run As(const std::string& address, const char* token, const std::vector<std::string>& args) {
    return Cli(address, args,
               {absl::StrCat("TRAINSTEP_TLS_CA=", certs_, "/ca.crt"),
                absl::StrCat("TRAINSTEP_TOKEN=", token)});
  }
  // The job id `job submit` prints first (its progress lines follow on stderr).
  static std::string JobIdOf(const Run& submit) {
    return std::string(
        absl::StripAsciiWhitespace(submit.output.substr(0, submit.output.find('\n'))));
  }
  std::string SpecFile(const std::string& spec = kSpec, const std::string& name = "spec.json") {
    const std::string path = dir_ + "/" + name;
    WriteFile(path, spec);
    return path;
  }
  // A worker's mTLS flags (DNS:trainstep-worker), then `roots` (e.g. "--allowed-roots=DIR").
  std::vector<std::string> WorkerTls(const std::string& roots) const {
    std::vector<std::string> flags = {"--tls-ca=" + certs_ + "/ca.crt",
                                      "--tls-cert=" + certs_ + "/worker.crt",
                                      "--tls-key=" + certs_ + "/worker.key"};
    if (!roots.empty()) flags.push_back(roots);
    return flags;
  }
  // A one-worker byte-level job over `data` (text paths), checkpoints in `ckpt` if given.
  static std::string TextJob(const std::string& data, const std::string& ckpt = "",
                             const std::string& eval = "") {
    return absl::StrCat(
        R"({"model":{"tiny_gpt":{"n_layer":1,"d_model":16,"n_head":1,"seq_len":16}},)",
        R"("data":{"text":{"paths":[")", data, R"("],"seq_len":16}},)",
        eval.empty() ? ""
                     : absl::StrCat(R"("eval":{"every_updates":1,"data":{"text":{"paths":[")", eval,
                                    R"("],"seq_len":16}}},)"),
        ckpt.empty() ? ""
                     : absl::StrCat(R"("checkpoint":{"dir":")", ckpt, R"(","every_updates":2},)"),
        R"("workers":{"count":1},"stop":{"max_updates":2}})");
  }
  // Submits `spec` as the holder of `token`, runs one TLS worker with `roots` on it, and
  // returns the ended job (and the worker's exit code).
  v1::Job RunAs(ProcessCluster* c, const char* token, const std::string& spec,
                const std::string& roots, int* worker_exit = nullptr) {
    const Run submit =
        As(c->address(), token,
           {"job", "submit", SpecFile(spec, absl::StrCat("job-", ++jobs_, ".json"))});
    EXPECT_EQ(submit.code, 0) << submit.output;
    if (submit.code != 0) return v1::Job();
    const std::string id = JobIdOf(submit);
    EXPECT_TRUE(c->StartWorker(id, WorkerTls(roots)).ok());
    absl::StatusOr<v1::Job> job = c->WaitForJob(id, absl::Minutes(2));
    EXPECT_TRUE(job.ok()) << job.status() << c->Logs();
    const std::vector<int> exits = c->WaitForWorkers(absl::Minutes(1));
    if (worker_exit != nullptr) *worker_exit = exits.empty() ? -1 : exits.back();
    return job.ok() ? *job : v1::Job();
  }

  std::string dir_, certs_, tokens_;
  int cli_runs_ = 0;
  int jobs_ = 0;
};

// Done-when: through real processes an mTLS job trains end to end. Catches: a worker that
// cannot speak TLS or present its certificate, the collective's rendezvous store refused to
// workers, a submitter not recorded as the job's owner, a worker without a credential let in.
TEST_F(SecurityProcessTest, AnMtlsJobTrainsEndToEnd) {
  if (!std::filesystem::exists(BinDir() + "/trainstep-worker")) {
    GTEST_SKIP() << "built without the worker (TRAINSTEP_BUILD_WORKER=OFF)";
  }
  std::unique_ptr<ProcessCluster> c = StartSecured();
  ASSERT_NE(c, nullptr);
  const Run submit =
      Cli(c->address(), {"job", "submit", SpecFile()},
          {"TRAINSTEP_TLS_CA=" + certs_ + "/ca.crt", "TRAINSTEP_TLS_CERT=" + certs_ + "/client.crt",
           "TRAINSTEP_TLS_KEY=" + certs_ + "/client.key"});
  ASSERT_EQ(submit.code, 0) << submit.output;
  const std::string job_id = JobIdOf(submit);
  const std::vector<std::string> worker_tls = WorkerTls("--allowed-roots=" + dir_);
  ASSERT_TRUE(c->StartWorker(job_id, worker_tls).ok());
  ASSERT_TRUE(c->StartWorker(job_id, worker_tls).ok());
  // Without a certificate or a token: refused at registration, and it says why.
  ASSERT_TRUE(
      c->StartWorker(job_id, {"--tls-ca=" + certs_ + "/ca.crt", "--allowed-roots=" + dir_}).ok());
  absl::StatusOr<v1::Job> job = c->WaitForJob(job_id, absl::Minutes(4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->message() << c->Logs();
  EXPECT_EQ(job->progress().optimizer_update_id(), 4);
  EXPECT_EQ(job->owner(), "DNS:trainstep-client");
  const std::vector<int> codes = c->WaitForWorkers(absl::Minutes(1));
  ASSERT_EQ(codes.size(), 3u);
  EXPECT_EQ(codes[0], 0) << c->Logs();
  EXPECT_EQ(codes[1], 0) << c->Logs();
  EXPECT_NE(codes[2], 0);
  EXPECT_THAT(ReadFile(c->dir() + "/worker-2.log"), HasSubstr("RegisterWorker needs a credential"));
}

// Done-when: each role's allowed and refused calls, with the right code. Catches: a role
// allowed beyond its table, a submitter cancelling another's job, refusals not counted in the
// metric or logged without the principal, the owner missing from `job get`.
TEST_F(SecurityProcessTest, EachRoleIsAllowedItsCallsAndRefusedTheRest) {
  std::unique_ptr<ProcessCluster> c = StartSecured();
  ASSERT_NE(c, nullptr);
  const std::string& at = c->address();
  const std::string spec = SpecFile();

  const Run viewer_list = As(at, kViewerToken, {"job", "list"});
  EXPECT_EQ(viewer_list.code, 0) << viewer_list.output;
  const Run viewer_submit = As(at, kViewerToken, {"job", "submit", spec});
  EXPECT_EQ(viewer_submit.code, 8) << viewer_submit.output;
  EXPECT_THAT(viewer_submit.output,
              HasSubstr("permission denied: token principal \"vic\" (roles viewer) may not call "
                        "SubmitJob: it needs the role submitter or admin"));

  const Run alice_submit = As(at, kAliceToken, {"job", "submit", spec});
  ASSERT_EQ(alice_submit.code, 0) << alice_submit.output;
  const std::string alices = JobIdOf(alice_submit);
  // bob's submit of the same file in the same minute is his own job (not alice's, by the id).
  const Run bob_submit = As(at, kBobToken, {"job", "submit", spec});
  ASSERT_EQ(bob_submit.code, 0) << bob_submit.output;
  const std::string bobs = JobIdOf(bob_submit);
  EXPECT_NE(alices, bobs);
  EXPECT_THAT(As(at, kViewerToken, {"job", "get", alices, "-o", "json"}).output,
              HasSubstr("\"owner\": \"alice\""));
  const Run bob_cancels_alices = As(at, kBobToken, {"job", "cancel", alices});
  EXPECT_EQ(bob_cancels_alices.code, 8) << bob_cancels_alices.output;
  EXPECT_THAT(bob_cancels_alices.output, HasSubstr("\"bob\" may cancel only its own jobs"));
  EXPECT_EQ(As(at, kViewerToken, {"job", "cancel", bobs}).code, 8);
  EXPECT_EQ(As(at, kBobToken, {"job", "cancel", bobs}).code, 0);
  EXPECT_EQ(As(at, kAdminToken, {"job", "cancel", alices}).code, 0);
  EXPECT_EQ(As(at, kViewerToken, {"worker", "list"}).code, 0);

  // No credential at all, and a token nobody issued.
  const Run anonymous = Cli(at, {"job", "list"}, {"TRAINSTEP_TLS_CA=" + certs_ + "/ca.crt"});
  EXPECT_EQ(anonymous.code, 8) << anonymous.output;
  EXPECT_THAT(anonymous.output, HasSubstr("not authenticated: ListJobs needs a credential"));
  const Run forged = As(at, "tok-forged-0123456789", {"job", "list"});
  EXPECT_EQ(forged.code, 8) << forged.output;
  EXPECT_THAT(forged.output, HasSubstr("not one this coordinator knows"));
  // The worker's certificate is for WorkerService only.
  const Run worker_cli =
      Cli(at, {"job", "list"},
          {"TRAINSTEP_TLS_CA=" + certs_ + "/ca.crt", "TRAINSTEP_TLS_CERT=" + certs_ + "/worker.crt",
           "TRAINSTEP_TLS_KEY=" + certs_ + "/worker.key"});
  EXPECT_EQ(worker_cli.code, 8) << worker_cli.output;
  EXPECT_THAT(worker_cli.output, HasSubstr("certificate principal \"DNS:trainstep-worker\""));

  // WorkerService: workers and admins; not viewers or submitters.
  const Run third = As(at, kAliceToken, {"job", "submit", spec, "--request-id", "third"});
  ASSERT_EQ(third.code, 0) << third.output;
  const std::string live = JobIdOf(third);
  ChannelSecurity viewer = Client("");
  viewer.token = kViewerToken;
  EXPECT_EQ(WorkerClient(MakeChannel(at, viewer)).StoreNumKeys({live}).status().code(),
            absl::StatusCode::kPermissionDenied);
  ChannelSecurity alice = Client("");
  alice.token = kAliceToken;
  EXPECT_EQ(WorkerClient(MakeChannel(at, alice)).StoreNumKeys({live}).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(WorkerClient(MakeChannel(at, Client("worker"))).StoreNumKeys({live}).ok());
  EXPECT_TRUE(WorkerClient(MakeChannel(at, Client("client"))).StoreNumKeys({live}).ok());

  // A worker limited to one job (the file re-read while serving): that job only, and a
  // registration must name it.
  WriteFile(certs_ + "/auth-certs.txt",
            absl::StrCat("DNS:trainstep-worker worker:", live, "\nDNS:trainstep-client admin\n"));
  WorkerClientOptions quick;
  quick.connect_timeout = absl::Seconds(5);
  WorkerClient limited(MakeChannel(at, Client("worker")), quick);
  // The roles are re-read every second: wait until the new line has taken effect (a loaded
  // machine can delay the reload well past a second), not for a fixed time.
  absl::StatusOr<int64_t> other = limited.StoreNumKeys({alices});
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);
       other.ok() && absl::Now() < give_up; other = limited.StoreNumKeys({alices})) {
    Nap(absl::Milliseconds(200));
  }
  EXPECT_TRUE(limited.StoreNumKeys({live}).ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.status().message(), HasSubstr("a worker of " + live + " only"));
  v1::RegisterWorkerRequest anywhere;
  anywhere.set_name("w");
  EXPECT_EQ(limited.RegisterWorker(anywhere).status().code(), absl::StatusCode::kPermissionDenied);

  // Counted by method and code, logged with the principal.
  absl::StatusOr<std::string> metrics = obs::HttpGet(c->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("trainstep_rpc_auth_failures_total{code=\"permission_denied\","
                                  "method=\"SubmitJob\"} 1"));
  EXPECT_THAT(*metrics, HasSubstr("trainstep_rpc_auth_failures_total{code=\"unauthenticated\","
                                  "method=\"ListJobs\"} 2"));
  EXPECT_THAT(*metrics, HasSubstr("trainstep_rpc_auth_failures_total{code=\"permission_denied\","
                                  "method=\"CancelJob\"} 2"));
  // CONVENTIONS.md: the exposition, with the new counter in it, passes promtool.
  if (std::optional<std::string> promtool = obs::FindProgram("promtool")) {
    const obs::ProcessResult check = obs::RunProgram({*promtool, "check", "metrics"}, *metrics);
    EXPECT_EQ(check.exit_code, 0) << check.output;
  }
  const std::string log = ReadFile(c->dir() + "/coordinator.log");
  EXPECT_THAT(log, HasSubstr("refused SubmitJob from token \"vic\""));
  EXPECT_THAT(log, HasSubstr("refused CancelJob from \"bob\""));
}

// Done-when: a plaintext or wrong-CA client is refused, and each failure says which. Catches:
// a TLS failure reported as "is it running?", a required client certificate not required.
TEST_F(SecurityProcessTest, PlaintextWrongCaAndWrongHostClientsAreRefusedSayingWhich) {
  std::unique_ptr<ProcessCluster> c = StartSecured();
  ASSERT_NE(c, nullptr);
  const std::string& at = c->address();
  const Run plaintext = Cli(at, {"job", "list"});
  EXPECT_EQ(plaintext.code, 3) << plaintext.output;
  EXPECT_THAT(plaintext.output, HasSubstr("if it serves TLS, pass --tls-ca"));
  const Run wrong_ca = Cli(
      at, {"job", "list", "--tls-ca", dir_ + "/other/ca.crt", "--token-file", tokens_ + ".viewer"});
  EXPECT_EQ(wrong_ca.code, 2) << wrong_ca.output;  // the token file is missing: usage error
  WriteFile(tokens_ + ".viewer", kViewerToken);
  const Run untrusted = Cli(
      at, {"job", "list", "--tls-ca", dir_ + "/other/ca.crt", "--token-file", tokens_ + ".viewer"});
  EXPECT_EQ(untrusted.code, 3) << untrusted.output;
  EXPECT_THAT(untrusted.output, HasSubstr("untrusted certificate"));
  EXPECT_THAT(untrusted.output, Not(HasSubstr("Handshake failed")));  // gRPC's own log is quiet
  const std::string port = at.substr(at.rfind(':') + 1);
  const Run wrong_host = Cli("127.0.0.2:" + port, {"job", "list", "--tls-ca", certs_ + "/ca.crt",
                                                   "--token-file", tokens_ + ".viewer"});
  EXPECT_EQ(wrong_host.code, 3) << wrong_host.output;
  EXPECT_THAT(wrong_host.output, HasSubstr("does not name \"127.0.0.2\": wrong host name"));
  const Run right = Cli("localhost:" + port, {"job", "list", "--tls-ca", certs_ + "/ca.crt",
                                              "--token-file", tokens_ + ".viewer"});
  EXPECT_EQ(right.code, 0) << right.output;

  // A TLS client against a plaintext coordinator.
  absl::StatusOr<std::unique_ptr<ProcessCluster>> plain = ProcessCluster::Start(dir_ + "/plain");
  ASSERT_TRUE(plain.ok()) << plain.status();
  const Run tls_to_plain =
      Cli((*plain)->address(), {"job", "list", "--tls-ca", certs_ + "/ca.crt"});
  EXPECT_EQ(tls_to_plain.code, 3) << tls_to_plain.output;
  EXPECT_THAT(tls_to_plain.output, HasSubstr("does not speak TLS"));

  // Client certificates required (no tokens): none, or one another CA signed, is refused in
  // the handshake.
  absl::StatusOr<std::unique_ptr<ProcessCluster>> mtls = ProcessCluster::Start(
      dir_ + "/mtls", absl::Seconds(10),
      {"--tls-cert=" + certs_ + "/coordinator.crt", "--tls-key=" + certs_ + "/coordinator.key",
       "--tls-client-ca=" + certs_ + "/ca.crt"},
      false, Client("client"));
  ASSERT_TRUE(mtls.ok()) << mtls.status();
  const std::string& m = (*mtls)->address();
  const Run no_cert = Cli(m, {"job", "list", "--tls-ca", certs_ + "/ca.crt"});
  EXPECT_EQ(no_cert.code, 3) << no_cert.output;
  EXPECT_THAT(no_cert.output, HasSubstr("pass --tls-cert and --tls-key"));
  const Run foreign = Cli(m, {"job", "list", "--tls-ca", certs_ + "/ca.crt", "--tls-cert",
                              dir_ + "/other/client.crt", "--tls-key", dir_ + "/other/client.key"});
  EXPECT_EQ(foreign.code, 3) << foreign.output;
  EXPECT_THAT(foreign.output, HasSubstr("did not accept " + dir_ + "/other/client.crt"));
  const Run admitted = Cli(m, {"job", "list", "--tls-ca", certs_ + "/ca.crt", "--tls-cert",
                               certs_ + "/client.crt", "--tls-key", certs_ + "/client.key"});
  EXPECT_EQ(admitted.code, 0) << admitted.output;
}

// Done-when: a certificate rotated on disk is picked up without a restart; and a token
// added or revoked in --auth-tokens. Catches: credentials read once at start (cert-manager's
// renewal would need a restart; a revoked token would keep working).
TEST_F(SecurityProcessTest, RotatedCertificatesAndTokensArePickedUpWithoutARestart) {
  std::unique_ptr<ProcessCluster> c = StartSecured();
  ASSERT_NE(c, nullptr);
  const pid_t pid = c->coordinator_pid();
  std::string before;
  ASSERT_TRUE(RawCall(FreshChannel(c->address(), Client("client")), kHealthCheckMethod, "", nullptr,
                      &before)
                  .ok());
  EXPECT_EQ(before, ReadFile(certs_ + "/coordinator.crt"));
  ASSERT_EQ(DevCerts(certs_), 0);  // new leaf certificates from the same CA
  const std::string rotated = ReadFile(certs_ + "/coordinator.crt");
  ASSERT_NE(rotated, before);
  std::string seen;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(90);
       seen != rotated && absl::Now() < give_up;) {
    Nap(absl::Milliseconds(200));
    seen.clear();
    // The client's own certificate rotated too: its new one is accepted.
    (void)RawCall(FreshChannel(c->address(), Client("client")), kHealthCheckMethod, "", nullptr,
                  &seen);
  }
  EXPECT_EQ(seen, rotated) << "the coordinator still presents its old certificate";
  EXPECT_EQ(c->coordinator_pid(), pid);

  const Run before_token = As(c->address(), "tok-carol-0123456789", {"job", "list"});
  EXPECT_EQ(before_token.code, 8) << before_token.output;
  WriteFile(tokens_, absl::StrCat(kAdminToken, " root admin\ntok-carol-0123456789 carol viewer\n"));
  Run carol, alice;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(90); absl::Now() < give_up;) {
    Nap(absl::Milliseconds(300));
    carol = As(c->address(), "tok-carol-0123456789", {"job", "list"});
    alice = As(c->address(), kAliceToken, {"job", "list"});
    if (carol.code == 0 && alice.code == 8) break;
  }
  EXPECT_EQ(carol.code, 0) << carol.output;
  EXPECT_EQ(alice.code, 8) << alice.output;  // revoked
}

// Done-when (item 3): --health-listen serves grpc.health.v1 alone, in plaintext, for the
// kubelet; the secured port serves nothing else unauthenticated. Catches: the probe port
// exposing the job API or reflection, reflection left on a secured port, health needing a
// credential.
TEST_F(SecurityProcessTest, TheHealthPortServesHealthAloneAndTheSecuredPortNothingElseOpen) {
  std::unique_ptr<ProcessCluster> c = StartSecured();
  ASSERT_NE(c, nullptr);
  ASSERT_NE(c->health_port(), 0);
  const std::string health = absl::StrCat("127.0.0.1:", c->health_port());
  ASSERT_EQ(HealthCheck(FreshChannel(health, {})), kServing);
  EXPECT_EQ(RawCall(FreshChannel(health, {}), "/trainstep.v1.JobService/ListJobs", "").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(
      RawCall(FreshChannel(health, {}), kReflection, std::string(kListServices, 2)).error_code(),
      grpc::StatusCode::UNIMPLEMENTED);

  const ChannelSecurity anonymous = Client("");
  ASSERT_EQ(HealthCheck(FreshChannel(c->address(), anonymous)), kServing);
  EXPECT_EQ(
      RawCall(FreshChannel(c->address(), anonymous), kReflection, std::string(kListServices, 2))
          .error_code(),
      grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(RawCall(FreshChannel(c->address(), anonymous), "/trainstep.v1.JobService/ListJobs", "")
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(
      RawCall(FreshChannel(c->address(), anonymous), "/trainstep.v1.WorkerService/StoreNumKeys", "")
          .error_code(),
      grpc::StatusCode::UNAUTHENTICATED);

  // A plaintext loopback coordinator keeps reflection, as before.
  absl::StatusOr<std::unique_ptr<ProcessCluster>> plain = ProcessCluster::Start(dir_ + "/plain");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(
      RawCall(FreshChannel((*plain)->address(), {}), kReflection, std::string(kListServices, 2))
          .ok());
}

// Catches: the coordinator starting with flags that would serve everyone, or failing to say
// which flag is wrong.
TEST_F(SecurityProcessTest, FlagsThatWouldServeEveryoneRefuseToStart) {
  const auto start = [&](const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {BinDir() + "/trainstep-coordinator", "--state-dir",
                                     dir_ + "/state", "--metrics-listen="};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const std::string log = absl::StrCat(dir_, "/start-", ++cli_runs_, ".log");
    absl::StatusOr<int> rc = RunToExit(argv, log, absl::Seconds(30));
    return Run{rc.ok() ? *rc : -1, ReadFile(log)};
  };
  const Run tls_only = start({"--listen=0.0.0.0:0", "--tls-cert=" + certs_ + "/coordinator.crt",
                              "--tls-key=" + certs_ + "/coordinator.key"});
  EXPECT_EQ(tls_only.code, 1);
  EXPECT_THAT(tls_only.output, HasSubstr("authenticates nobody"));
  const Run bad_tokens = start({"--tls-cert=" + certs_ + "/coordinator.crt",
                                "--tls-key=" + certs_ + "/coordinator.key",
                                "--auth-tokens=" + certs_ + "/auth-certs.txt"});
  EXPECT_EQ(bad_tokens.code, 1);
  EXPECT_THAT(bad_tokens.output, HasSubstr("--auth-tokens " + certs_ + "/auth-certs.txt: line 3"));
  const Run swapped =
      start({"--tls-cert=" + certs_ + "/coordinator.key",
             "--tls-key=" + certs_ + "/coordinator.crt", "--auth-tokens=" + tokens_});
  EXPECT_EQ(swapped.code, 1);
  EXPECT_THAT(swapped.output, HasSubstr("--tls-cert " + certs_ + "/coordinator.key: not a PEM"));
}

// A submitter could make workers read their own secrets. Catches: a TLS worker (a real
// deployment) starting with no --allowed-roots; a job naming /etc/shadow, or the worker's own
// key directory even under --allowed-roots /, or held-out data outside the roots, read before
// it fails (or failing without naming the field).
TEST_F(SecurityProcessTest, AWorkerNeverReadsItsOwnSecretsOrFilesOutsideItsRoots) {
  if (!std::filesystem::exists(BinDir() + "/trainstep-worker")) {
    GTEST_SKIP() << "built without the worker (TRAINSTEP_BUILD_WORKER=OFF)";
  }
  const std::string log = dir_ + "/no-roots.log";
  std::vector<std::string> argv = {BinDir() + "/trainstep-worker", "--coordinator=127.0.0.1:1",
                                   "--metrics-listen="};
  for (const std::string& flag : WorkerTls("")) argv.push_back(flag);
  absl::StatusOr<int> refused = RunToExit(argv, log, absl::Seconds(60));
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(*refused, 2) << ReadFile(log);
  EXPECT_THAT(ReadFile(log), HasSubstr("--allowed-roots is required when the worker talks TLS"));
  EXPECT_THAT(ReadFile(log), Not(HasSubstr("registered")));

  std::unique_ptr<ProcessCluster> c = StartSecured();
  ASSERT_NE(c, nullptr);
  const std::string data = dir_ + "/data";
  std::filesystem::create_directories(data);
  WriteFile(data + "/corpus.txt", std::string(4000, 'a'));
  const std::string roots = "--allowed-roots=" + data;

  int exit_code = 0;
  const v1::Job shadow = RunAs(c.get(), kAliceToken, TextJob("/etc/shadow"), roots, &exit_code);
  EXPECT_EQ(shadow.state(), v1::FAILED) << c->Logs();
  EXPECT_THAT(shadow.message(), HasSubstr("data.text.paths[0]: /etc/shadow is outside this "
                                          "worker's --allowed-roots " +
                                          data));
  EXPECT_EQ(shadow.progress().optimizer_update_id(), 0);
  EXPECT_EQ(exit_code, 1);

  // The worker's own key directory, even with every path allowed on purpose.
  const v1::Job key = RunAs(c.get(), kAliceToken, TextJob(certs_), "--allowed-roots=/");
  EXPECT_EQ(key.state(), v1::FAILED) << c->Logs();
  EXPECT_THAT(key.message(), HasSubstr("data.text.paths[0]: " + certs_ +
                                       " contains this "
                                       "worker's own TLS"));
  EXPECT_EQ(key.progress().optimizer_update_id(), 0);
  const v1::Job key_file =
      RunAs(c.get(), kAliceToken, TextJob(data + "/../certs/worker.key"), "--allowed-roots=/");
  EXPECT_EQ(key_file.state(), v1::FAILED);
  EXPECT_THAT(key_file.message(), HasSubstr("is this worker's own TLS key (--tls-key)"));

  // Held-out data is checked like training data.
  const v1::Job eval =
      RunAs(c.get(), kAliceToken, TextJob(data + "/corpus.txt", "", "/etc/passwd"), roots);
  EXPECT_EQ(eval.state(), v1::FAILED);
  EXPECT_THAT(eval.message(), HasSubstr("eval.data.text.paths[0]: /etc/passwd is outside"));

  const v1::Job fine = RunAs(c.get(), kAliceToken, TextJob(data + "/corpus.txt"), roots);
  EXPECT_EQ(fine.state(), v1::SUCCEEDED) << fine.message() << c->Logs();
}

// Per owner: --allowed-roots SHARED,DATA/{owner},CKPT/{owner}. Catches: one tenant reading
// another's data or writing into its checkpoints (directly, through "..", through a symlink in
// its own tree), the owner not reaching the worker, a missing owner directory accepted.
TEST_F(SecurityProcessTest, TwoOwnersCannotReachEachOthersFiles) {
  if (!std::filesystem::exists(BinDir() + "/trainstep-worker")) {
    GTEST_SKIP() << "built without the worker (TRAINSTEP_BUILD_WORKER=OFF)";
  }
  std::unique_ptr<ProcessCluster> c = StartSecured();
  ASSERT_NE(c, nullptr);
  const std::string data = dir_ + "/data", ckpt = dir_ + "/ckpt";
  for (const std::string owner : {"alice", "bob"}) {
    std::filesystem::create_directories(data + "/" + owner);
    std::filesystem::create_directories(ckpt + "/" + owner);
    WriteFile(data + "/" + owner + "/corpus.txt", std::string(4000, owner[0]));
  }
  std::filesystem::create_directories(data + "/shared");
  WriteFile(data + "/shared/corpus.txt", std::string(4000, 's'));
  std::filesystem::create_directory_symlink("../bob", data + "/alice/bobs");
  const std::string roots =
      absl::StrCat("--allowed-roots=", data, "/shared,", data, "/{owner},", ckpt, "/{owner}");

  struct Attempt {
    std::string what, spec, field;
  };
  const std::vector<Attempt> refused = {
      {"bob's data", TextJob(data + "/bob/corpus.txt"), "data.text.paths[0]"},
      {"bob's data through ..", TextJob(data + "/alice/../bob/corpus.txt"), "data.text.paths[0]"},
      {"bob's data through a symlink", TextJob(data + "/alice/bobs/corpus.txt"),
       "data.text.paths[0]"},
      {"bob's checkpoints", TextJob(data + "/alice/corpus.txt", ckpt + "/bob/run"),
       "checkpoint.dir"},
  };
  for (const Attempt& a : refused) {
    SCOPED_TRACE(a.what);
    const v1::Job job = RunAs(c.get(), kAliceToken, a.spec, roots);
    EXPECT_EQ(job.state(), v1::FAILED) << c->Logs();
    EXPECT_THAT(job.message(), HasSubstr(a.field + ": "));
    EXPECT_THAT(job.message(), HasSubstr("outside this worker's --allowed-roots"));
    EXPECT_THAT(job.message(), HasSubstr(data + "/alice"));  // alice's roots, bound
  }
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/bob/run"));

  const v1::Job own =
      RunAs(c.get(), kAliceToken, TextJob(data + "/alice/corpus.txt", ckpt + "/alice/run"), roots);
  EXPECT_EQ(own.state(), v1::SUCCEEDED) << own.message() << c->Logs();
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/alice/run"));
  const v1::Job shared = RunAs(c.get(), kBobToken, TextJob(data + "/shared/corpus.txt"), roots);
  EXPECT_EQ(shared.state(), v1::SUCCEEDED) << shared.message() << c->Logs();

  // The admin's certificate principal, DNS:trainstep-client, has no directory: named, refused.
  const Run submit =
      Cli(c->address(), {"job", "submit", SpecFile(TextJob(data + "/shared"))},
          {"TRAINSTEP_TLS_CA=" + certs_ + "/ca.crt", "TRAINSTEP_TLS_CERT=" + certs_ + "/client.crt",
           "TRAINSTEP_TLS_KEY=" + certs_ + "/client.key"});
  ASSERT_EQ(submit.code, 0) << submit.output;
  ASSERT_TRUE(c->StartWorker(JobIdOf(submit), WorkerTls(roots)).ok());
  absl::StatusOr<v1::Job> nobody = c->WaitForJob(JobIdOf(submit), absl::Minutes(2));
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  EXPECT_EQ(nobody->state(), v1::FAILED);
  EXPECT_THAT(nobody->message(),
              HasSubstr(data + "/DNS%3Atrainstep-client does not exist for the job's owner "
                               "\"DNS:trainstep-client\""));
}

}  // namespace
}  // namespace trainstep
