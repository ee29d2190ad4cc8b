// Where proxy threads are pinned (transport/proxy_affinity.cc): every proxy of a host on its
// own core of the near set while there are cores for all, else the whole set; slots unique
// across the host's processes (lock files) and reused once released.
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
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

// A fresh lock-file directory per test, so that proxies of other test processes running at
// the same time (ctest -j) do not take the slots a test expects.
struct SlotDir {
  std::string path;
  SlotDir() {
    char t[] = "/tmp/mk-slots-XXXXXX";
    if (mkdtemp(t) != nullptr) path = t;
  }
  ~SlotDir() {
    if (!path.empty()) EXPECT_EQ(system(("rm -rf " + path).c_str()), 0);
  }
};

// One byte through a pipe, waiting at most 10 s. False on timeout or a closed pipe.
bool readByte(int fd, char* c) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 10000) == 1 && read(fd, c, 1) == 1;
}

}  // namespace

TEST(ProxyPin, SlotsAreUniqueAndReused) {
  SlotDir dir;
  ASSERT_FALSE(dir.path.empty());
  mktest::ScopedEnv env("MKERNEL_PROXY_SLOT_DIR", dir.path.c_str());
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

// Two processes of one host, each with a rank of the same comm or of two comms: a slot a
// live proxy of another process holds is skipped, and free again once that process is gone
// (however it ended: the kernel drops its lock).
TEST(ProxyPin, SlotsAreUniqueAcrossProcesses) {
  SlotDir dir;
  ASSERT_FALSE(dir.path.empty());
  mktest::ScopedEnv env("MKERNEL_PROXY_SLOT_DIR", dir.path.c_str());
  int up[2], down[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Holds slot 0 (rank 0 of 2 on the host) until the parent has looked.
    const char got = (char)proxyClaimSlot(0, 2);
    char c;
    if (write(up[1], &got, 1) != 1 || !readByte(down[0], &c)) _exit(2);
    _exit(0);  // exits holding the slot: the lock goes with the process
  }
  char held = -1;
  ASSERT_TRUE(readByte(up[0], &held)) << "child did not report its slot";
  EXPECT_EQ(held, 0);
  const int mine0 = proxyClaimSlot(0, 2);  // another comm's rank 0 of 2: 0 is taken
  const int mine1 = proxyClaimSlot(1, 2);  // rank 1 of 2: free
  EXPECT_EQ(mine0, 2);
  EXPECT_EQ(mine1, 1);
  const char go = 1;
  EXPECT_EQ(write(down[1], &go, 1), 1);
  int status = -1;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(proxyClaimSlot(0, 2), 0);  // the child is gone
  for (int s : {0, 1, 2}) proxyReleaseSlot(s);
  for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
}

// A process forked while it holds a slot (a data-loader worker) does not keep the slot locked
// after the parent released it: the child drops its copies of the lock files at fork.
TEST(ProxyPin, ForkedChildDoesNotKeepSlots) {
  SlotDir dir;
  ASSERT_FALSE(dir.path.empty());
  mktest::ScopedEnv env("MKERNEL_PROXY_SLOT_DIR", dir.path.c_str());
  ASSERT_EQ(proxyClaimSlot(0, 2), 0);
  int up[2], down[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Running (fork's handlers done); lives until the parent has claimed again.
    char c = 1;
    if (write(up[1], &c, 1) != 1) _exit(3);
    _exit(readByte(down[0], &c) ? 0 : 2);
  }
  char ready = 0;
  ASSERT_TRUE(readByte(up[0], &ready)) << "child did not start";
  proxyReleaseSlot(0);
  const int again = proxyClaimSlot(0, 2);
  EXPECT_EQ(again, 0) << "the forked child still holds slot 0";
  const char go = 1;
  EXPECT_EQ(write(down[1], &go, 1), 1);
  int status = -1;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  proxyReleaseSlot(again);
  for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
}

// Without a usable directory the slots are unique per process, as before: never an error.
TEST(ProxyPin, SlotsWithoutALockDirectory) {
  for (const char* d : {"", "/nonexistent-mkernel-dir/slots"}) {
    mktest::ScopedEnv env("MKERNEL_PROXY_SLOT_DIR", d);
    const int a = proxyClaimSlot(0, 2), b = proxyClaimSlot(0, 2), c = proxyClaimSlot(1, 2);
    EXPECT_EQ(a, 0) << d;
    EXPECT_EQ(b, 2) << d;
    EXPECT_EQ(c, 1) << d;
    for (int s : {a, b, c}) proxyReleaseSlot(s);
  }
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
