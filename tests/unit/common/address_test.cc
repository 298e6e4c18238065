#include "common/address.h"

#include <gtest/gtest.h>
#include <sys/utsname.h>

#include <string>

namespace trainstep {
namespace {

// Catches: the coordinator and the worker disagreeing on what loopback is (the worker once
// missed [::1] and advertised its host name to peers on the same machine).
TEST(AddressTest, LoopbackForms) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:7070"));
  EXPECT_TRUE(IsLoopbackAddress("127.1.2.3:1"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:7070"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:7070"));
}

// Catches: a public or wildcard address taken for loopback, which would let the coordinator
// serve the network without credentials.
TEST(AddressTest, OtherAddressesAreNot) {
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:7070"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:7070"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.1:7070"));
  EXPECT_FALSE(IsLoopbackAddress("localhost.example.com:7070"));
  EXPECT_FALSE(IsLoopbackAddress("coordinator:7070"));
  EXPECT_FALSE(IsLoopbackAddress(""));
}

// Catches: a default address the coordinator refuses to serve without --insecure.
TEST(AddressTest, DefaultCoordinatorIsLoopback) {
  EXPECT_TRUE(IsLoopbackAddress(kDefaultCoordinator));
}

// Catches: a host name cut short or left unterminated (peers would dial a wrong name).
TEST(AddressTest, LocalHostNameIsTheNodeName) {
  utsname u;
  ASSERT_EQ(uname(&u), 0);
  EXPECT_EQ(LocalHostName(), std::string(u.nodename));
}

}  // namespace
}  // namespace trainstep
