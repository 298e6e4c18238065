// RewriteParseError depends on protobuf 3.21's English error messages. The first group of
// tests pins the phrases it matches, straight from protobuf's JSON parser, so an upgrade that
// rewords them fails here, naming the phrase, instead of silently degrading every spec error
// to protobuf's text. The second group checks the rewrite itself on those messages.
#include "core/spec_parse_error.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "google/protobuf/util/json_util.h"
#include "trainstep/v1/spec.pb.h"

namespace trainstep {
namespace {

namespace pb = ::google::protobuf;

// Protobuf's own message for `json` parsed as a JobSpec ("" when it parses).
std::string ProtobufError(const std::string& json) {
  v1::JobSpec spec;
  pb::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = pb::util::JsonStringToMessage(json, &spec, options);
  return std::string(status.message().data(), status.message().size());
}

absl::Status Rewrite(const std::string& json) {
  return RewriteParseError(json, ProtobufError(json));
}

// --- Protobuf's wording, as the rewriter matches it ---

TEST(ProtobufWordingTest, UnknownField) {
  EXPECT_EQ(ProtobufError(R"({"batch": {"micro_batch_sizee": 2}})"),
            "(batch) micro_batch_sizee: Cannot find field.");
}

TEST(ProtobufWordingTest, ListOnScalar) {
  EXPECT_TRUE(absl::EndsWith(ProtobufError(R"({"name": ["a"]})"),
                             "name: Proto field is not repeating, cannot start list."))
      << ProtobufError(R"({"name": ["a"]})");
}

TEST(ProtobufWordingTest, InvalidValueForType) {
  const std::string m = ProtobufError(R"({"batch": {"micro_batch_size": "x"}})");
  EXPECT_TRUE(absl::StartsWith(m, "(batch.micro_batch_size): invalid value ")) << m;
  EXPECT_TRUE(absl::StrContains(m, " for type ")) << m;
}

TEST(ProtobufWordingTest, ObjectOnScalar) {
  const std::string m = ProtobufError(R"({"name": {"a": 1}})");
  EXPECT_TRUE(absl::StrContains(m, "invalid value Starting an object on a scalar field for type "))
      << m;
}

TEST(ProtobufWordingTest, OneofTwice) {
  const std::string m = ProtobufError(R"({"model": {"mlp": {}, "tiny_gpt": {}}})");
  EXPECT_TRUE(absl::StrContains(m, "invalid value oneof field 'kind' is already set. Cannot set '"))
      << m;
}

TEST(ProtobufWordingTest, RootNotAnObject) {
  EXPECT_TRUE(absl::EndsWith(ProtobufError("[1]"), "Root element must be a message."))
      << ProtobufError("[1]");
}

TEST(ProtobufWordingTest, SyntaxErrorEndsInACaretLine) {
  const std::string m = ProtobufError("{\"name\": \"a\",, }");
  ASSERT_NE(m.rfind('\n'), std::string::npos) << m;
  const std::string marker = m.substr(m.rfind('\n') + 1);
  EXPECT_TRUE(absl::EndsWith(marker, "^")) << m;
}

// --- The rewrite ---

// Catches: an unknown field reported without the fields the message does accept.
TEST(RewriteParseErrorTest, UnknownFieldNamesWhatIsAccepted) {
  const absl::Status s = Rewrite(R"({"batch": {"micro_batch_sizee": 2}})");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "batch.micro_batch_sizee: unknown field; batch "
                               "accepts: micro_batch_size"))
      << s.message();
}

// Catches: a syntax error without its line and column.
TEST(RewriteParseErrorTest, SyntaxErrorNamesLineAndColumn) {
  const absl::Status s = Rewrite("{\n  \"name\": \"a\",,\n}");
  EXPECT_TRUE(absl::StartsWith(s.message(), "spec is not valid JSON at line 2, column 15"))
      << s.message();
}

// Catches: a wrong-typed value reported in protobuf's words instead of what the field takes.
TEST(RewriteParseErrorTest, WrongTypeSaysWhatIsExpected) {
  const absl::Status s = Rewrite(R"({"batch": {"micro_batch_size": "x"}})");
  EXPECT_TRUE(absl::StartsWith(s.message(), "batch.micro_batch_size: expected ")) << s.message();
}

TEST(RewriteParseErrorTest, RootNotAnObject) {
  EXPECT_EQ(Rewrite("[1]").message(), "spec must be a JSON object, got a list");
}

// Catches: a message the rewriter does not know swallowed or mangled: it passes through,
// located, so the user still sees protobuf's explanation.
TEST(RewriteParseErrorTest, UnknownWordingPassesThrough) {
  EXPECT_EQ(RewriteParseError("{}", "(batch) something new happened").message(),
            "batch: something new happened");
  EXPECT_EQ(RewriteParseError("{}", "something new").message(), "spec: something new");
  EXPECT_EQ(RewriteParseError("{}", "something new").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainstep
