// auth.h: the auth files' syntax, who a call's credentials make the caller, and the one
// decision per method and role.
#include "coordinator/auth.h"

#include <google/protobuf/descriptor.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainstep/v1/job_service.pb.h"
#include "trainstep/v1/worker_service.pb.h"

namespace trainstep {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "0123456789abcdef-alice";

AuthTables Tables() {
  AuthTables t;
  t.tokens_enabled = true;
  t.tokens = *ParseAuthTokens(absl::StrCat(kToken, " alice submitter\n",
                                           "0123456789abcdef-admin root admin\n",
                                           "0123456789abcdef-view1 vic viewer\n"));
  t.certs_mapped = true;
  t.certs = *ParseAuthCerts(
      "# workers\nDNS:worker.example worker\nDNS:w3.example worker:job-3\n\n"
      "URI:spiffe://x/admin admin\n");
  return t;
}

absl::StatusOr<std::optional<Principal>> Token(absl::string_view token) {
  CallCredentials c;
  c.authorization = absl::StrCat("Bearer ", token);
  return Identify(c, Tables());
}

absl::StatusOr<std::optional<Principal>> Cert(std::vector<std::string> sans) {
  CallCredentials c;
  c.has_certificate = true;
  c.certificate_sans = std::move(sans);
  c.certificate_cn = "cn";
  return Identify(c, Tables());
}

// Catches: a typo in a role name granting nothing silently, two worker limits on one line.
TEST(ParseRoles, KnownRolesAndOneWorkerLimit) {
  absl::StatusOr<Grant> g = ParseRoles("viewer,worker:job-3");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->roles, kRoleViewer | kRoleWorker);
  EXPECT_EQ(g->worker_job, "job-3");
  EXPECT_EQ(RolesText(*g), "viewer,worker:job-3");
  EXPECT_THAT(ParseRoles("admn").status().message(), HasSubstr("unknown role \"admn\""));
  EXPECT_FALSE(ParseRoles("worker,worker:job-3").ok());
  EXPECT_FALSE(ParseRoles("worker:").ok());
}

// Catches: lines of the wrong shape, an untyped SAN (which never matches a certificate),
// short or duplicated tokens — each refused with its line number.
TEST(ParseAuthFiles, LinesOfTheWrongShapeAreRefusedWithTheirNumber) {
  EXPECT_THAT(ParseAuthCerts("\n\nworker.example worker\n").status().message(),
              HasSubstr("line 3: \"worker.example\" is not a SAN"));
  EXPECT_THAT(ParseAuthCerts("DNS:a worker extra\n").status().message(), HasSubstr("line 1"));
  EXPECT_THAT(ParseAuthCerts("DNS:a cook\n").status().message(), HasSubstr("unknown role"));
  EXPECT_THAT(ParseAuthTokens("short alice admin\n").status().message(), HasSubstr("at least 16"));
  EXPECT_THAT(
      ParseAuthTokens("0123456789abcdefX a admin\n0123456789abcdefX b viewer\n").status().message(),
      HasSubstr("line 2: this token is also the token of a"));
  EXPECT_TRUE(ParseAuthTokens("# none yet\n").ok());
}

// Catches: a token taken for someone else's, a bad token passing as "no credential", a token
// accepted by a coordinator that takes none.
TEST(Identify, BearerTokens) {
  absl::StatusOr<std::optional<Principal>> alice = Token(kToken);
  ASSERT_TRUE(alice.ok() && alice->has_value()) << alice.status();
  EXPECT_EQ((*alice)->name, "alice");
  EXPECT_EQ((*alice)->source, "token");
  EXPECT_EQ((*alice)->grant.roles, kRoleSubmitter);
  EXPECT_EQ(Token("0123456789abcdef-alicX").status().code(), absl::StatusCode::kUnauthenticated);
  CallCredentials basic;
  basic.authorization = "Basic YWxpY2U6cHc=";
  EXPECT_THAT(Identify(basic, Tables()).status().message(), HasSubstr("not \"Bearer TOKEN\""));
  AuthTables no_tokens;
  CallCredentials c;
  c.authorization = absl::StrCat("Bearer ", kToken);
  EXPECT_THAT(Identify(c, no_tokens).status().message(), HasSubstr("without --auth-tokens"));
}

// Catches: a certificate matched by a SAN it does not carry, an unlisted certificate getting
// roles, the "every certificate is admin" mode leaking into a mapped coordinator.
TEST(Identify, Certificates) {
  absl::StatusOr<std::optional<Principal>> w = Cert({"DNS:other", "DNS:worker.example"});
  ASSERT_TRUE(w.ok() && w->has_value());
  EXPECT_EQ((*w)->name, "DNS:worker.example");
  EXPECT_EQ((*w)->grant.roles, kRoleWorker);
  absl::StatusOr<std::optional<Principal>> stranger = Cert({"DNS:stranger"});
  ASSERT_TRUE(stranger.ok() && stranger->has_value());
  EXPECT_EQ((*stranger)->grant.roles, 0);
  CallCredentials c;
  c.has_certificate = true;
  c.certificate_cn = "only-a-cn";
  AuthTables unmapped;
  absl::StatusOr<std::optional<Principal>> any = Identify(c, unmapped);
  ASSERT_TRUE(any.ok() && any->has_value());
  EXPECT_EQ((*any)->name, "CN:only-a-cn");
  EXPECT_EQ((*any)->grant.roles, kRoleAdmin);
  absl::StatusOr<std::optional<Principal>> none = Identify(CallCredentials(), Tables());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

// Catches: the token of a call that also has a certificate being ignored (a CLI user on a
// worker's host would act as the worker).
TEST(Identify, ATokenWinsOverTheCertificate) {
  CallCredentials c;
  c.authorization = absl::StrCat("Bearer ", kToken);
  c.has_certificate = true;
  c.certificate_sans = {"DNS:worker.example"};
  EXPECT_EQ((*Identify(c, Tables()))->name, "alice");
}

// Catches: an RPC added to a service without a rule (nobody could call it, or worse, a rule
// picked by a similar name).
TEST(AccessOf, EveryMethodOfBothServicesHasARuleAndNamesAreDistinct) {
  std::set<std::string> names;
  for (const google::protobuf::ServiceDescriptor* d :
       {v1::SubmitJobRequest::descriptor()->file()->FindServiceByName("JobService"),
        v1::StoreSetRequest::descriptor()->file()->FindServiceByName("WorkerService")}) {
    ASSERT_NE(d, nullptr);
    for (int i = 0; i < d->method_count(); ++i) {
      EXPECT_TRUE(AccessOf(d->method(i)->name()).has_value()) << d->method(i)->full_name();
      EXPECT_TRUE(names.insert(d->method(i)->name()).second) << d->method(i)->name();
    }
  }
  EXPECT_FALSE(AccessOf("Shutdown").has_value());
}

absl::StatusCode Code(absl::string_view method, const absl::StatusOr<std::optional<Principal>>& who,
                      absl::string_view job = "") {
  return Authorize(method, who, job).status().code();
}

// Catches: a role allowed beyond its table (viewer submitting, submitter acting as worker,
// worker reading jobs), and admin missing anything.
TEST(Authorize, TheRoleTable) {
  const auto viewer = Token("0123456789abcdef-view1");
  const auto submitter = Token(kToken);
  const auto admin = Token("0123456789abcdef-admin");
  const auto worker = Cert({"DNS:worker.example"});
  constexpr auto kOk = absl::StatusCode::kOk;
  constexpr auto kDenied = absl::StatusCode::kPermissionDenied;
  for (const char* view : {"GetJob", "ListJobs", "WatchJob", "ListUpdates", "ListWorkers"}) {
    EXPECT_EQ(Code(view, viewer), kOk) << view;
    EXPECT_EQ(Code(view, submitter), kOk) << view;
    EXPECT_EQ(Code(view, admin), kOk) << view;
    EXPECT_EQ(Code(view, worker), kDenied) << view;
  }
  EXPECT_EQ(Code("SubmitJob", viewer), kDenied);
  EXPECT_EQ(Code("SubmitJob", submitter), kOk);
  EXPECT_EQ(Code("CancelJob", viewer), kDenied);
  for (const char* w : {"RegisterWorker", "Heartbeat", "BeginWindow", "StoreGet", "Attach"}) {
    EXPECT_EQ(Code(w, worker, "job-1"), kOk) << w;
    EXPECT_EQ(Code(w, admin, "job-1"), kOk) << w;
    EXPECT_EQ(Code(w, submitter, "job-1"), kDenied) << w;
    EXPECT_EQ(Code(w, viewer, "job-1"), kDenied) << w;
  }
  EXPECT_EQ(Code("SubmitJob", worker), kDenied);
  EXPECT_EQ(Code("GetJob", Cert({"DNS:stranger"})), kDenied);
  EXPECT_THAT(Authorize("SubmitJob", viewer, "").status().message(),
              HasSubstr("token principal \"vic\" (roles viewer) may not call SubmitJob: it needs "
                        "the role submitter or admin"));
}

// Catches: no credential answered PERMISSION_DENIED (the client would not know to send one),
// a bad token's reason lost.
TEST(Authorize, NoCredentialIsUnauthenticated) {
  EXPECT_EQ(Code("GetJob", std::optional<Principal>()), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(Authorize("GetJob", Token("0123456789abcdef-nobody"), "").status().message(),
              HasSubstr("not one this coordinator knows"));
}

// Catches: a submitter cancelling any job, an admin restricted to its own, the submitting
// principal not passed on as the owner.
TEST(Authorize, CancelOfOwnJobsOnlyAndTheOwner) {
  absl::StatusOr<Caller> sub = Authorize("CancelJob", Token(kToken), "job-1");
  ASSERT_TRUE(sub.ok());
  EXPECT_TRUE(sub->own_jobs_only);
  EXPECT_EQ(sub->principal, "alice");
  absl::StatusOr<Caller> admin = Authorize("CancelJob", Token("0123456789abcdef-admin"), "job-1");
  ASSERT_TRUE(admin.ok());
  EXPECT_FALSE(admin->own_jobs_only);
  EXPECT_EQ(Authorize("SubmitJob", Token(kToken), "")->principal, "alice");
}

// Catches: a worker limited to one job reaching another job's barriers or store, or joining
// whatever job the coordinator picks for a registration that names none.
TEST(Authorize, AWorkerLimitedToOneJob) {
  const auto w3 = Cert({"DNS:w3.example"});
  EXPECT_EQ(Code("StoreSet", w3, "job-3"), absl::StatusCode::kOk);
  EXPECT_EQ(Code("RegisterWorker", w3, "job-3"), absl::StatusCode::kOk);
  EXPECT_THAT(Authorize("StoreSet", w3, "job-4").status().message(),
              HasSubstr("a worker of job-3 only, not of job-4"));
  EXPECT_THAT(Authorize("RegisterWorker", w3, "").status().message(), HasSubstr("--job job-3"));
}

}  // namespace
}  // namespace trainstep
