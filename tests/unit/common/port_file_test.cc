#include "common/port_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace trainstep {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Catches: the coordinator's and the worker's port files drifting apart in format (launchers
// parse both with one reader), or a temporary file left behind.
TEST(PortFileTest, WritesOneJsonObjectWhole) {
  char tmpl[] = "/tmp/trainstep_port_file_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/ports.json";
  ASSERT_TRUE(WritePortFile(path, {{"grpc_port", 7070}, {"metrics_port", 0}}).ok());
  EXPECT_EQ(ReadAll(path), "{\"grpc_port\": 7070, \"metrics_port\": 0}\n");
  ASSERT_TRUE(WritePortFile(path, {{"metrics_port", 9464}}).ok());  // replaces, not appends
  EXPECT_EQ(ReadAll(path), "{\"metrics_port\": 9464}\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::filesystem::remove_all(tmpl);
}

// Catches: a port file that cannot be written ignored, leaving the launcher waiting forever.
TEST(PortFileTest, UnwritableDirectoryIsAnErrorNamingTheFile) {
  const absl::Status s = WritePortFile("/nonexistent-dir/ports.json", {{"grpc_port", 1}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent-dir/ports.json"), absl::string_view::npos)
      << s.message();
}

}  // namespace
}  // namespace trainstep
