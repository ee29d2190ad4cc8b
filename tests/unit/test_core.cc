// Config parsing, the parameter table, logging and topology math (pure host code).
#include <cstring>
#include <vector>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <gtest/gtest.h>
#include <sstream>
#include <string>
#include <unistd.h>

#include "comm/config.h"
#include "base/debug.h"
#include "base/param.h"
#include "topo/topo.h"
#include "fused/core/fused_comm.h"

namespace {

TEST(Config, DefaultsAndOverrides) {
  mk::Config c;
  ASSERT_EQ(mk::configParse(nullptr, &c), ncclSuccess);
  EXPECT_TRUE(c.blocking);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.minCTAs = 2;
  cfg.maxCTAs = 16;
  cfg.commName = "trainer";
  ASSERT_EQ(mk::configParse(&cfg, &c), ncclSuccess);
  EXPECT_FALSE(c.blocking);
  EXPECT_EQ(c.minCTAs, 2);
  EXPECT_EQ(c.maxCTAs, 16);
  EXPECT_EQ(c.commName, "trainer");
}

TEST(Config, OlderShorterStructIsReadBySize) {
  // A caller compiled against an older nccl.h passes a smaller struct: fields past its size
  // must not be read (they are garbage here).
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.size = offsetof(ncclConfig_t, splitShare);
  cfg.version = NCCL_VERSION(2, 17, 1);
  cfg.maxCTAs = 8;
  cfg.splitShare = 12345;
  cfg.CTAPolicy = 77;  // out of range, but beyond the declared size
  mk::Config c;
  ASSERT_EQ(mk::configParse(&cfg, &c), ncclSuccess);
  EXPECT_EQ(c.maxCTAs, 8);
  EXPECT_FALSE(c.splitShare);
  EXPECT_EQ(c.ctaPolicy, 0);
}

TEST(Config, Inherit) {
  mk::Config parent;
  parent.blocking = false;
  parent.maxCTAs = 4;
  mk::Config child;
  ASSERT_EQ(mk::configInherit(nullptr, parent, &child), ncclSuccess);
  EXPECT_FALSE(child.blocking);
  EXPECT_EQ(child.maxCTAs, 4);
}

TEST(Params, EnvOverridesDefaultsAndBadValuesFallBack) {
  setenv("MKERNEL_EMULATE_NODES", "3", 1);
  mk::paramReset();
  EXPECT_EQ(MK_PARAM_INT(EmulateNodes), 3);
  setenv("MKERNEL_EMULATE_NODES", "three", 1);
  mk::paramReset();
  EXPECT_EQ(MK_PARAM_INT(EmulateNodes), 0);
  EXPECT_NE(std::string(mk::lastError()).find("MKERNEL_EMULATE_NODES"), std::string::npos);
  unsetenv("MKERNEL_EMULATE_NODES");
  setenv("MKERNEL_ALGO", "ring", 1);
  mk::paramReset();
  EXPECT_STREQ(MK_PARAM_STR(Algo), "ring");
  unsetenv("MKERNEL_ALGO");
  mk::paramReset();
  EXPECT_STREQ(MK_PARAM_STR(Algo), "");
  EXPECT_EQ(MK_PARAM_INT(BootstrapTimeoutS), 120);
}

TEST(Params, EveryParameterIsDocumentedInTheReadme) {
  std::ifstream in(std::string(MK_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  std::string readme = ss.str();
  for (int i = 0; i < static_cast<int>(mk::ParamId::kCount); i++) {
    const char* env = mk::paramInfo(static_cast<mk::ParamId>(i)).env;
    EXPECT_NE(readme.find(std::string("`") + env + "`"), std::string::npos)
        << env << " is not documented in README.md";
  }
}

TEST(Logging, DebugFileSubsysAndFormat) {
  char tmpl[] = "/tmp/mk_log_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string pattern = std::string(tmpl) + "/log.%h.%p";
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "^COLL", 1);
  setenv("NCCL_DEBUG_FILE", pattern.c_str(), 1);
  mk::logReset();
  mk::logSetThreadDevice(3);
  MK_INFO(mk::kInit, "hello %d", 42);
  MK_INFO(mk::kColl, "filtered out");
  MK_WARN("a warning");
  MK_WARN_ADVISORY("an advisory %d", 7);  // printed, but not the last error
  mk::logSetThreadDevice(-1);
  unsetenv("NCCL_DEBUG");
  unsetenv("NCCL_DEBUG_SUBSYS");
  unsetenv("NCCL_DEBUG_FILE");
  mk::logReset();
  char host[256] = {};
  gethostname(host, sizeof(host));
  if (char* dot = strchr(host, '.')) *dot = 0;
  std::string path = std::string(tmpl) + "/log." + host + "." + std::to_string(getpid());
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  std::string prefix = std::string(host) + ":" + std::to_string(getpid()) + ":";
  EXPECT_NE(text.find(prefix), std::string::npos) << text;
  EXPECT_NE(text.find("[3] mkernel INFO hello 42"), std::string::npos) << text;
  EXPECT_EQ(text.find("filtered out"), std::string::npos) << text;
  EXPECT_NE(text.find("mkernel WARN"), std::string::npos) << text;
  EXPECT_NE(text.find("WARN test_core.cc:"), std::string::npos) << text;
  EXPECT_NE(text.find("an advisory 7"), std::string::npos) << text;
  EXPECT_STREQ(mk::lastError(), "a warning");
  remove(path.c_str());
  rmdir(tmpl);
}

std::vector<mk::RankInfo> fakeRanks(int hosts, int perHost, int gpusPerHost) {
  std::vector<mk::RankInfo> v;
  for (int h = 0; h < hosts; h++)
    for (int i = 0; i < perHost; i++) {
      mk::RankInfo r{};
      r.hostHash = 1000 + h;
      r.pidHash = 77 + i;
      r.cudaDev = i % gpusPerHost;
      r.busId = 0x100 + (i % gpusPerHost);
      v.push_back(r);
    }
  return v;
}

TEST(Topo, RealHostsLocalRanksAndSharing) {
  auto info = fakeRanks(2, 4, 2);  // 2 hosts x 4 ranks, 2 GPUs each
  mk::Topo t;
  ASSERT_EQ(mk::topoCompute(info, 5, 0, &t), ncclSuccess);
  EXPECT_EQ(t.nNodes, 2);
  EXPECT_EQ(t.node, 1);
  EXPECT_EQ(t.localRank, 1);
  EXPECT_EQ(t.localRanks, 4);
  EXPECT_EQ(t.ranksOnMyDevice, 2);  // ranks 5 and 7 on GPU 1 of host 1
  EXPECT_EQ(t.indexOnMyDevice, 0);
  EXPECT_FALSE(t.virtualNodes);
}

// Topo::leastShare: the least SMs a rank gets over the comm's GPUs, the same on every rank
// whatever its own GPU holds (host 0: 3 ranks on a 132-SM GPU, 1 on another; host 1: 2 ranks
// on a 114-SM GPU -> min(44, 132, 57)).
TEST(Topo, LeastShareAlikeOnEveryRank) {
  std::vector<mk::RankInfo> info;
  auto add = [&](uint64_t host, int64_t bus, int sms) {
    mk::RankInfo r{};
    r.hostHash = host;
    r.pidHash = 7 + info.size();
    r.busId = bus;
    r.smCount = sms;
    info.push_back(r);
  };
  add(1, 0x100, 132);
  add(1, 0x100, 132);
  add(1, 0x200, 132);
  add(2, 0x100, 114);  // the same bus id on another host: another GPU
  add(1, 0x100, 132);
  add(2, 0x100, 114);
  for (int r = 0; r < (int)info.size(); ++r) {
    mk::Topo t;
    ASSERT_EQ(mk::topoCompute(info, r, 0, &t), ncclSuccess);
    EXPECT_EQ(t.leastShare, 44) << "rank " << r;
  }
  // Virtual nodes of one GPU: every rank on it.
  std::vector<mk::RankInfo> one(info.begin(), info.begin() + 2);
  mk::Topo t;
  ASSERT_EQ(mk::topoCompute(one, 1, 2, &t), ncclSuccess);
  EXPECT_EQ(t.leastShare, 66);
}

// The most ranks any live comm of this process put on a GPU: the largest among the registered,
// initialised comms on that bus id (a split's smaller halves do not lower it), the next
// largest once that comm is unregistered, 0 for a GPU with none; comms still initialising do
// not count. Leaves nothing registered (repeatable).
TEST(Comm, MostRanksOnDeviceOfLiveComms) {
  const int64_t bus = 0x7e57000001, other = 0x7e57000002;
  ncclComm world, pairA, pairB, elsewhere, starting;
  auto setUp = [](ncclComm* c, int64_t busId, int onDevice, mk::CommState st) {
    c->rank = 0;
    c->peerInfo.resize(1);
    c->peerInfo[0].busId = busId;
    c->topo.ranksOnMyDevice = onDevice;
    c->state.store(st);
    mk::commRegister(c);
  };
  EXPECT_EQ(mk::commMostRanksOnDevice(bus), 0);
  setUp(&world, bus, 4, mk::CommState::kReady);
  setUp(&pairA, bus, 2, mk::CommState::kReady);
  setUp(&pairB, bus, 2, mk::CommState::kReady);
  setUp(&elsewhere, other, 1, mk::CommState::kReady);
  setUp(&starting, bus, 8, mk::CommState::kInitializing);
  EXPECT_EQ(mk::commMostRanksOnDevice(bus), 4);
  EXPECT_EQ(mk::commMostRanksOnDevice(other), 1);
  mk::commUnregister(&world);
  EXPECT_EQ(mk::commMostRanksOnDevice(bus), 2);
  mk::commUnregister(&pairA);
  EXPECT_EQ(mk::commMostRanksOnDevice(bus), 2);
  for (ncclComm* c : {&pairB, &elsewhere, &starting}) mk::commUnregister(c);
  EXPECT_EQ(mk::commMostRanksOnDevice(bus), 0);
  EXPECT_EQ(mk::commMostRanksOnDevice(other), 0);
}

// A fused kernel's share of the GPU (fusedGpuShare) counts the live sibling comms of this
// process: a pair split from a 4-rank comm gets a quarter of the SMs while the parent lives, a
// half once it is gone; never below one SM. Leaves nothing registered.
TEST(Comm, FusedGpuShareCountsLiveSiblings) {
  const int64_t bus = 0x7e57000003;
  ncclComm world, pair;
  for (auto* c : {&world, &pair}) {
    c->rank = 0;
    c->peerInfo.resize(1);
    c->peerInfo[0].busId = bus;
    c->smCount = 132;
    c->state.store(mk::CommState::kReady);
  }
  world.topo.ranksOnMyDevice = 4;
  pair.topo.ranksOnMyDevice = 2;
  EXPECT_EQ(mk::fused::fusedGpuShare(&pair), 66);  // neither registered: its own ranks
  mk::commRegister(&world);
  mk::commRegister(&pair);
  EXPECT_EQ(mk::fused::fusedGpuShare(&pair), 33);
  EXPECT_EQ(mk::fused::fusedGpuShare(&world), 33);
  mk::commUnregister(&world);
  EXPECT_EQ(mk::fused::fusedGpuShare(&pair), 66);
  pair.smCount = 1;
  EXPECT_EQ(mk::fused::fusedGpuShare(&pair), 1);
  mk::commUnregister(&pair);
}

TEST(Topo, VirtualNodesSplitConsecutiveRanks) {
  auto info = fakeRanks(1, 8, 1);  // 8 ranks on one GPU
  mk::Topo t;
  ASSERT_EQ(mk::topoCompute(info, 6, 4, &t), ncclSuccess);
  EXPECT_TRUE(t.virtualNodes);
  EXPECT_EQ(t.nNodes, 4);
  EXPECT_EQ(t.node, 3);
  EXPECT_EQ(t.localRank, 0);
  EXPECT_EQ(t.localRanks, 2);
  EXPECT_EQ(t.ranksOnMyDevice, 8);
  ASSERT_EQ(mk::topoCompute(info, 2, 3, &t), ncclSuccess);  // uneven: 3,3,2
  EXPECT_EQ(t.nodeRanks[0].size() + t.nodeRanks[1].size() + t.nodeRanks[2].size(), 8u);
  EXPECT_EQ(t.rankToNode[2], 0);
  EXPECT_EQ(t.rankToNode[7], 2);
  ASSERT_EQ(mk::topoCompute(info, 0, 20, &t), ncclSuccess);  // clamped to the rank count
  EXPECT_EQ(t.nNodes, 8);
}

// Ranks of this comm on my GPU in my process: threads of one process count, other processes on
// the same GPU and ranks on other GPUs do not.
TEST(Topo, RanksInMyProcess) {
  auto info = fakeRanks(1, 6, 2);              // 6 ranks, GPUs 0,1,0,1,0,1
  for (int r : {0, 2}) info[r].pidHash = 500;  // ranks 0 and 2: one process on GPU 0
  info[1].pidHash = 500;                       // same process, GPU 1
  mk::Topo t;
  ASSERT_EQ(mk::topoCompute(info, 2, 0, &t), ncclSuccess);
  EXPECT_EQ(t.ranksOnMyDevice, 3);  // ranks 0, 2, 4
  EXPECT_EQ(t.ranksInMyProcess, 2);
  EXPECT_EQ(t.inMyProcess, (std::vector<uint8_t>{1, 0, 1, 0, 0, 0}));
  ASSERT_EQ(mk::topoCompute(info, 4, 0, &t), ncclSuccess);
  EXPECT_EQ(t.ranksInMyProcess, 1);
  ASSERT_EQ(mk::topoCompute(info, 1, 0, &t), ncclSuccess);
  EXPECT_EQ(t.ranksInMyProcess, 1);
}

// When a process's rank streams can share a hardware queue: more ranks than
// CUDA_DEVICE_MAX_CONNECTIONS (8 when unset, at most 32), or 2 and more under MPS without the
// variable; the fix named fits the count.
TEST(Topo, QueueHint) {
  auto hint = [](int n, bool mps, const char* env) { return mk::topoQueueHint(n, mps, env); };
  auto has = [](const std::string& m, const char* s) { return m.find(s) != std::string::npos; };
  EXPECT_EQ(hint(1, true, "1"), "");
  EXPECT_EQ(hint(8, false, nullptr), "");
  EXPECT_TRUE(has(hint(9, false, nullptr), "(unset: CUDA's default) gives its streams 8"))
      << hint(9, false, nullptr);
  EXPECT_TRUE(has(hint(9, false, nullptr), "at least 9 before")) << hint(9, false, nullptr);
  EXPECT_TRUE(
      has(hint(2, false, "1"), "CUDA_DEVICE_MAX_CONNECTIONS gives its streams 1 hardware queue:"))
      << hint(2, false, "1");
  EXPECT_EQ(hint(3, false, "4"), "");
  EXPECT_TRUE(has(hint(2, true, nullptr), "under CUDA MPS")) << hint(2, true, nullptr);
  EXPECT_TRUE(has(hint(2, true, nullptr), "at least 2 before")) << hint(2, true, nullptr);
  EXPECT_EQ(hint(2, true, "2"), "");
  EXPECT_EQ(hint(3, true, "32"), "");
  EXPECT_TRUE(has(hint(3, true, "2"), "at least 3")) << hint(3, true, "2");
  EXPECT_EQ(hint(3, false, "abc"), "");                    // not a number: unset
  EXPECT_TRUE(has(hint(3, true, "0"), "under CUDA MPS"));  // not positive: unset
  EXPECT_TRUE(has(hint(9, false, ""), "at least 9"));
  EXPECT_EQ(hint(32, false, "1000"), "");  // CUDA's cap of 32 queues suffices for 32
  EXPECT_TRUE(has(hint(40, false, "1000"), "gives its streams 32 hardware queues"))
      << hint(40, false, "1000");
  EXPECT_TRUE(has(hint(40, false, "1000"), "run at most 32 ranks per process"))
      << hint(40, false, "1000");
}

TEST(Topo, HashesAreStable) {
  EXPECT_EQ(mk::hostHash(), mk::hostHash());
  EXPECT_EQ(mk::pidHash(), mk::pidHash());
}

}  // namespace
