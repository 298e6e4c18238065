#include "common/version.h"

#include <gtest/gtest.h>

#include <string>

namespace trainstep {
namespace {

// Catches: the project's version not reaching the binaries (trainstep_build_info would say
// "dev" in a CMake build).
TEST(VersionTest, IsTheProjectVersion) {
  EXPECT_EQ(std::string(TrainstepVersion()), TRAINSTEP_TEST_PROJECT_VERSION);
}

}  // namespace
}  // namespace trainstep
