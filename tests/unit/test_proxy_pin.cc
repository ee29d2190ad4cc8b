// Where proxy threads are pinned (transport/proxy_affinity.cc): every proxy of a host on its
// own core of the near set while there are cores for all, else the whole set; slots unique
// per process and reused once released.
#include <sched.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "transport/proxy.h"

using namespace mk;

namespace {

// The CPUs this process may run on, as a list in hwloc's form ("0-3,8"): a near set every
// host has.
std::string allowedList() {
  cpu_set_t s;
  CPU_ZERO(&s);
  if (sched_getaffinity(0, sizeof(s), &s) != 0) return "";
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, &s)) continue;
    int e = c;
    while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &s)) e++;
    if (!out.empty()) out += ",";
    out += std::to_string(c) + (e > c ? "-" + std::to_string(e) : "");
    c = e;
  }
  return out;
}

bool contains(const std::vector<int>& cpus, int c) {
  for (int x : cpus)
    if (x == c) return true;
  return false;
}

std::vector<int> allowedCpus() {
  cpu_set_t s;
  CPU_ZERO(&s);
  std::vector<int> v;
  if (sched_getaffinity(0, sizeof(s), &s) != 0) return v;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &s)) v.push_back(c);
  return v;
}

bool isOneCpu(const std::string& l) {
  return !l.empty() && l.find_first_of(",-") == std::string::npos;
}

}  // namespace

TEST(ProxyPin, SlotsAreUniqueAndReused) {
  // Two ranks of one host in this process (one per GPU), then a second comm of both.
  const int a = proxyClaimSlot(0, 2), b = proxyClaimSlot(1, 2);
  const int c = proxyClaimSlot(0, 2), d = proxyClaimSlot(1, 2);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(c, 2);
  EXPECT_EQ(d, 3);
  proxyReleaseSlot(a);
  EXPECT_EQ(proxyClaimSlot(0, 2), 0);  // freed: taken again
  EXPECT_EQ(proxyClaimSlot(0, 2), 4);  // 0 and 2 held
  EXPECT_EQ(proxyClaimSlot(5, 8), 5);  // another comm's index: its own
  for (int s : {0, 1, 2, 3, 4, 5}) proxyReleaseSlot(s);
  EXPECT_EQ(proxyClaimSlot(-1, 0), 0);  // nonsense in: slot 0, stride 1
  EXPECT_EQ(proxyClaimSlot(-1, 0), 1);
  proxyReleaseSlot(0);
  proxyReleaseSlot(1);
}

TEST(ProxyPin, OneCorePerSlotThenTheWholeSet) {
  const std::string near = allowedList();
  ASSERT_FALSE(near.empty());
  EXPECT_EQ(proxyPinChoice(near, 0, 0), "");     // mode 0: not pinned
  EXPECT_EQ(proxyPinChoice(near, 0, 1), near);   // mode 1: the whole near set
  EXPECT_EQ(proxyPinChoice(near, -1, 2), near);  // no slot: the whole set
  std::set<std::string> seen;
  int slot = 0;
  for (; slot < 4096; slot++) {
    const std::string c = proxyPinChoice(near, slot, 2);
    if (!isOneCpu(c)) {
      EXPECT_EQ(c, near) << "slot " << slot << " past the cores: the whole set";
      break;
    }
    EXPECT_TRUE(seen.insert(c).second) << "slot " << slot << " took CPU " << c << " again";
    EXPECT_TRUE(contains(allowedCpus(), std::stoi(c))) << "CPU " << c << " outside " << near;
  }
  EXPECT_GE(slot, 1) << "slot 0 must get one core";
  EXPECT_LE((size_t)slot, seen.size());
  // Counted from the end of the set: slot 0 is its last core, not CPU 0 (when there are two).
  if (slot >= 2) EXPECT_NE(proxyPinChoice(near, 0, 2), "0");
  // Outside what the process may use: nothing.
  EXPECT_EQ(proxyPinChoice("100000", 0, 2), "");
}

// A thread bound by the user (taskset, a launcher) keeps its proxy inside that binding: the
// one CPU it may use, whether or not the near set holds it.
TEST(ProxyPin, StaysInsideTheInheritedBinding) {
  const std::vector<int> cpus = allowedCpus();
  ASSERT_FALSE(cpus.empty());
  const int c = cpus.front();  // not the core slot 0 takes without the binding (the last)
  const std::string near = allowedList();  // this thread's: every allowed CPU
  std::string inside, outside, nearAll, mode1;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) return;
    inside = proxyPinChoice(near, 0, 2);
    nearAll = proxyPinChoice(near, 1, 2);  // a slot past the one core: that core still
    mode1 = proxyPinChoice(near, 0, 1);    // mode 1 ignores the binding, as before
    if (cpus.size() > 1) outside = proxyPinChoice(std::to_string(cpus.back()), 0, 2);
  });
  t.join();
  EXPECT_EQ(inside, std::to_string(c));
  EXPECT_EQ(nearAll, std::to_string(c));
  EXPECT_EQ(mode1, near);
  if (cpus.size() > 1) EXPECT_EQ(outside, std::to_string(c)) << "a near set outside the binding";
}
