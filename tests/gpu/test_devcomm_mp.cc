// The device communication API with ranks in several processes sharing GPU 0: local peers
// in other processes are reached through P2P windows imported from POSIX fds, other nodes
// through each process's own proxies and host-pinned windows. Each child process is this
// binary running only DevCommChild.Run (exec'd: fork after CUDA initialisation is not
// allowed). Without CUDA MPS the kernels of different processes are time-sliced: correct,
// only slower, hence the generous bounds.
#include <cstdint>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "comm/comm.h"
#include "gpu/test_devcomm_util.h"
#include "transport/net_state.h"

extern char** environ;

using namespace dctest;

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kWindow = 2 << 20;

// "nProcs perProc procIndex nodes seed" in MKTEST_DC_CHILD, the unique id in MKTEST_DC_ID.
std::string runChildren(int nProcs, int perProc, int nodes) {
  // The environment first: the unique id's bootstrap interface follows NCCL_SOCKET_IFNAME.
  TestEnv env(nodes, kWindow, 0, /*timeoutMs=*/120000);
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return "ncclGetUniqueId failed";
  std::string hex;
  for (size_t i = 0; i < sizeof(id.internal); i++) {
    char b[3];
    snprintf(b, sizeof(b), "%02x", (unsigned char)id.internal[i]);
    hex += b;
  }
  uint64_t seed = mktest::testSeed();
  std::vector<pid_t> pids;
  for (int p = 0; p < nProcs; p++) {
    char spec[160];
    snprintf(spec, sizeof(spec), "MKTEST_DC_CHILD=%d %d %d %d %llu", nProcs, perProc, p, nodes,
             (unsigned long long)seed);
    pid_t pid = mktest::spawnSelf("DevCommChild.Run", {spec, "MKTEST_DC_ID=" + hex});
    if (pid < 0) return "fork failed";
    pids.push_back(pid);
  }
  return mktest::waitChildren(pids, 400);
}

// Body of a child: its ranks (threads of this process) join the comm, run two exchange
// iterations of the whole clique, and check what they received.
std::string childMain(const char* spec) {
  int nProcs = 0, perProc = 0, p = 0, nodes = 0;
  unsigned long long seed = 0;
  if (sscanf(spec, "%d %d %d %d %llu", &nProcs, &perProc, &p, &nodes, &seed) != 5)
    return std::string("bad MKTEST_DC_CHILD: ") + spec;
  const char* hex = getenv("MKTEST_DC_ID");
  ncclUniqueId id;
  if (!hex || strlen(hex) != 2 * sizeof(id.internal)) return "bad MKTEST_DC_ID";
  for (size_t i = 0; i < sizeof(id.internal); i++) {
    unsigned v = 0;
    sscanf(hex + 2 * i, "%2x", &v);
    id.internal[i] = (char)v;
  }
  if (cudaSetDevice(0) != cudaSuccess) return "cudaSetDevice(0) failed";
  const int n = nProcs * perProc;
  std::vector<int> mine;
  for (int t = 0; t < perProc; t++) mine.push_back(p * perProc + t);
  Ranks r;
  r.n = n;
  r.comms.assign(n, nullptr);
  r.streams.assign(n, nullptr);
  ncclGroupStart();
  for (int rank : mine) ncclCommInitRank(&r.comms[rank], n, id, rank);
  ncclResult_t res = ncclGroupEnd();
  if (res != ncclSuccess)
    return std::string("ncclCommInitRank: ") + ncclGetErrorString(res) + ": " +
           ncclGetLastError(nullptr);
  cudaSetDevice(0);
  for (int rank : mine) cudaStreamCreateWithFlags(&r.streams[rank], cudaStreamNonBlocking);
  r.wired = r.comms[mine[0]]->net != nullptr;
  if (!r.wired) {
    std::vector<ncclResult_t> rs(n, ncclSuccess);
    std::vector<std::thread> th;
    for (int rank : mine)
      th.emplace_back([&, rank] {
        cudaSetDevice(0);
        rs[rank] = mk::netInit(r.comms[rank]);
      });
    for (auto& t : th) t.join();
    for (int rank : mine)
      if (rs[rank] != ncclSuccess) {
        r.broken = true;
        return "netInit of rank " + std::to_string(rank) + " failed: " + ncclGetLastError(nullptr);
      }
  }
  for (int rank : mine) {
    mk::NetHostView hv;
    if (mk::netHostView(r.comms[rank], &hv) != ncclSuccess) return "no net state";
    if (hv.nProxyPeers != n - n / nodes)
      return "rank " + std::to_string(rank) + ": " + std::to_string(hv.nProxyPeers) +
             " proxy peers (P2P windows of other processes not mapped?)";
  }
  for (int it = 0; it < 2; it++) {
    Exchange x = makeExchange(n, kWindow, seed, it, false);
    std::vector<Launch> ls(n);
    for (int rank : mine) {
      std::string e = startPlan(r, rank, x.plans[rank], &ls[rank]);
      if (!e.empty()) {
        r.broken = true;
        return "rank " + std::to_string(rank) + ": " + e;
      }
    }
    std::string err;
    auto t0 = Clock::now();
    for (int rank : mine) {
      while (cudaStreamQuery(r.streams[rank]) == cudaErrorNotReady && err.empty()) {
        std::string m;
        ncclResult_t a = asyncError(r.comms[rank], &m);
        if (a != ncclSuccess && a != ncclInProgress)
          err = "rank " + std::to_string(rank) + ": " + ncclGetErrorString(a) + ": " + m;
        else if (Clock::now() - t0 > std::chrono::seconds(240))
          err = "rank " + std::to_string(rank) + ": kernel still running after 240 s";
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    if (!err.empty()) {
      r.broken = true;
      return "iteration " + std::to_string(it) + ": " + err;
    }
    std::vector<std::vector<uint8_t>> outs(n);
    for (int rank : mine) {
      std::vector<int> st;
      std::string e = finishPlan(ls[rank], &outs[rank], &st);
      for (size_t b = 0; b < st.size() && e.empty(); b++)
        if (st[b]) e = "CTA " + std::to_string(b) + " failed at step " + std::to_string(st[b]);
      if (!e.empty()) {
        r.broken = true;
        return "rank " + std::to_string(rank) + ": " + e;
      }
    }
    std::string bad = checkExchange(x, outs, /*onlyPresent=*/true);
    if (!bad.empty()) return "iteration " + std::to_string(it) + ":\n" + bad;
  }
  return "";
}

TEST(DevCommChild, Run) {
  const char* spec = getenv("MKTEST_DC_CHILD");
  if (!spec) GTEST_SKIP() << "helper of the DevCommProcs tests (runs only in their children)";
  EXPECT_EQ(childMain(spec), "");
}

// 4 processes, 2 virtual nodes: local peers in another process (fd-imported P2P windows)
// and remote peers through the proxies.
TEST(DevCommProcs, FourProcsTwoNodes) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(runChildren(4, 1, 2), "");
}

// 2 processes x 2 threads, 2 virtual nodes: every node is one process; all inter-process
// traffic is inter-node.
TEST(DevCommProcs, TwoProcsTwoThreadsTwoNodes) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(runChildren(2, 2, 2), "");
}

}  // namespace
