// Peer memory with ranks as threads of this process, all on GPU 0: workspace mapping
// (1, 2, 4, 8 ranks; virtual nodes), ncclMemAlloc/ncclMemFree, registration and lookup,
// argument errors, and 100 init/fini cycles without leaks.
#define MK_PEER_MEM_INTERNAL 1
#include <cstdint>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cuda_runtime.h>
#include <functional>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "common/test_util.h"
#include "comm/comm.h"
#include "base/cudawrap.h"
#include "base/param.h"
#include "transport/peer_mem.h"

namespace pmtest {  // test_peer_mem_util.cc
using RankBody = std::function<std::string(ncclComm* comm)>;
std::vector<std::string> runRanks(const ncclUniqueId& id, int nRanks, const std::vector<int>& ranks,
                                  uint64_t commHash, int emulateNodes, const RankBody& body);
std::string joinErrors(const std::vector<std::string>& errs);
std::string workspaceCheck(ncclComm* c, uint64_t seed);
std::string registerCheck(ncclComm* c, uint64_t seed);
std::string cyclesCheck(ncclComm* c, int cycles, bool measure);
}  // namespace pmtest

namespace {

// Runs body on n rank threads of one comm (virtual nodes when emulateNodes > 1).
std::string runThreads(int n, int emulateNodes, const pmtest::RankBody& body) {
  ncclUniqueId id;
  if (mk::bootstrapGetUniqueId(&id) != ncclSuccess) return "bootstrapGetUniqueId failed";
  std::vector<int> ranks;
  for (int r = 0; r < n; r++) ranks.push_back(r);
  uint64_t hash = mktest::testSeed() * 0x9e3779b97f4a7c15ull + (uint64_t)n;
  std::string err = pmtest::joinErrors(pmtest::runRanks(id, n, ranks, hash, emulateNodes, body));
  mk::bootstrapRootsWait(5000);
  return err;
}

pmtest::RankBody initThen(std::function<std::string(ncclComm*)> check) {
  return [check](ncclComm* c) -> std::string {
    ncclResult_t r = mk::peerMemInit(c);
    if (r != ncclSuccess) return "peerMemInit -> " + std::to_string(r);
    return check(c);
  };
}

// Sets an environment parameter for the scope of a test.
struct EnvScope {
  std::string name;
  EnvScope(const char* n, const char* v) : name(n) {
    setenv(n, v, 1);
    mk::paramReset();
  }
  ~EnvScope() {
    unsetenv(name.c_str());
    mk::paramReset();
  }
};

class PeerMemThreads : public ::testing::TestWithParam<int> {};

TEST_P(PeerMemThreads, WorkspaceEveryByteFromEveryPeer) {
  MKTEST_REQUIRE_GPU();
  int n = GetParam();
  uint64_t seed = mktest::testSeed();
  std::string err = runThreads(n, 0, initThen([seed](ncclComm* c) -> std::string {
                                 if (c->topo.localRanks != c->nRanks) return "expected one node";
                                 if (c->topo.ranksOnMyDevice != c->nRanks)
                                   return "expected all ranks on GPU 0";
                                 return pmtest::workspaceCheck(c, seed);
                               }));
  EXPECT_EQ(err, "");
}

TEST_P(PeerMemThreads, RegisterAndLookup) {
  MKTEST_REQUIRE_GPU();
  uint64_t seed = mktest::testSeed();
  std::string err = runThreads(
      GetParam(), 0, initThen([seed](ncclComm* c) { return pmtest::registerCheck(c, seed); }));
  EXPECT_EQ(err, "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, PeerMemThreads, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

// 8 ranks in 4 virtual nodes of 2: only the two ranks of a node map each other, and
// lookups (collective over all 8) resolve within the node.
TEST(PeerMemVirtualNodes, OnlyTheNodeIsMapped) {
  MKTEST_REQUIRE_GPU();
  uint64_t seed = mktest::testSeed();
  std::string err = runThreads(8, 4, initThen([seed](ncclComm* c) -> std::string {
                                 if (c->topo.nNodes != 4 || c->topo.localRanks != 2)
                                   return "unexpected virtual topology";
                                 if (c->peerMem->peers.size() != 2)
                                   return "peers should hold the 2 ranks of the node";
                                 std::string e = pmtest::workspaceCheck(c, seed);
                                 if (!e.empty()) return e;
                                 return pmtest::registerCheck(c, seed);
                               }));
  EXPECT_EQ(err, "");
}

// Uneven virtual nodes: 3 ranks in 2 nodes (2 + 1); the lone rank maps only itself.
TEST(PeerMemVirtualNodes, UnevenNodes) {
  MKTEST_REQUIRE_GPU();
  uint64_t seed = mktest::testSeed();
  std::string err = runThreads(3, 2, initThen([seed](ncclComm* c) -> std::string {
                                 if ((int)c->peerMem->peers.size() != c->topo.localRanks)
                                   return "peers size";
                                 return pmtest::workspaceCheck(c, seed);
                               }));
  EXPECT_EQ(err, "");
}

TEST(PeerMemThreadsCycles, HundredInitFiniNoLeaks) {
  MKTEST_REQUIRE_GPU();
  EnvScope ws("MKERNEL_WORKSPACE_BYTES", "2097152");
  std::string err =
      runThreads(4, 0, [](ncclComm* c) { return pmtest::cyclesCheck(c, 100, c->rank == 0); });
  EXPECT_EQ(err, "");
}

TEST(PeerMemInitErrors, BadWorkspaceSizeFailsOnEveryRank) {
  MKTEST_REQUIRE_GPU();
  EnvScope ws("MKERNEL_WORKSPACE_BYTES", "0");
  std::string err = runThreads(2, 0, [](ncclComm* c) -> std::string {
    ncclResult_t r = mk::peerMemInit(c);
    if (r == ncclSuccess) return "peerMemInit succeeded with MKERNEL_WORKSPACE_BYTES=0";
    if (c->peerMem != nullptr) return "peerMem left set after a failed init";
    return mk::peerMemFini(c) == ncclSuccess ? "" : "fini after failed init";
  });
  EXPECT_EQ(err, "");
}

TEST(PeerMemAlloc, SizesAccessAndExport) {
  MKTEST_REQUIRE_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(mk::cudaLibInit(), ncclSuccess);
  size_t sizes[] = {1, 4096, 2u << 20, (2u << 20) + 1, 64u << 20};
  for (size_t size : sizes) {
    void* p = nullptr;
    ASSERT_EQ(mk::memAlloc(&p, size), ncclSuccess) << size;
    ASSERT_NE(p, nullptr);
    // Granularity-rounded cuMem allocation with a POSIX-fd handle.
    CUdeviceptr base = 0;
    size_t range = 0;
    ASSERT_EQ(mk::cu.cuMemGetAddressRange(&base, &range, (CUdeviceptr)p), CUDA_SUCCESS);
    EXPECT_EQ((void*)base, p);
    EXPECT_GE(range, size);
    size_t gran = 0;
    ASSERT_EQ(mk::pm::allocGranularity(0, true, &gran), ncclSuccess);
    EXPECT_EQ(range % gran, 0u);
    CUmemGenericAllocationHandle h;
    ASSERT_EQ(mk::cu.cuMemRetainAllocationHandle(&h, p), CUDA_SUCCESS);
    int fd = -1;
    EXPECT_EQ(
        mk::cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        CUDA_SUCCESS);
    if (fd >= 0) close(fd);
    mk::cu.cuMemRelease(h);
    // Usable from this device: write, read back.
    std::vector<uint8_t> in(size), out(size, 0);
    for (size_t i = 0; i < size; i++) in[i] = (uint8_t)(i * 7 + size);
    ASSERT_EQ(mktest::syncMemcpy(p, in.data(), size, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(mktest::syncMemset((char*)p + size / 2, 0xAB, size - size / 2), cudaSuccess);
    ASSERT_EQ(mktest::syncMemcpy(out.data(), p, size, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < size; i++)
      ASSERT_EQ(out[i], i < size / 2 ? in[i] : 0xAB) << "byte " << i << " of " << size;
    // Interior pointers are not allocations.
    EXPECT_EQ(mk::memFree((char*)p + 1), ncclInvalidArgument);
    EXPECT_EQ(mk::memFree(p), ncclSuccess);
    EXPECT_EQ(mk::memFree(p), ncclInvalidArgument);  // double free
  }
  void* p = (void*)0x1234;
  EXPECT_EQ(mk::memAlloc(&p, 0), ncclSuccess);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(mk::memFree(nullptr), ncclSuccess);
  EXPECT_EQ(mk::memAlloc(nullptr, 16), ncclInvalidArgument);
  int hostVar = 0;
  EXPECT_EQ(mk::memFree(&hostVar), ncclInvalidArgument);
  void* cm = nullptr;
  ASSERT_EQ(cudaMalloc(&cm, 4096), cudaSuccess);
  EXPECT_EQ(mk::memFree(cm), ncclInvalidArgument);  // not ours
  cudaFree(cm);
}

TEST(PeerMemAlloc, HundredAllocFreeNoLeak) {
  MKTEST_REQUIRE_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(mk::memAlloc(&p, 1 << 20), ncclSuccess);  // warm-up
  ASSERT_EQ(mk::memFree(p), ncclSuccess);
  size_t free0 = 0, free1 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  int fds0 = mktest::countOpenFds();
  for (int i = 0; i < 100; i++) {
    ASSERT_EQ(mk::memAlloc(&p, 8 << 20), ncclSuccess);
    ASSERT_EQ(mk::memFree(p), ncclSuccess);
  }
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_GE(free1 + (64u << 20), free0);
  EXPECT_EQ(mktest::countOpenFds(), fds0);
}

TEST(PeerMemRegisterErrors, InvalidArguments) {
  MKTEST_REQUIRE_GPU();
  std::string err = runThreads(
      1, 0, initThen([](ncclComm* c) -> std::string {
        void* buf = nullptr;
        if (cudaMalloc(&buf, 1 << 16) != cudaSuccess) return "cudaMalloc";
        void* h = nullptr;
        std::string e;
        auto expect = [&](ncclResult_t got, ncclResult_t want, const char* what) {
          if (got != want)
            e += std::string(what) + " -> " + std::to_string(got) + " (want " +
                 std::to_string(want) + "); ";
        };
        expect(mk::peerMemRegister(c, nullptr, 16, &h), ncclInvalidArgument, "register null buff");
        expect(mk::peerMemRegister(c, buf, 0, &h), ncclInvalidArgument, "register size 0");
        expect(mk::peerMemRegister(c, buf, 16, nullptr), ncclInvalidArgument,
               "register null handle");
        int hostVar = 0;
        // Plain host memory is unknown to CUDA (-> ncclInvalidArgument); with HMM the driver may
        // know it, and then it must at least be local-only.
        void* hh = nullptr;
        ncclResult_t hr = mk::peerMemRegister(c, &hostVar, sizeof(hostVar), &hh);
        if (hr == ncclSuccess) {
          if (static_cast<mk::pm::RegRecord*>(hh)->kind != mk::pm::RegRecord::kLocalOnly)
            e += "stack memory registered as shareable; ";
          expect(mk::peerMemDeregister(c, hh), ncclSuccess, "deregister stack memory");
        } else {
          expect(hr, ncclInvalidArgument, "register non-CUDA memory");
        }
        expect(mk::peerMemDeregister(c, nullptr), ncclInvalidArgument, "deregister null");
        expect(mk::peerMemDeregister(c, &hostVar), ncclInvalidArgument, "deregister unknown");
        expect(mk::peerMemRegister(nullptr, buf, 16, &h), ncclInvalidArgument,
               "register null comm");
        expect(mk::peerMemRegister(c, buf, 1 << 16, &h), ncclSuccess, "register");
        void* h2 = nullptr;
        expect(mk::peerMemRegister(c, buf, 1 << 10, &h2), ncclSuccess, "register twice");
        if (h == h2) e += "two registrations share a handle; ";
        expect(mk::peerMemDeregister(c, h), ncclSuccess, "deregister");
        expect(mk::peerMemDeregister(c, h), ncclInvalidArgument, "deregister twice");
        // The second registration still works (one rank: lookups need no exchange partner).
        bool ok = false;
        std::vector<void*> ptrs;
        expect(mk::peerMemLookup(c, buf, 512, &ok, &ptrs), ncclSuccess, "lookup");
        if (!ok || ptrs.size() != 1 || ptrs[0] != buf)
          e += "lookup of a registered buffer failed; ";
        expect(mk::peerMemLookup(c, buf, 4096, &ok, &ptrs), ncclSuccess, "lookup past");
        if (ok) e += "lookup past the registered size succeeded; ";
        expect(mk::peerMemDeregister(c, h2), ncclSuccess, "deregister 2");
        expect(mk::peerMemLookup(c, buf, 512, &ok, nullptr), ncclInvalidArgument,
               "lookup null out");
        // Host memory known to CUDA: accepted, in-process only.
        void* pinned = nullptr;
        if (cudaMallocHost(&pinned, 4096) == cudaSuccess) {
          void* hp = nullptr;
          expect(mk::peerMemRegister(c, pinned, 4096, &hp), ncclSuccess, "register pinned host");
          if (hp && static_cast<mk::pm::RegRecord*>(hp)->kind != mk::pm::RegRecord::kLocalOnly)
            e += "pinned host memory should be local-only; ";
          if (hp) expect(mk::peerMemDeregister(c, hp), ncclSuccess, "deregister pinned");
          cudaFreeHost(pinned);
        }
        cudaFree(buf);
        return e;
      }));
  EXPECT_EQ(err, "");
  // Without peer memory (comm not initialised): a clear error, no crash.
  ncclComm bare;
  void* h = nullptr;
  EXPECT_EQ(mk::peerMemRegister(&bare, (void*)0x1000, 16, &h), ncclInvalidArgument);
  EXPECT_EQ(mk::peerMemFini(&bare), ncclSuccess);
}

}  // namespace
