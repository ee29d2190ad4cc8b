// Helpers of the peer-memory GPU tests (declared in each test file's pmtest block):
// hand-made communicators over a real bootstrap (the comm layer is not needed), rank
// threads, child processes started with exec (a fresh CUDA state), and the checks that
// the thread and process variants share.
#define MK_PEER_MEM_INTERNAL 1
#include <cstdint>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <cuda_runtime.h>
#include <functional>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "common/test_util.h"
#include "comm/comm.h"
#include "base/param.h"
#include "topo/topo.h"
#include "transport/peer_mem.h"

extern char** environ;

namespace pmtest {

using RankBody = std::function<std::string(ncclComm* comm)>;

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string cudaErr(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

#define PM_CUDA(call)                                 \
  do {                                                \
    cudaError_t e_ = (call);                          \
    if (e_ != cudaSuccess) return cudaErr(#call, e_); \
  } while (0)
#define PM_NCCL(call)                                                               \
  do {                                                                              \
    ncclResult_t r_ = (call);                                                       \
    if (r_ != ncclSuccess) return std::string(#call) + " -> " + std::to_string(r_); \
  } while (0)

}  // namespace

// Byte i of the pattern of (seed, rank), starting at byte `offset` of the buffer.
void fillPattern(uint8_t* out, size_t n, uint64_t seed, int rank, size_t offset) {
  for (size_t i = 0; i < n; i++) {
    size_t b = offset + i;
    uint64_t w = splitmix(seed ^ ((uint64_t)(rank + 1) << 48) ^ (b / 8));
    out[i] = (uint8_t)(w >> (8 * (b % 8)));
  }
}

// "" when dev[0..n) (device memory, read with cudaMemcpy) holds the pattern.
std::string checkPattern(const void* dev, size_t n, uint64_t seed, int rank, size_t offset,
                         const char* what) {
  std::vector<uint8_t> got(n), want(n);
  // Device-to-device first: the copy engine of this GPU reads through the peer mapping.
  void* scratch = nullptr;
  PM_CUDA(cudaMalloc(&scratch, n));
  cudaError_t e = mktest::syncMemcpy(scratch, dev, n, cudaMemcpyDeviceToDevice);
  if (e == cudaSuccess) e = mktest::syncMemcpy(got.data(), scratch, n, cudaMemcpyDeviceToHost);
  cudaFree(scratch);
  if (e != cudaSuccess) return cudaErr(what, e);
  fillPattern(want.data(), n, seed, rank, offset);
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      if (first == n) first = i;
      bad++;
    }
  if (bad == 0) return "";
  char msg[256];
  snprintf(msg, sizeof(msg), "%s: %zu of %zu bytes differ (first at %zu: got %u want %u)", what,
           bad, n, first, got[first], want[first]);
  return msg;
}

ncclResult_t makeComm(mk::Bootstrap* b, int rank, int nRanks, int dev, uint64_t commHash,
                      int emulateNodes, ncclComm** out) {
  ncclComm* c = new ncclComm();
  c->rank = rank;
  c->nRanks = nRanks;
  c->cudaDev = dev;
  c->commHash = commHash;
  c->abortFlag = new uint32_t(0);
  c->bootstrap = b;
  c->peerInfo.assign(nRanks, mk::RankInfo{});
  ncclResult_t r = mk::topoLocalInfo(c, &c->peerInfo[rank]);
  if (r == ncclSuccess) r = mk::bootstrapAllGather(b, c->peerInfo.data(), sizeof(mk::RankInfo));
  if (r == ncclSuccess) r = mk::topoCompute(c->peerInfo, rank, emulateNodes, &c->topo);
  if (r != ncclSuccess) {
    delete c->abortFlag;
    delete c;
    return r;
  }
  *out = c;
  return ncclSuccess;
}

void freeComm(ncclComm* c) {
  if (!c) return;
  mk::peerMemFini(c);
  mk::bootstrapClose(c->bootstrap);
  delete c->abortFlag;
  delete c;
}

std::vector<std::string> runRanks(const ncclUniqueId& id, int nRanks, const std::vector<int>& ranks,
                                  uint64_t commHash, int emulateNodes, const RankBody& body) {
  std::vector<std::string> errs(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); i++) {
    threads.emplace_back([&, i] {
      int rank = ranks[i];
      std::string& err = errs[i];
      if (cudaSetDevice(0) != cudaSuccess) {
        err = "cudaSetDevice(0) failed";
        return;
      }
      mk::Bootstrap* b = nullptr;
      ncclResult_t r = mk::bootstrapInit(&id, 1, rank, nRanks, nullptr, &b);
      if (r != ncclSuccess) {
        err = "bootstrapInit -> " + std::to_string(r);
        return;
      }
      ncclComm* c = nullptr;
      r = makeComm(b, rank, nRanks, 0, commHash, emulateNodes, &c);
      if (r != ncclSuccess) {
        err = "makeComm -> " + std::to_string(r);
        mk::bootstrapClose(b);
        return;
      }
      err = body(c);
      if (!err.empty()) err = "rank " + std::to_string(rank) + ": " + err;
      freeComm(c);
    });
  }
  for (auto& t : threads) t.join();
  return errs;
}

std::string joinErrors(const std::vector<std::string>& errs) {
  std::string all;
  for (const auto& e : errs)
    if (!e.empty()) all += e + "\n";
  return all;
}

// The workspace check: zero-filled, pointer tables right, every byte of every peer's
// workspace readable here, and every peer's workspace writable from here.
std::string workspaceCheck(ncclComm* c, uint64_t seed) {
  mk::PeerMem* pm = c->peerMem;
  if (!pm) return "no peerMem";
  const mk::Topo& t = c->topo;
  if ((int)pm->peers.size() != t.localRanks) return "peers has the wrong size";
  if (pm->peers[t.localRank] != pm->local) return "peers[localRank] != local";
  if (pm->bytes < (size_t)mk::paramInt(mk::ParamId::WorkspaceBytes)) return "workspace too small";
  std::vector<void*> devTable(t.localRanks);
  PM_CUDA(mktest::syncMemcpy(devTable.data(), pm->peersDev, sizeof(void*) * t.localRanks,
                             cudaMemcpyDeviceToHost));
  if (devTable != pm->peers) return "peersDev differs from peers";
  for (int l = 0; l < t.localRanks; l++)
    if (!pm->peers[l]) return "null peer pointer";
  size_t n = pm->bytes;
  {
    std::vector<uint8_t> h(n);
    PM_CUDA(mktest::syncMemcpy(h.data(), pm->local, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
      if (h[i] != 0) return "workspace not zero-filled at byte " + std::to_string(i);
    fillPattern(h.data(), n, seed, c->rank, 0);
    PM_CUDA(mktest::syncMemcpy(pm->local, h.data(), n, cudaMemcpyHostToDevice));
  }
  PM_NCCL(mk::bootstrapBarrier(c->bootstrap));
  for (int l = 0; l < t.localRanks; l++) {
    int peer = t.nodeRanks[t.node][l];
    std::string what = "workspace of rank " + std::to_string(peer);
    std::string e = checkPattern(pm->peers[l], n, seed, peer, 0, what.c_str());
    if (!e.empty()) return e;
  }
  PM_NCCL(mk::bootstrapBarrier(c->bootstrap));
  // Each rank writes its slot of every peer's workspace (a memset kernel on this GPU).
  const size_t slot = 4096;
  cudaStream_t s;
  PM_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int l = 0; l < t.localRanks; l++) {
    cudaError_t e =
        cudaMemsetAsync((char*)pm->peers[l] + t.localRank * slot, 0x40 + t.localRank, slot, s);
    if (e != cudaSuccess) {
      cudaStreamDestroy(s);
      return cudaErr("cudaMemsetAsync on a peer workspace", e);
    }
  }
  cudaError_t e = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  if (e != cudaSuccess) return cudaErr("cudaStreamSynchronize", e);
  PM_NCCL(mk::bootstrapBarrier(c->bootstrap));
  std::vector<uint8_t> h(slot * t.localRanks);
  PM_CUDA(mktest::syncMemcpy(h.data(), pm->local, h.size(), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < h.size(); i++)
    if (h[i] != (uint8_t)(0x40 + i / slot))
      return "byte " + std::to_string(i) + " written by local rank " + std::to_string(i / slot) +
             " is wrong";
  PM_NCCL(mk::bootstrapBarrier(c->bootstrap));
  return "";
}

// Checks a lookup result against the peers' patterns.
std::string lookupCheck(ncclComm* c, const void* ptr, size_t bytes, size_t offset, uint64_t seed,
                        bool wantOk, const char* what) {
  bool ok = !wantOk;
  std::vector<void*> ptrs;
  PM_NCCL(mk::peerMemLookup(c, ptr, bytes, &ok, &ptrs));
  if (ok != wantOk)
    return std::string(what) + ": lookup says " + (ok ? "ok" : "not ok") + ", expected " +
           (wantOk ? "ok" : "not ok");
  if (!ok) return "";
  const mk::Topo& t = c->topo;
  if ((int)ptrs.size() != t.localRanks) return std::string(what) + ": wrong pointer count";
  if (ptrs[t.localRank] != ptr) return std::string(what) + ": own pointer differs";
  for (int l = 0; l < t.localRanks; l++) {
    int peer = t.nodeRanks[t.node][l];
    std::string w = std::string(what) + " through rank " + std::to_string(peer) + "'s pointer";
    std::string e = checkPattern(ptrs[l], bytes, seed, peer, offset, w.c_str());
    if (!e.empty()) return e;
  }
  return "";
}

// Register/lookup with a cudaMalloc buffer and an ncclMemAlloc buffer (regions that start
// inside their allocations), cache hits, partial registration and deregistration.
std::string registerCheck(ncclComm* c, uint64_t seed) {
  const uint64_t seedA = seed ^ 0xA, seedB = seed ^ 0xB;
  const size_t sizeA = (1 << 20) + (512 << 10), sizeB = (3 << 20) + 5;
  void *A = nullptr, *B = nullptr, *C = nullptr;
  PM_CUDA(cudaMalloc(&A, sizeA));
  PM_NCCL(mk::memAlloc(&B, sizeB));
  PM_CUDA(cudaMalloc(&C, 1 << 20));
  std::string err;
  void *hA = nullptr, *hB = nullptr, *hC = nullptr;
  auto fill = [&](void* p, size_t n, uint64_t s) -> std::string {
    std::vector<uint8_t> h(n);
    fillPattern(h.data(), n, s, c->rank, 0);
    PM_CUDA(mktest::syncMemcpy(p, h.data(), n, cudaMemcpyHostToDevice));
    return "";
  };
  auto body = [&]() -> std::string {
    std::string e;
    if (!(e = fill(A, sizeA, seedA)).empty()) return e;
    if (!(e = fill(B, sizeB, seedB)).empty()) return e;
    PM_NCCL(mk::peerMemRegister(c, A, sizeA, &hA));
    PM_NCCL(mk::peerMemRegister(c, (char*)B + 4096, 2 << 20, &hB));
    auto* ra = static_cast<mk::pm::RegRecord*>(hA);
    auto* rb = static_cast<mk::pm::RegRecord*>(hB);
    if (ra->kind != mk::pm::RegRecord::kCudaMalloc) return "cudaMalloc buffer not detected";
    if (rb->kind != mk::pm::RegRecord::kCuMem) return "ncclMemAlloc buffer not detected as cuMem";
    if (rb->base != (uintptr_t)B || rb->allocSize < sizeB) return "cuMem base/size wrong";
    if (!(e = lookupCheck(c, (char*)A + 1024, 65536, 1024, seedA, true, "A")).empty()) return e;
    if (!(e = lookupCheck(c, (char*)A + 1024, 65536, 1024, seedA, true, "A again")).empty())
      return e;
    if (!(e = lookupCheck(c, (char*)B + 8192, 1 << 20, 8192, seedB, true, "B")).empty()) return e;
    if (!(e = lookupCheck(c, (char*)B + 4096, 2 << 20, 4096, seedB, true, "B whole")).empty())
      return e;
    if (!(e = lookupCheck(c, (char*)A, sizeA, 0, seedA, true, "A whole")).empty()) return e;
    // Past the registered region of B, and an unregistered buffer: no.
    if (!(e = lookupCheck(c, (char*)B + (2 << 20), 8192, 0, seedB, false, "B past")).empty())
      return e;
    if (!(e = lookupCheck(c, C, 4096, 0, seed, false, "C unregistered")).empty()) return e;
    // Only rank 0 registers C: still no, on every rank (yes when rank 0 is alone).
    if (c->rank == 0) PM_NCCL(mk::peerMemRegister(c, C, 1 << 20, &hC));
    if (c->nRanks > 1 &&
        !(e = lookupCheck(c, C, 4096, 0, seed, false, "C partly registered")).empty())
      return e;
    if (hC) {
      PM_NCCL(mk::peerMemDeregister(c, hC));
      hC = nullptr;
    }
    // Deregistered everywhere: the cache entry is gone and the exchange says no.
    PM_NCCL(mk::peerMemDeregister(c, hA));
    hA = nullptr;
    if (!(e = lookupCheck(c, (char*)A + 1024, 65536, 1024, seedA, false, "A deregistered")).empty())
      return e;
    // Registered again: yes again (fresh import).
    PM_NCCL(mk::peerMemRegister(c, A, sizeA, &hA));
    if (!(e = lookupCheck(c, (char*)A + 1024, 65536, 1024, seedA, true, "A again")).empty())
      return e;
    return "";
  };
  err = body();
  if (hA) mk::peerMemDeregister(c, hA);
  if (hB) mk::peerMemDeregister(c, hB);
  if (hC) mk::peerMemDeregister(c, hC);
  if (err.empty()) {
    ncclResult_t r = mk::bootstrapBarrier(c->bootstrap);  // peers finished reading our buffers
    if (r != ncclSuccess) err = "barrier -> " + std::to_string(r);
  }
  cudaFree(A);
  cudaFree(C);
  ncclResult_t r = mk::memFree(B);
  if (err.empty() && r != ncclSuccess) err = "memFree -> " + std::to_string(r);
  return err;
}

// 100 init/fini cycles; with `measure`, this thread checks the process's fd count and the
// GPU's free memory (all ranks of the comm are in the same phase at the barriers).
std::string cyclesCheck(ncclComm* c, int cycles, bool measure) {
  PM_NCCL(mk::peerMemInit(c));  // warm-up: CUDA opens its own fds lazily
  PM_NCCL(mk::peerMemFini(c));
  PM_NCCL(mk::bootstrapBarrier(c->bootstrap));
  int fds0 = measure ? mktest::countOpenFds() : 0;
  size_t free0 = 0, total = 0, free1 = 0;
  if (measure) PM_CUDA(cudaMemGetInfo(&free0, &total));
  PM_NCCL(mk::bootstrapBarrier(c->bootstrap));
  for (int i = 0; i < cycles; i++) {
    PM_NCCL(mk::peerMemInit(c));
    if (c->peerMem->peers.size() != (size_t)c->topo.localRanks) return "bad peers";
    PM_NCCL(mk::peerMemFini(c));
    if (c->peerMem != nullptr) return "peerMem not cleared by fini";
  }
  PM_NCCL(mk::bootstrapBarrier(c->bootstrap));
  std::string err;
  if (measure) {
    int fds1 = mktest::countOpenFds();
    PM_CUDA(cudaMemGetInfo(&free1, &total));
    // A leak per cycle would show as >= `cycles` fds. A couple may come and go meanwhile
    // without a leak: this test's bootstrap root thread still accepting or closing sockets,
    // CUDA opening a handle lazily (seen once on the H200: 183 -> 184).
    if (fds1 > fds0 + 2)
      err = "open fds " + std::to_string(fds0) + " -> " + std::to_string(fds1) + " after cycles";
    // A leak of one 2 MiB workspace per cycle would be >= 200 MiB.
    if (free1 + (64u << 20) < free0)
      err += " free GPU memory " + std::to_string(free0 >> 20) + " MiB -> " +
             std::to_string(free1 >> 20) + " MiB after cycles";
  }
  PM_NCCL(mk::bootstrapBarrier(c->bootstrap));
  return err;
}

// Starts nProcs copies of this test binary running only PeerMemChild.Run, with
// MKTEST_PM_CHILD="mode nProcs ranksPerProc procIndex emulateNodes seed commHash" and the
// bootstrap id in MKTEST_PM_ID; waits for them. Returns "" when all exit with 0.
std::string runChildren(const std::string& mode, int nProcs, int ranksPerProc, int emulateNodes,
                        const std::vector<std::string>& extraEnv) {
  ncclUniqueId id;
  if (mk::bootstrapGetUniqueId(&id) != ncclSuccess) return "bootstrapGetUniqueId failed";
  std::string hex;
  for (size_t i = 0; i < sizeof(id.internal); i++) {
    char b[3];
    snprintf(b, sizeof(b), "%02x", (unsigned char)id.internal[i]);
    hex += b;
  }
  uint64_t seed = mktest::testSeed();
  uint64_t commHash = splitmix(seed ^ 0x5eed);
  std::vector<pid_t> pids;
  for (int p = 0; p < nProcs; p++) {
    char spec[256];
    snprintf(spec, sizeof(spec), "MKTEST_PM_CHILD=%s %d %d %d %d %llu %llu", mode.c_str(), nProcs,
             ranksPerProc, p, emulateNodes, (unsigned long long)seed, (unsigned long long)commHash);
    std::vector<std::string> env = {spec, "MKTEST_PM_ID=" + hex, "MKERNEL_BOOTSTRAP_TIMEOUT_S=60"};
    env.insert(env.end(), extraEnv.begin(), extraEnv.end());
    pid_t pid = mktest::spawnSelf("PeerMemChild.Run", env);
    if (pid < 0) return "fork failed";
    pids.push_back(pid);
  }
  std::string err = mktest::waitChildren(pids, 400);
  mk::bootstrapRootsWait(5000);
  return err;
}

// Body of PeerMemChild.Run: parses MKTEST_PM_CHILD and runs its ranks as threads.
std::string childMain(const char* spec) {
  char mode[32] = {};
  int nProcs = 0, perProc = 0, p = 0, emulate = 0;
  unsigned long long seed = 0, commHash = 0;
  if (sscanf(spec, "%31s %d %d %d %d %llu %llu", mode, &nProcs, &perProc, &p, &emulate, &seed,
             &commHash) != 7)
    return std::string("bad MKTEST_PM_CHILD: ") + spec;
  const char* hex = getenv("MKTEST_PM_ID");
  ncclUniqueId id;
  if (!hex || strlen(hex) != 2 * sizeof(id.internal)) return "bad MKTEST_PM_ID";
  for (size_t i = 0; i < sizeof(id.internal); i++) {
    unsigned v = 0;
    sscanf(hex + 2 * i, "%2x", &v);
    id.internal[i] = (char)v;
  }
  if (cudaSetDevice(0) != cudaSuccess) return "cudaSetDevice(0) failed";
  std::vector<int> ranks;
  for (int t = 0; t < perProc; t++) ranks.push_back(p * perProc + t);
  std::string m = mode;
  if (m == "mismatch" && p == 1) {
    // This process asks for another workspace size: every rank must fail, none hang.
    setenv("MKERNEL_WORKSPACE_BYTES", "4194304", 1);
    mk::paramReset();
  }
  RankBody body = [&](ncclComm* c) -> std::string {
    if (m == "cycles") return cyclesCheck(c, 100, c->rank == p * perProc);
    if (m == "mismatch") {
      int fds0 = mktest::countOpenFds();
      ncclResult_t r = mk::peerMemInit(c);
      if (r == ncclSuccess) return "peerMemInit succeeded with different workspace sizes";
      if (c->peerMem != nullptr) return "peerMem set after a failed init";
      PM_NCCL(mk::bootstrapBarrier(c->bootstrap));  // every rank is back: no one hangs
      if (perProc == 1 && mktest::countOpenFds() != fds0) return "fds leaked by a failed init";
      return "";
    }
    ncclResult_t r = mk::peerMemInit(c);
    if (r != ncclSuccess) return "peerMemInit -> " + std::to_string(r);
    if (m == "ws") return workspaceCheck(c, seed);
    if (m == "reg") return registerCheck(c, seed);
    return "unknown mode " + m;
  };
  return joinErrors(runRanks(id, nProcs * perProc, ranks, commHash, emulate, body));
}

}  // namespace pmtest
