// Interface selection: NCCL_SOCKET_IFNAME grammar and the default policy, on fake lists.
#include <gtest/gtest.h>

#include "common/test_util.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "bootstrap/ifaces.h"
#include "base/param.h"

using namespace mk;

namespace {

NetIf mkIf(const char* name, const char* addr, const char* mask = nullptr) {
  NetIf i;
  i.name = name;
  std::string a = addr;
  std::string s = a.find(':') != std::string::npos ? "[" + a + "]:0" : a + ":0";
  EXPECT_EQ(socketAddressFromString(s.c_str(), &i.addr), ncclSuccess) << s;
  if (mask) {
    std::string m = std::string(mask).find(':') != std::string::npos
                        ? "[" + std::string(mask) + "]:0"
                        : std::string(mask) + ":0";
    EXPECT_EQ(socketAddressFromString(m.c_str(), &i.mask), ncclSuccess);
  }
  return i;
}

std::string names(const std::vector<NetIf>& v) {
  std::string s;
  for (auto& i : v) {
    char buf[kSocketAddrStrLen];
    s += (s.empty() ? "" : ",") + i.name + "=" + socketAddressToString(&i.addr, buf, sizeof(buf));
  }
  return s;
}

// Sets (or unsets) an env variable for one test and forgets cached params both ways.
using mktest::ScopedEnv;

}  // namespace

TEST(Ifaces, NameMatchingTable) {
  struct Case {
    const char* spec;
    const char* name;
    bool match;
  } cases[] = {
      {"", "eth0", true},
      {"eth", "eth0", true},
      {"eth", "ib0", false},
      {"eth,ib", "ib0", true},
      {"eth,ib", "lo", false},
      {"^docker,lo", "lo", false},
      {"^docker,lo", "docker0", false},
      {"^docker,lo", "eth0", true},
      {"^docker,lo", "lowpan0", false},
      {"=eth0", "eth0", true},
      {"=eth0", "eth01", false},
      {"=eth", "eth0", false},
      {"=eth0,ib1", "ib1", true},
      {"^=eth0", "eth0", false},
      {"^=eth0", "eth01", true},
      {"^=eth0", "ib0", true},
      {"eth0", "eth0.100", true},
      {",,eth", "eth1", true},
      {"^", "eth0", true},
      {"=", "eth0", false},
  };
  for (const Case& c : cases)
    EXPECT_EQ(ifNameMatches(c.spec, c.name), c.match) << "spec '" << c.spec << "' name " << c.name;
}

TEST(Ifaces, ParseFamily) {
  EXPECT_EQ(ifParseFamily(""), AF_UNSPEC);
  EXPECT_EQ(ifParseFamily(nullptr), AF_UNSPEC);
  EXPECT_EQ(ifParseFamily("AF_INET"), AF_INET);
  EXPECT_EQ(ifParseFamily("AF_INET6"), AF_INET6);
  EXPECT_EQ(ifParseFamily("inet"), -1);
}

TEST(Ifaces, DefaultPolicy) {
  std::vector<NetIf> all = {mkIf("lo", "127.0.0.1"),       mkIf("lo", "::1"),
                            mkIf("docker0", "172.17.0.1"), mkIf("eth0", "fe80::1"),
                            mkIf("eth0", "2001:db8::2"),   mkIf("eth0", "10.0.0.2"),
                            mkIf("ib0", "192.168.1.5"),    mkIf("eth1", "10.9.0.2")};
  // IB first, as NCCL does.
  EXPECT_EQ(names(ifSelect(all, "", AF_UNSPEC, nullptr, -1)), "ib0=192.168.1.5:0");
  std::vector<NetIf> noIb;
  for (auto& i : all)
    if (i.name != "ib0") noIb.push_back(i);
  // Not docker, not lo; one address per interface, IPv4 preferred, in first-seen order.
  EXPECT_EQ(names(ifSelect(noIb, "", AF_UNSPEC, nullptr, -1)), "eth0=10.0.0.2:0,eth1=10.9.0.2:0");
  EXPECT_EQ(names(ifSelect(noIb, "", AF_UNSPEC, nullptr, 1)), "eth0=10.0.0.2:0");
  // AF_INET6: the global address beats the link-local one that came first.
  EXPECT_EQ(names(ifSelect(noIb, nullptr, AF_INET6, nullptr, -1)), "eth0=[2001:db8::2]:0");
  // Only docker and lo: docker; only lo: lo.
  std::vector<NetIf> dockLo = {all[0], all[1], all[2]};
  EXPECT_EQ(names(ifSelect(dockLo, "", AF_UNSPEC, nullptr, -1)), "docker0=172.17.0.1:0");
  std::vector<NetIf> lo = {all[0], all[1]};
  EXPECT_EQ(names(ifSelect(lo, "", AF_UNSPEC, nullptr, -1)), "lo=127.0.0.1:0");
  EXPECT_EQ(names(ifSelect(lo, "", AF_INET6, nullptr, -1)), "lo=[::1]:0");
  EXPECT_TRUE(ifSelect({}, "", AF_UNSPEC, nullptr, -1).empty());
}

TEST(Ifaces, UserSpecOverridesPolicy) {
  std::vector<NetIf> all = {mkIf("lo", "127.0.0.1"), mkIf("docker0", "172.17.0.1"),
                            mkIf("eth0", "10.0.0.2"), mkIf("eth10", "10.0.1.2"),
                            mkIf("ib0", "192.168.1.5")};
  EXPECT_EQ(names(ifSelect(all, "lo", AF_UNSPEC, nullptr, -1)), "lo=127.0.0.1:0");
  EXPECT_EQ(names(ifSelect(all, "eth", AF_UNSPEC, nullptr, -1)),
            "eth0=10.0.0.2:0,eth10=10.0.1.2:0");
  EXPECT_EQ(names(ifSelect(all, "=eth0", AF_UNSPEC, nullptr, -1)), "eth0=10.0.0.2:0");
  EXPECT_EQ(names(ifSelect(all, "^docker,lo,ib", AF_UNSPEC, nullptr, -1)),
            "eth0=10.0.0.2:0,eth10=10.0.1.2:0");
  EXPECT_EQ(names(ifSelect(all, "^=eth0", AF_UNSPEC, nullptr, 2)),
            "lo=127.0.0.1:0,docker0=172.17.0.1:0");
  // A user spec matching nothing finds nothing (no silent fallback).
  EXPECT_TRUE(ifSelect(all, "=eth", AF_UNSPEC, nullptr, -1).empty());
  EXPECT_TRUE(ifSelect(all, "eth", AF_INET6, nullptr, -1).empty());
}

TEST(Ifaces, CommIdSubnetGuidesTheChoice) {
  std::vector<NetIf> all = {mkIf("lo", "127.0.0.1", "255.0.0.0"),
                            mkIf("eth0", "10.0.0.2", "255.255.255.0"),
                            mkIf("eth1", "10.1.0.2", "255.255.0.0"),
                            mkIf("eth2", "2001:db8:1::2", "ffff:ffff:ffff:ffff::")};
  SocketAddress root;
  ASSERT_EQ(socketAddressFromString("10.1.200.7:5000", &root), ncclSuccess);
  EXPECT_EQ(names(ifSelect(all, "", AF_UNSPEC, &root, -1)), "eth1=10.1.0.2:0");
  ASSERT_EQ(socketAddressFromString("[2001:db8:1::99]:5000", &root), ncclSuccess);
  EXPECT_EQ(names(ifSelect(all, "", AF_UNSPEC, &root, -1)), "eth2=[2001:db8:1::2]:0");
  ASSERT_EQ(socketAddressFromString("127.0.0.1:5000", &root), ncclSuccess);
  EXPECT_EQ(names(ifSelect(all, "", AF_UNSPEC, &root, -1)), "lo=127.0.0.1:0");
  // No subnet matches: the normal order applies.
  ASSERT_EQ(socketAddressFromString("172.16.0.1:5000", &root), ncclSuccess);
  EXPECT_EQ(names(ifSelect(all, "", AF_UNSPEC, &root, 1)), "eth0=10.0.0.2:0");
  EXPECT_TRUE(ifSameSubnet(
      all[1], *[] {
        static SocketAddress a;
        socketAddressFromString("10.0.0.200:1", &a);
        return &a;
      }()));
}

TEST(Ifaces, RealHostAndEnvironment) {
  std::vector<NetIf> all;
  ASSERT_EQ(ifList(&all), ncclSuccess);
  ASSERT_FALSE(all.empty());
  bool haveLo = false;
  for (auto& i : all) haveLo |= i.name == "lo";
  {
    ScopedEnv unsetIf("NCCL_SOCKET_IFNAME", nullptr);
    ScopedEnv unsetFam("NCCL_SOCKET_FAMILY", nullptr);
    ScopedEnv unsetId("NCCL_COMM_ID", nullptr);
    SocketAddress a;
    std::string name;
    ASSERT_EQ(ifBootstrapAddress(&a, &name), ncclSuccess);
    EXPECT_FALSE(name.empty());
    EXPECT_EQ(socketAddressPort(&a), 0);
  }
  if (haveLo) {
    ScopedEnv e("NCCL_SOCKET_IFNAME", "=lo");
    ScopedEnv f("NCCL_SOCKET_FAMILY", "AF_INET");
    SocketAddress a;
    std::string name;
    ASSERT_EQ(ifBootstrapAddress(&a, &name), ncclSuccess);
    EXPECT_EQ(name, "lo");
    char buf[kSocketAddrStrLen];
    EXPECT_STREQ(socketAddressToString(&a, buf, sizeof(buf)), "127.0.0.1:0");
  }
  {
    ScopedEnv e("NCCL_SOCKET_IFNAME", "=no_such_interface0");
    std::vector<NetIf> out;
    EXPECT_EQ(ifFind(&out, 4), ncclSystemError);
  }
}
