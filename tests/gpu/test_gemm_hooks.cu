// The engine's fused-operator hooks: the producer waiting on "rows ready" flags released in
// random order by a kernel on another stream, tiles published through per-tile flags and
// picked up by a watcher kernel on a third stream, sequence numbers across calls without
// resetting flags, and the bounded wait (timeout and abort leave an error record and return).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <thread>

#include "device/rt/err_host.h"
#include "device/rt/wait.cuh"
#include "test_gemm_util.cuh"

using namespace gemmtest;
using mk::gemm::GemmArgs;

namespace {

#define REQUIRE_SM90() GEMMTEST_REQUIRE_SM90()

// Writes the rows of each flag's block (in the given order) from `src` into `dst`, then
// releases the block's flag with the sequence number; pauses between blocks so the GEMM
// really waits.
__global__ void releaseRowsKernel(const uint16_t* src, uint16_t* dst, int64_t lda, int M,
                                  int rowsPerFlag, const int32_t* order, int nFlags,
                                  uint64_t* flags, uint64_t seq, long long pauseCycles,
                                  long long startDelayCycles, uint64_t* lastReleaseNs) {
  const long long s0 = clock64();
  while (clock64() - s0 < startDelayCycles) {
  }
  for (int i = 0; i < nFlags; ++i) {
    const int f = order[i];
    const int r0 = f * rowsPerFlag, r1 = min(M, r0 + rowsPerFlag);
    for (int64_t e = threadIdx.x; e < (int64_t)(r1 - r0) * lda; e += blockDim.x)
      dst[(int64_t)r0 * lda + e] = src[(int64_t)r0 * lda + e];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      mk::ptx::stReleaseGpu(flags + f, seq);
      *lastReleaseNs = mk::ptx::globalTimerNs();
    }
    const long long t0 = clock64();
    while (clock64() - t0 < pauseCycles) {
    }
    __syncthreads();
  }
}

// Copies every tile of D to `out` as soon as its flag says it is published.
__global__ void watchTilesKernel(const uint16_t* D, uint16_t* out, int M, int N, int tilesN,
                                 int nTiles, const uint64_t* flags, uint64_t seq,
                                 mk::rt::WaitCtx wait, int* failed, uint64_t* firstTileNs) {
  __shared__ int ok;
  for (int t = 0; t < nTiles; ++t) {
    if (threadIdx.x == 0) {
      ok = mk::rt::waitFlag(wait, flags + t, seq, t, false);
      if (t == 0) *firstTileNs = mk::ptx::globalTimerNs();
    }
    __syncthreads();
    if (!ok) {
      if (threadIdx.x == 0) *failed = 1;
      return;
    }
    const int m0 = (t / tilesN) * 128, n0 = (t % tilesN) * 256;
    const int rows = min(128, M - m0), cols = min(256, N - n0);
    for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
      const int r = e / cols, c = e % cols;
      out[(int64_t)(m0 + r) * N + n0 + c] = D[(int64_t)(m0 + r) * N + n0 + c];
    }
    __syncthreads();
  }
}

}  // namespace

TEST(GemmHooks, RowsReadyRandomOrderAndTilePublish) {
  REQUIRE_SM90();
  int sms = 0;
  GT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int clockKHz = 0;
  GT_CUDA(cudaDeviceGetAttribute(&clockKHz, cudaDevAttrClockRate, 0));
  mk::rt::Domain* st = nullptr;
  ASSERT_EQ(mk::rt::domainCreate(0, &st), ncclSuccess);
  const uint64_t seed = mktest::testSeed();
  uint64_t* hostSeq = nullptr;  // pinned source of flag values for the copy-engine releases
  GT_CUDA(cudaMallocHost(&hostSeq, 4 * sizeof(uint64_t)));
  for (uint64_t i = 0; i < 4; ++i) hostSeq[i] = i;
  // mode 0: rows and flags released by cudaMemcpyAsync on another stream (copy engine);
  // mode 1: released by a kernel on another stream (generic-proxy stores + st.release).
  for (int mode = 0; mode < 2; ++mode)
    for (BLayout bl : {BLayout::kNK, BLayout::kKN}) {
      Problem p(1000, 1504, 512, bl, DType::kBF16, DType::kBF16);  // N % 8 == 0 for B[K,N]
      SCOPED_TRACE(mode == 0 ? "release by copies" : "release by kernel");
      SCOPED_TRACE(p.name());
      p.alloc();
      const int rowsPerFlag = 64;
      const int nFlags = (p.M + rowsPerFlag - 1) / rowsPerFlag;
      const int tilesN = mk::gemm::tilesN(p.args());
      const int nTiles = mk::gemm::tilesM(p.args()) * tilesN;
      uint64_t *rowFlags = nullptr, *tileFlags = nullptr;
      uint16_t *aFinal = nullptr, *D2 = nullptr;
      int32_t* dOrder = nullptr;
      int* failed = nullptr;
      uint64_t* times = nullptr;  // [last row release, first tile seen] in globaltimer ns
      GT_CUDA(cudaMalloc(&rowFlags, nFlags * sizeof(uint64_t)));
      GT_CUDA(cudaMalloc(&tileFlags, nTiles * sizeof(uint64_t)));
      GT_CUDA(cudaMemset(rowFlags, 0, nFlags * sizeof(uint64_t)));  // once: never reset again
      GT_CUDA(cudaMemset(tileFlags, 0, nTiles * sizeof(uint64_t)));
      GT_CUDA(cudaMalloc(&aFinal, p.bytesA()));
      GT_CUDA(cudaMalloc(&D2, p.bytesD()));
      GT_CUDA(cudaMalloc(&dOrder, nFlags * sizeof(int32_t)));
      GT_CUDA(cudaMalloc(&failed, sizeof(int)));
      GT_CUDA(cudaMalloc(&times, 2 * sizeof(uint64_t)));
      // Same shared-memory carveout as the GEMM, so the helper kernels can run on the SMs the
      // GEMM leaves free (run 3 on the H200: a releaser on another stream never ran beside the
      // waiting GEMM and the producers hit their deadline; see docs/gemm-notes.md).
      GT_CUDA(cudaFuncSetAttribute(releaseRowsKernel,
                                   cudaFuncAttributePreferredSharedMemoryCarveout, 100));
      GT_CUDA(cudaFuncSetAttribute(watchTilesKernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   100));
      cudaStream_t sGemm, sRel, sWatch;
      GT_CUDA(cudaStreamCreateWithFlags(&sGemm, cudaStreamNonBlocking));
      GT_CUDA(cudaStreamCreateWithFlags(&sRel, cudaStreamNonBlocking));
      GT_CUDA(cudaStreamCreateWithFlags(&sWatch, cudaStreamNonBlocking));
      std::mt19937_64 rng(seed);
      for (uint64_t seq = 1; seq <= 3; ++seq) {
        SCOPED_TRACE(testing::Message() << "seq=" << seq);
        p.randomize(seed + seq);
        GT_CUDA(cudaMemcpy(aFinal, p.A, p.bytesA(), cudaMemcpyDeviceToDevice));
        GT_CUDA(cudaMemset(p.A, 0xFF, p.bytesA()));  // unreleased rows read as NaN
        p.poison();
        GT_CUDA(cudaMemset(D2, 0xFF, p.bytesD()));
        GT_CUDA(cudaMemset(failed, 0, sizeof(int)));
        // reference from the final A
        std::swap(p.A, reinterpret_cast<void*&>(aFinal));
        p.reference();
        std::swap(p.A, reinterpret_cast<void*&>(aFinal));
        std::vector<int32_t> order(nFlags);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        GT_CUDA(cudaMemcpy(dOrder, order.data(), nFlags * sizeof(int32_t), cudaMemcpyHostToDevice));
        GT_CUDA(cudaDeviceSynchronize());

        GemmArgs g = p.args();
        g.smBudget = sms - 2;  // leave SMs for the releasing and watching kernels
        g.hooks.rowReady = rowFlags;
        g.hooks.rowReadyExpected = seq;
        g.hooks.rowsPerFlag = rowsPerFlag;
        g.hooks.tileDone = tileFlags;
        g.hooks.tileDoneValue = seq;
        g.hooks.wait = mk::rt::domainCtx(st, mk::rt::kOpGemm, 20000);
        // The releaser goes first (it starts with a ~2 ms delay, so a GEMM running beside it
        // really waits); if this machine serialises the streams it still cannot deadlock.
        if (mode == 0) {
          for (int i = 0; i < nFlags; ++i) {
            const int f = order[i];
            const int r0 = f * rowsPerFlag, r1 = std::min(p.M, r0 + rowsPerFlag);
            GT_CUDA(cudaMemcpyAsync(static_cast<uint16_t*>(p.A) + (int64_t)r0 * p.lda,
                                    aFinal + (int64_t)r0 * p.lda, (size_t)(r1 - r0) * p.lda * 2,
                                    cudaMemcpyDeviceToDevice, sRel));
            GT_CUDA(cudaMemcpyAsync(rowFlags + f, hostSeq + seq, sizeof(uint64_t),
                                    cudaMemcpyHostToDevice, sRel));
          }
        } else {
          releaseRowsKernel<<<1, 256, 0, sRel>>>(aFinal, static_cast<uint16_t*>(p.A), p.lda, p.M,
                                                 rowsPerFlag, dOrder, nFlags, rowFlags, seq,
                                                 (long long)clockKHz / 50 /* ~20 us */,
                                                 (long long)clockKHz * 2 /* ~2 ms */, times);
        }
        ASSERT_EQ(mk::gemm::launch(g, sGemm), ncclSuccess);
        mk::rt::WaitCtx watchWait = g.hooks.wait;
        watchWait.op = 99;  // tells the watcher's record apart from the producer's
        watchTilesKernel<<<1, 256, 0, sWatch>>>(static_cast<uint16_t*>(p.D), D2, p.M, p.N, tilesN,
                                                nTiles, tileFlags, seq, watchWait, failed,
                                                times + 1);
        GT_CUDA(cudaGetLastError());
        GT_CUDA(cudaDeviceSynchronize());
        std::string msg;
        std::vector<uint64_t> rf(nFlags);
        GT_CUDA(cudaMemcpy(rf.data(), rowFlags, nFlags * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        std::string flagsStr;
        for (uint64_t v : rf) flagsStr += std::to_string(v) + " ";
        ASSERT_EQ(mk::rt::domainCheck(st, &msg), ncclSuccess)
            << msg << "; row flags after: " << flagsStr;
        int hFailed = -1;
        GT_CUDA(cudaMemcpy(&hFailed, failed, sizeof(int), cudaMemcpyDeviceToHost));
        EXPECT_EQ(hFailed, 0);
        if (mode == 1) {
          uint64_t ht[2];
          GT_CUDA(cudaMemcpy(ht, times, sizeof(ht), cudaMemcpyDeviceToHost));
          // A tile published before the last row block was released means the GEMM ran
          // beside the releaser and its producer waited on the flags.
          printf("[gemm-hooks] seq %llu: first tile published %s the last row release (%.1f us)\n",
                 (unsigned long long)seq, ht[1] < ht[0] ? "before" : "after",
                 ((double)ht[1] - (double)ht[0]) / 1e3);
        }
        EXPECT_EQ(p.check(), "");
        EXPECT_EQ(p.check(D2), "") << "(tiles forwarded by the watcher)";
        std::vector<uint64_t> tf(nTiles);
        GT_CUDA(
            cudaMemcpy(tf.data(), tileFlags, nTiles * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        for (int t = 0; t < nTiles; ++t) ASSERT_EQ(tf[t], seq) << "tile " << t;
      }
      cudaStreamDestroy(sGemm);
      cudaStreamDestroy(sRel);
      cudaStreamDestroy(sWatch);
      cudaFree(rowFlags);
      cudaFree(tileFlags);
      cudaFree(aFinal);
      cudaFree(D2);
      cudaFree(dOrder);
      cudaFree(failed);
      cudaFree(times);
    }
  cudaFreeHost(hostSeq);
  mk::rt::domainDestroy(st);
}

// Rows never released: every producer gives up at the deadline, the kernel returns, and the
// record names op, flag slot and the awaited sequence number. Then the same with abort.
TEST(GemmHooks, TimeoutAndAbortLeaveErrorRecord) {
  REQUIRE_SM90();
  mk::rt::Domain* st = nullptr;
  ASSERT_EQ(mk::rt::domainCreate(3, &st), ncclSuccess);
  Problem p(512, 512, 128, BLayout::kNK, DType::kBF16, DType::kBF16);
  p.alloc();
  p.randomize(1);
  uint64_t* flags = nullptr;
  GT_CUDA(cudaMalloc(&flags, 8 * sizeof(uint64_t)));
  GT_CUDA(cudaMemset(flags, 0, 8 * sizeof(uint64_t)));
  for (int mode = 0; mode < 2; ++mode) {
    SCOPED_TRACE(mode == 0 ? "timeout" : "abort");
    GemmArgs g = p.args();
    g.hooks.rowReady = flags;
    g.hooks.rowReadyExpected = 7;
    g.hooks.wait = mk::rt::domainCtx(st, mk::rt::kOpGemm, mode == 0 ? 50 : 60000);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(mk::gemm::launch(g, 0), ncclSuccess);
    if (mode == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      mk::rt::domainSetAbort(st, true);
    }
    GT_CUDA(cudaDeviceSynchronize());
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 10.0);
    std::string msg;
    const ncclResult_t r = mk::rt::domainCheck(st, &msg);
    EXPECT_EQ(r, mode == 0 ? ncclRemoteError : ncclSystemError) << msg;
    EXPECT_EQ(st->errHost->kind, mode == 0 ? mk::rt::kErrTimeout : mk::rt::kErrAbort);
    EXPECT_EQ(st->errHost->rank, 3);
    EXPECT_EQ(st->errHost->op, mk::rt::kOpGemm);
    EXPECT_EQ(st->errHost->seq, 7u);
    EXPECT_GE(st->errHost->slot, 0);
    EXPECT_LT(st->errHost->slot, 4);
    mk::rt::domainSetAbort(st, false);
    ASSERT_EQ(mk::rt::domainReset(st), ncclSuccess);
  }
  // The context stays usable: a plain GEMM still runs and is right.
  p.poison();
  p.reference();
  ASSERT_EQ(mk::gemm::launch(p.args(), 0), ncclSuccess);
  GT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(p.check(), "");
  cudaFree(flags);
  mk::rt::domainDestroy(st);
}
