// The engine's fused-operator hooks: the producer waiting on "rows ready" flags released in
// random order by a kernel on another stream, tiles published through per-tile flags and
// picked up by a watcher kernel on a third stream, sequence numbers across calls without
// resetting flags, and the bounded wait (timeout and abort leave an error record and return).
#include <cmath>
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

// A grouped GEMM (the MoE experts' GEMM) whose rows land while it runs: groups of random sizes
// (an empty one, partial last tiles) at tile-aligned starts in a packed A; a kernel on another
// stream copies A's 64-row blocks in random order, releasing each block's flag, as a fused
// dispatch would. Every valid row of every group against an fp64 reference of its own B.
TEST(GemmHooks, GroupedRowsReady) {
  REQUIRE_SM90();
  int sms = 0, clockKHz = 0;
  GT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  GT_CUDA(cudaDeviceGetAttribute(&clockKHz, cudaDevAttrClockRate, 0));
  mk::rt::Domain* st = nullptr;
  ASSERT_EQ(mk::rt::domainCreate(0, &st), ncclSuccess);
  const uint64_t seed = mktest::testSeed();
  std::mt19937_64 rng(seed);
  const int G = 5, N = 512, K = 256, rowsPerFlag = 64;
  std::vector<int32_t> start(G), count(G);
  int M = 0;
  for (int g = 0; g < G; ++g) {
    count[g] = g == 2 ? 0 : 1 + (int)(rng() % 300);
    start[g] = M;
    M += (count[g] + 127) / 128 * 128;
  }
  M += 128;  // a trailing tile that no group uses
  const int nFlags = M / rowsPerFlag;
  void *A = nullptr, *aFinal = nullptr, *B = nullptr, *D = nullptr;
  int32_t *dMeta = nullptr, *dOrder = nullptr;
  uint64_t *flags = nullptr, *times = nullptr;
  double* ref = nullptr;
  CmpResult* cmp = nullptr;
  GT_CUDA(cudaMalloc(&A, (size_t)M * K * 2));
  GT_CUDA(cudaMalloc(&aFinal, (size_t)M * K * 2));
  GT_CUDA(cudaMalloc(&B, (size_t)G * N * K * 2));
  GT_CUDA(cudaMalloc(&D, (size_t)M * N * 2));
  GT_CUDA(cudaMalloc(&dMeta, 2 * G * sizeof(int32_t)));
  GT_CUDA(cudaMalloc(&dOrder, nFlags * sizeof(int32_t)));
  GT_CUDA(cudaMalloc(&flags, nFlags * sizeof(uint64_t)));
  GT_CUDA(cudaMalloc(&times, sizeof(uint64_t)));
  GT_CUDA(cudaMalloc(&ref, (size_t)300 * N * sizeof(double)));
  GT_CUDA(cudaMalloc(&cmp, sizeof(CmpResult)));
  GT_CUDA(cudaMemset(flags, 0, nFlags * sizeof(uint64_t)));
  GT_CUDA(
      cudaFuncSetAttribute(releaseRowsKernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  std::vector<int32_t> meta(start);
  meta.insert(meta.end(), count.begin(), count.end());
  GT_CUDA(cudaMemcpy(dMeta, meta.data(), meta.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  cudaStream_t sGemm, sRel;
  GT_CUDA(cudaStreamCreateWithFlags(&sGemm, cudaStreamNonBlocking));
  GT_CUDA(cudaStreamCreateWithFlags(&sRel, cudaStreamNonBlocking));
  for (uint64_t seq = 1; seq <= 2; ++seq) {  // flags never reset: the second call waits for 2
    SCOPED_TRACE(testing::Message() << "seq=" << seq);
    fillRandom(aFinal, M, K, K, DType::kBF16, seed * 8 + seq);
    fillRandom(B, (int64_t)G * N, K, K, DType::kBF16, seed * 8 + 4 + seq);
    GT_CUDA(cudaMemset(A, 0xFF, (size_t)M * K * 2));  // unreleased rows read as NaN
    GT_CUDA(cudaMemset(D, 0xFF, (size_t)M * N * 2));
    std::vector<int32_t> order(nFlags);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    GT_CUDA(cudaMemcpy(dOrder, order.data(), nFlags * sizeof(int32_t), cudaMemcpyHostToDevice));
    GT_CUDA(cudaDeviceSynchronize());
    GemmArgs g;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = A;
    g.B = B;
    g.D = D;
    g.groups.num = G;
    g.groups.rowStart = dMeta;
    g.groups.rowCount = dMeta + G;
    g.smBudget = sms - 2;  // leave SMs for the releasing kernel
    g.hooks.rowReady = flags;
    g.hooks.rowReadyExpected = seq;
    g.hooks.rowsPerFlag = rowsPerFlag;
    g.hooks.wait = mk::rt::domainCtx(st, mk::rt::kOpGemm, 20000);
    releaseRowsKernel<<<1, 256, 0, sRel>>>(
        static_cast<const uint16_t*>(aFinal), static_cast<uint16_t*>(A), K, M, rowsPerFlag, dOrder,
        nFlags, flags, seq, (long long)clockKHz / 50, (long long)clockKHz * 2, times);
    ASSERT_EQ(mk::gemm::launch(g, sGemm), ncclSuccess);
    GT_CUDA(cudaDeviceSynchronize());
    std::string msg;
    ASSERT_EQ(mk::rt::domainCheck(st, &msg), ncclSuccess) << msg;
    for (int gi = 0; gi < G; ++gi) {
      if (count[gi] == 0) continue;
      const char* a = static_cast<const char*>(A) + (size_t)start[gi] * K * 2;
      const char* b = static_cast<const char*>(B) + (size_t)gi * N * K * 2;
      const char* d = static_cast<const char*>(D) + (size_t)start[gi] * N * 2;
      dim3 grid((N + 15) / 16, (count[gi] + 15) / 16), block(16, 16);
      refKernel<<<grid, block>>>(count[gi], N, K, a, K, b, K, BLayout::kNK, DType::kBF16, nullptr,
                                 N, DType::kBF16, 1.0f, 0.0f, ref);
      CmpResult init = {0, ~0ull, 0, 0, 0};
      GT_CUDA(cudaMemcpy(cmp, &init, sizeof(init), cudaMemcpyHostToDevice));
      compareKernel<<<256, 256>>>(count[gi], N, d, N, DType::kBF16, ref, outRtol(DType::kBF16),
                                  2e-5 * std::sqrt((double)K) + 1e-3, cmp);
      CmpResult res;
      GT_CUDA(cudaMemcpy(&res, cmp, sizeof(res), cudaMemcpyDeviceToHost));
      EXPECT_EQ(res.bad, 0ull) << "group " << gi << " (start " << start[gi] << ", " << count[gi]
                               << " rows), first bad row " << res.firstBad / N;
    }
  }
  cudaStreamDestroy(sGemm);
  cudaStreamDestroy(sRel);
  for (void* q : {A, aFinal, B, D}) cudaFree(q);
  cudaFree(dMeta);
  cudaFree(dOrder);
  cudaFree(flags);
  cudaFree(times);
  cudaFree(ref);
  cudaFree(cmp);
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
  // Each pipeline (3: the ping-pong consumers, whose order barriers must still be matched
  // when a tile aborts) and, for mode 2, one CTA that computes row block 0 (its flag is set)
  // before it times out on row block 1: an abort after completed tiles.
  for (int pipeline : {0, 1, 3})
    for (int mode = 0; mode < 3; ++mode) {
      SCOPED_TRACE(std::string(mode == 0   ? "timeout"
                               : mode == 1 ? "abort"
                                           : "timeout after a tile") +
                   " pipeline " + std::to_string(pipeline));
      GT_CUDA(cudaMemset(flags, 0, 8 * sizeof(uint64_t)));
      GemmArgs g = p.args();
      g.pipeline = pipeline;
      if (mode == 2) {
        const uint64_t ready = 7;
        GT_CUDA(cudaMemcpy(flags, &ready, sizeof(ready), cudaMemcpyHostToDevice));
        g.smBudget = 1;
      }
      g.hooks.rowReady = flags;
      g.hooks.rowReadyExpected = 7;
      g.hooks.wait = mk::rt::domainCtx(st, mk::rt::kOpGemm, mode == 1 ? 60000 : 50);
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
      EXPECT_EQ(r, mode == 1 ? ncclSystemError : ncclRemoteError) << msg;
      EXPECT_EQ(st->errHost->kind, mode == 1 ? mk::rt::kErrAbort : mk::rt::kErrTimeout);
      EXPECT_EQ(st->errHost->rank, 3);
      EXPECT_EQ(st->errHost->op, mk::rt::kOpGemm);
      EXPECT_EQ(st->errHost->seq, 7u);
      EXPECT_GE(st->errHost->slot, mode == 2 ? 1 : 0);  // mode 2: row block 0 was ready
      EXPECT_LT(st->errHost->slot, 4);
      mk::rt::domainSetAbort(st, false);
      ASSERT_EQ(mk::rt::domainReset(st), ncclSuccess);
    }
  // The context stays usable: a plain GEMM still runs and is right, on each pipeline, with the
  // rowReady hook on (every flag released; budget 3 gives each CTA several tiles) and off.
  p.reference();
  {
    const std::vector<uint64_t> ready(8, 7);
    GT_CUDA(cudaMemcpy(flags, ready.data(), 8 * sizeof(uint64_t), cudaMemcpyHostToDevice));
  }
  for (int pipeline : {0, 1, 3}) {
    p.poison();
    GemmArgs g = p.args();
    g.pipeline = pipeline;
    g.smBudget = 3;
    g.hooks.rowReady = flags;
    g.hooks.rowReadyExpected = 7;
    g.hooks.wait = mk::rt::domainCtx(st, mk::rt::kOpGemm, 60000);
    ASSERT_EQ(mk::gemm::launch(g, 0), ncclSuccess);
    GT_CUDA(cudaDeviceSynchronize());
    std::string msg;
    EXPECT_EQ(mk::rt::domainCheck(st, &msg), ncclSuccess) << msg;
    EXPECT_EQ(p.check(), "") << "rows ready, pipeline " << pipeline;
  }
  for (int pipeline : {0, 1, 3}) {
    p.poison();
    GemmArgs g = p.args();
    g.pipeline = pipeline;
    ASSERT_EQ(mk::gemm::launch(g, 0), ncclSuccess);
    GT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(p.check(), "") << "pipeline " << pipeline;
  }
  cudaFree(flags);
  mk::rt::domainDestroy(st);
}
