// Two GEMMs through one pipeline (device only): a CTA claims tiles of the first GEMM until none
// is left, then tiles of the second, through the same ring and the same main loop. For a fused
// kernel whose second GEMM reads the first one's output (the MoE layer: act = SwiGLU(x W1),
// then act W2): the second GEMM's rowReady flags are the first one's tileDone counters
// (GemmHooks::tileDoneRows), so its tiles start as the rows they read are stored.
//
// Why one main loop: a kernel with two gemmCta bodies (two consumer regions after setmaxnreg)
// spills ~2.5 KB a thread in ptxas; here the second GEMM only adds an epilogue.
//
// Why the phase word: under the dynamic schedule a consumer publishes a tile (tileDone) only
// once its next tile's main loop is done. The first stage of a second-GEMM tile may wait for
// that very publication (its rows are the first GEMM's last tile here), so between the two
// GEMMs the producer puts a word without data on one stage (kStagePhase), at which the
// consumers publish their last first-GEMM tile before they wait for any second-GEMM stage.
//
// Both GEMMs: the dynamic schedule (tileClaim each), one CTA (no pairs), the same pipe, input
// type and B layout (one main loop), and, when grouped, the same groups (one prefix table).
#pragma once
#include <cstdint>
#include <type_traits>

#include "fused/gemm/gemm_kernel.cuh"

namespace mk {
namespace gemm {

constexpr uint32_t kStagePhase = 0xfffffffdu;  // the first GEMM is done on this CTA

// Tile t of GEMM j: its coordinates by that GEMM's traits (a gated tile stores 128 columns, a
// plain one 256: the column of tile nBlk differs, whatever the shared rows).
template <class Tr1, class Tr2>
__device__ __forceinline__ void chainTileAt(int j, const GemmParams& p,
                                            const SmemLayout<typename Tr1::Pipe>& sm, int32_t t,
                                            int32_t* g, int32_t* m0, int32_t* n0, int32_t* mBlk,
                                            int32_t* nBlk) {
  if (j == 0) {
    tileAt<Tr1>(p, sm, t, g, m0, n0, mBlk, nBlk);
  } else {
    tileAt<Tr2>(p, sm, t, g, m0, n0, mBlk, nBlk);
  }
}

template <class Tr1, class Tr2>
__device__ __forceinline__ void chainProducer(const GemmParams& p1, const GemmParams& p2,
                                              const SmemLayout<typename Tr1::Pipe>& sm,
                                              volatile uint32_t* stageAbort) {
  int32_t stage = 0;
  uint32_t phase = 0;
  for (int j = 0; j < 2; ++j) {
    const GemmParams& p = j == 0 ? p1 : p2;
    const int32_t numTiles = numTilesOf<Tr1>(p, sm);
    for (int32_t t = atomicAdd(p.tileClaim, 1); t < numTiles; t = atomicAdd(p.tileClaim, 1)) {
      int32_t g, m0, n0, mBlk, nBlk;
      chainTileAt<Tr1, Tr2>(j, p, sm, t, &g, &m0, &n0, &mBlk, &nBlk);
      const bool ok = p.hooks.rowReady == nullptr || waitRowsReady(p, m0);
      const uint32_t word = ok ? (uint32_t)t : kStageAbort;
      if (j == 0) {
        produceTile<Tr1>(p, sm, ok, word, m0, n0, g, stage, phase, stageAbort);
      } else {
        produceTile<Tr2>(p, sm, ok, word, m0, n0, g, stage, phase, stageAbort);
      }
      if (!ok) return;  // the consumers stop at the aborted tile: no end word
    }
    // The phase word (j = 0), then the end word (j = 1), each on the next stage once the
    // consumers released it, completing its phase without data.
    ptx::mbarWait(&sm.empty[stage], phase ^ 1);
    stageAbort[stage] = j == 0 ? kStagePhase : kStageEnd;
    ptx::mbarArrive(&sm.full[stage]);
    if (++stage == Tr1::Pipe::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
}

// Tests only (delayUs > 0): the consumers hold tile 0 of each GEMM that long before its
// epilogue, so its rows are stored, and its row block counted, after every other tile's: the
// readers of those rows (GEMM2's tiles, the combine) must wait for the counter to be right.
__device__ __forceinline__ void chainTestDelay(uint32_t delayUs, int32_t tile) {
  if (delayUs == 0 || tile != 0) return;
  const uint64_t t0 = ptx::globalTimerNs();
  while (ptx::globalTimerNs() - t0 < (uint64_t)delayUs * 1000u) __nanosleep(2000);
}

template <class Tr1, class Tr2>
__device__ __forceinline__ void chainConsumer(const GemmParams& p1, const GemmParams& p2,
                                              const SmemLayout<typename Tr1::Pipe>& sm, int32_t wg,
                                              const volatile uint32_t* stageAbort,
                                              uint32_t delayUs) {
  const int32_t lane = threadIdx.x & 31;
  float acc[128];
  uint32_t nStores = 0;  // TMA stores issued by this WG (uniform across its threads)
  int32_t pending = -1;  // tile whose stores are issued but not yet published
  int32_t stage = 0;
  uint32_t phase = 0;
  int j = 0;  // the GEMM of the tiles now coming
  for (;;) {
    // The tile comes with its first stage, its word read by lane 0 (whose arrive hands the
    // stage back) and broadcast, as in gemmConsumer's dynamic schedule.
    ptx::mbarWait(&sm.full[stage], phase);
    const uint32_t v = __shfl_sync(0xffffffffu, lane == 0 ? stageAbort[stage] : 0u, 0);
    if (v == kStageEnd) break;  // never released: the producer loads nothing after it
    if (v == kStagePhase) {
      if (p1.hooks.tileDone != nullptr && pending >= 0) publishTile(p1, pending, wg);
      pending = -1;
      releaseStage<Tr1>(&sm.empty[stage], lane);
      if (++stage == Tr1::Pipe::kStages) {
        stage = 0;
        phase ^= 1;
      }
      j = 1;
      continue;
    }
    const bool aborted = v == kStageAbort;
    const GemmParams& p = j == 0 ? p1 : p2;
    int32_t g, m0, n0, mBlk, nBlk;
    chainTileAt<Tr1, Tr2>(j, p, sm, aborted ? 0 : (int32_t)v, &g, &m0, &n0, &mBlk, &nBlk);
    tileMainLoop<Tr1, true>(sm, stageAbort, acc, 0, p.kTiles, wg, lane, stage, phase);
    if (aborted) break;  // producer gave up (timeout/abort): no epilogue, stop
    if (p.hooks.tileDone != nullptr && pending >= 0) publishTile(p, pending, wg);
    chainTestDelay(delayUs, (int32_t)v);  // v is a tile id here (aborted broke out above)
    if (j == 0) {
      tileEpilogue<Tr1>(p1, sm, acc, wg, m0, n0, nStores);
    } else {
      tileEpilogue<Tr2>(p2, sm, acc, wg, m0, n0, nStores);
    }
    pending = mBlk * p.tilesN + nBlk;
  }
  // Both WGs leave the loop at the same word, so publishTile's barrier sees all 256 threads.
  const GemmParams& p = j == 0 ? p1 : p2;
  if (p.hooks.tileDone != nullptr && pending >= 0) publishTile(p, pending, wg);
  // Shared memory must outlive the last bulk stores reading it.
  if ((threadIdx.x & 127) == 0) ptx::bulkWait<0>();
}

// One CTA of the chain (every CTA of the grid claims from both GEMMs' tileClaim). Needs
// kThreads threads, Pipe::kSmemBytes of dynamic shared memory and a kernel declared
// __launch_bounds__(kThreads, 1); gemmCtaHandBack<Tr1> frees the shared memory after it.
// testDelayUs: 0, or the tests' late tiles (chainTestDelay).
template <class Tr1, class Tr2>
__device__ __forceinline__ void gemmChainCta(const GemmParams& p1, const GemmParams& p2,
                                             uint8_t* smemRaw, uint32_t testDelayUs = 0) {
  static_assert(std::is_same<typename Tr1::Pipe, typename Tr2::Pipe>::value, "one ring");
  static_assert(Tr1::kF16In == Tr2::kF16In && Tr1::kTransB == Tr2::kTransB, "one main loop");
  static_assert(Tr1::kCluster == 1 && Tr2::kCluster == 1, "single CTAs (dynamic schedule)");
  static_assert(!Tr1::kStreamK && !Tr2::kStreamK, "the dynamic schedule");
  static_assert(Tr1::kGrouped == Tr2::kGrouped, "one group prefix table (or none)");
  using Pipe = typename Tr1::Pipe;
  SmemLayout<Pipe> sm(smemRaw);
  uint32_t* stageAbort = reinterpret_cast<uint32_t*>(sm.empty + Pipe::kStages);  // [kStages]
  if (threadIdx.x == 0) {
    initPipe<Tr1>(sm, stageAbort);
    prefetchMaps(p1);
    prefetchMaps(p2);
  }
  if constexpr (Tr1::kGrouped) groupPrefix(p1, sm.grp);
  __syncthreads();
  const int32_t wg = threadIdx.x / 128;
  if (wg == 0) {
    ptx::setmaxnregDec<kProducerRegs>();
    if (threadIdx.x == 0) chainProducer<Tr1, Tr2>(p1, p2, sm, stageAbort);
  } else {
    ptx::setmaxnregInc<kConsumerRegs>();
    chainConsumer<Tr1, Tr2>(p1, p2, sm, wg - 1, stageAbort, testDelayUs);
  }
}

}  // namespace gemm
}  // namespace mk
