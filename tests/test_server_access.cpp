// Who may talk to the server: the Host check against DNS rebinding and the
// API key comparison.
#include <gtest/gtest.h>

#include "server/access.h"

namespace wick::server {
namespace {

TEST(ServerAccess, HostOfAHostHeader) {
  EXPECT_EQ(host_of("localhost"), "localhost");
  EXPECT_EQ(host_of("LocalHost:8080"), "localhost");
  EXPECT_EQ(host_of("127.0.0.1:8080"), "127.0.0.1");
  EXPECT_EQ(host_of("[::1]:8080"), "::1");
  EXPECT_EQ(host_of("[::1]"), "::1");
  EXPECT_EQ(host_of("::1"), "::1");
  EXPECT_EQ(host_of("localhost.:80"), "localhost");
  EXPECT_EQ(host_of("Evil.Example.com:8080"), "evil.example.com");
}

TEST(ServerAccess, LoopbackHosts) {
  for (const char* h : {"localhost", "127.0.0.1", "127.1.2.3", "127.255.255.255", "::1"})
    EXPECT_TRUE(is_loopback_host(h)) << h;
  for (const char* h : {"evil.example.com", "localhost.evil.com", "127.0.0.1.evil.com", "128.0.0.1",
                        "127.0.0", "127.0.0.256", "127.0.0.1a", "0.0.0.0", "", "::2", "127..0.1"})
    EXPECT_FALSE(is_loopback_host(h)) << h;
}

TEST(ServerAccess, ALoopbackServerAnswersLoopbackNamesOnly) {
  const HostFilter f("127.0.0.1", {});
  for (const char* h :
       {"localhost:8080", "127.0.0.1:8080", "127.0.0.2", "[::1]:8080", "LOCALHOST", ""})
    EXPECT_TRUE(f.allows(h)) << h;
  for (const char* h : {"evil.example.com", "evil.example.com:8080", "192.168.1.1", "[::2]:80"})
    EXPECT_FALSE(f.allows(h)) << h;
  EXPECT_FALSE(HostFilter("localhost", {}).allows("evil.example.com"));
  EXPECT_FALSE(HostFilter("::1", {}).allows("evil.example.com"));
}

TEST(ServerAccess, AllowedHostsAddNames) {
  const HostFilter f("127.0.0.1", {"my.box", "Other.Box:9000"});
  EXPECT_TRUE(f.allows("my.box:8080"));
  EXPECT_TRUE(f.allows("other.box"));
  EXPECT_TRUE(f.allows("localhost"));
  EXPECT_FALSE(f.allows("evil.example.com"));
  EXPECT_TRUE(HostFilter("127.0.0.1", {"*"}).allows("evil.example.com"));
}

TEST(ServerAccess, AnotherAddressChecksOnlyWithAList) {
  EXPECT_TRUE(HostFilter("0.0.0.0", {}).allows("anything.example.com"));
  const HostFilter f("0.0.0.0", {"my.box"});
  EXPECT_TRUE(f.allows("my.box"));
  EXPECT_TRUE(f.allows("127.0.0.1:80"));
  EXPECT_FALSE(f.allows("evil.example.com"));
}

TEST(ServerAccess, OriginsOfLoopbackPagesOnlyByDefault) {
  const OriginFilter f({});
  EXPECT_TRUE(f.allows(""));  // no browser page
  for (const char* o : {"http://localhost", "http://localhost:3000", "https://127.0.0.1:8443",
                        "http://127.1.2.3", "http://[::1]:5173", "HTTP://LocalHost:80"})
    EXPECT_TRUE(f.allows(o)) << o;
  for (const char* o :
       {"https://evil.example.com", "http://localhost.evil.com", "http://evil.com@localhost",
        "http://localhost/path", "null", "file://", "chrome-extension://abcdef", "localhost",
        "ftp://localhost", "http://", "http://10.0.0.1:8080", "http://127.0.0.1.nip.io"})
    EXPECT_FALSE(f.allows(o)) << o;
}

TEST(ServerAccess, AllowedOriginsAddPages) {
  const OriginFilter f({"https://UI.example:3000/", "chrome-extension://abcdef"});
  EXPECT_TRUE(f.allows("https://ui.example:3000"));
  EXPECT_TRUE(f.allows("chrome-extension://abcdef"));
  EXPECT_TRUE(f.allows("http://localhost:8000"));
  EXPECT_FALSE(f.allows("https://ui.example:3001"));
  EXPECT_FALSE(f.allows("http://ui.example:3000"));
  EXPECT_TRUE(OriginFilter({"*"}).allows("https://anything.example"));
}

TEST(ServerAccess, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("Bearer sekret", "Bearer sekret"));
  EXPECT_FALSE(constant_time_equal("Bearer sekret", "Bearer sekreT"));
  EXPECT_FALSE(constant_time_equal("Bearer sekret", "Bearer sekret2"));
  EXPECT_FALSE(constant_time_equal("Bearer sekret", "Bearer sekre"));
  EXPECT_FALSE(constant_time_equal("Bearer sekret", ""));
  // a repeat of the key as long as what was sent must not pass
  EXPECT_FALSE(constant_time_equal("ab", "abab"));
  EXPECT_TRUE(constant_time_equal("", ""));
}

}  // namespace
}  // namespace wick::server
