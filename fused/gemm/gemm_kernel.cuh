// The warp-specialised persistent GEMM CTA (sm_90a). Included by the engine's instantiation
// units and by fused operators, which call gemmCta() from their compute role.
//
// One CTA = 3 warpgroups: WG0 is the producer (one thread issues every TMA load into a
// Pipe::kStages ring of 48 KB stages, completed on `full` mbarriers), WG1/WG2 are consumers
// (each owns 64 rows of the 128x256 tile, wgmma m64n256k16 into 128 fp32 registers per
// thread, releases stages on `empty` mbarriers) and run the epilogue: registers ->
// 128B-swizzled staging -> TMA store, through Pipe::kStoreBufs boxes per WG. The CTA walks tiles
// cta, cta + nCtas, ... of the schedule; producer and consumers walk the same list, so the
// producer's loads of the next tile overlap the consumers' epilogue of this one.
//
// Dynamic schedule (GemmParams::tileClaim set, kCluster == 1 only): the producer claims each
// tile with atomicAdd on a device counter instead of walking cta, cta + nCtas, ..., and hands
// the tile id to the consumers through the per-stage word (the stage's first k-step); once
// the claims run past the tile count it publishes an "end" word on the next stage, without
// data. CTAs that join a running GEMM late (a fused kernel's other roles, done with their own
// work) then take whatever tiles are left instead of owning a fixed share that ends last.
//
// CTA pairs (Traits::kCluster == 2, a cluster of 2 along M): the pair walks pair positions
// (row blocks 2*pm and 2*pm + 1 of one column block, one per CTA) with the same k-steps. Each
// producer loads its own A and half of the common B tile, multicast into both CTAs' stage, so
// a stage's `full` barrier still counts 48 KB; a stage is reloaded only once the consumers of
// both CTAs released it (each consumer warp arrives on the `empty` barrier of both).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device/rt/ptx_ext.cuh"
#include "device/rt/wait.cuh"
#include "fused/gemm/gemm_epilogue.cuh"
#include "fused/gemm/gemm_streamk.cuh"
#include "fused/gemm/primitives.cuh"
#include "fused/gemm/trace.h"

namespace mk {
namespace gemm {

template <DType kIn, DType kOut, BLayout kB, class PipeT = DeepPipe, bool Gated = false,
          int Cluster = 1, bool StreamK = false>
struct Traits {
  using Pipe = PipeT;
  static constexpr int kCluster = Cluster;
  // The static schedule with a stream-K tail (GemmParams::sk, streamk.h): plain GEMMs only.
  static constexpr bool kStreamK = StreamK;
  static constexpr bool kF16In = kIn == DType::kF16;
  static constexpr int kTransB = kB == BLayout::kKN ? 1 : 0;
  static constexpr int kOutBytes = kOut == DType::kF32 ? 4 : 2;
  static constexpr int kBoxCols = 128 / kOutBytes;  // one 128-byte swizzle row per box row
  // SwiGLU epilogue (GemmArgs::swiglu): a tile's 256 accumulator columns are 128 gate and
  // the 128 up columns they gate; it stores 128 output columns from 64 accumulators a thread.
  static constexpr bool kGated = Gated;
  static constexpr int kOutCols = kGated ? kTileN / 2 : kTileN;
  static constexpr int kAccOut = kGated ? 64 : 128;
  static constexpr int kChunks = kOutCols / kBoxCols;
  static constexpr DType kOutType = kOut;
  static constexpr bool kGrouped = Pipe::kGroupInts > 0;  // GemmArgs::groups
  // Staging boxes of a consumer WG: its own, then those in the lent stage (LendPipe).
  static constexpr int kBufs = Pipe::kStoreBufs + Pipe::kLentBufs;
  // Chunks written between two barriers of the epilogue: all of them when the staging holds
  // a whole half-tile (the previous tile's stores are long done reading it), else one;
  // CarryPipe: a post per half of the half-tile (the carried half's long after the first).
  static constexpr int kGroup = Pipe::kCarry > 0 ? kBufs : (kBufs >= kChunks ? kChunks : 1);
  static_assert(kBufs >= 2 * kGroup || kGroup == kChunks || Pipe::kCarry > 0,
                "partial staging must hold two groups (double buffering)");
  static_assert(Pipe::kCarry == 0 || (kChunks == 2 * kBufs && !kGated),
                "the carried epilogue splits a plain 16-bit half-tile in two halves");
  // The store thread says a lent stage is read after the one post of the tile.
  static_assert(Pipe::kLentBufs == 0 || kGroup == kChunks,
                "lent boxes: the half-tile staged whole, in one post");
  static_assert(!kGated || (kB == BLayout::kNK && kOut != DType::kF32),
                "the SwiGLU epilogue loads gate and up rows of B[N,K] and stores 16-bit D");
  static_assert(Cluster == 1 || (Cluster == 2 && !kGated),
                "CTA pairs run ungated GEMMs (plain or grouped)");
  static_assert(!StreamK || (Cluster == 1 && !kGated && !kGrouped),
                "the stream-K tail runs plain (unpaired, ungrouped, ungated) GEMMs");
};

constexpr int kBarConsumers = 3;  // named barrier over both consumer WGs (ids 1,2: per WG)
constexpr int kBarSide = 4;       // named barrier of gemmCta's side job (96 threads)

// The per-stage word under the dynamic schedule: a tile id (< numTiles), or one of these.
constexpr uint32_t kStageEnd = 0xffffffffu;    // no tile left: the consumers leave their loop
constexpr uint32_t kStageAbort = 0xfffffffeu;  // the producer gave up (timeout/abort)

// ---- producer -----------------------------------------------------------------------------

// Waits for the "rows ready" flags covering rows [m0, m0+128) of A. False on timeout/abort.
__device__ __forceinline__ bool waitRowsReady(const GemmParams& p, int32_t m0) {
  const GemmHooks& h = p.hooks;
  const int32_t last = min(p.M, m0 + kTileM) - 1;
  const uint64_t expected = h.rowReadyExpected + (h.seqBase != nullptr ? *h.seqBase : 0);
  for (int32_t f = m0 / h.rowsPerFlag; f <= last / h.rowsPerFlag; ++f) {
    if (!rt::waitFlag(h.wait, h.rowReady + f, expected, f, h.rowReadySys,
                      h.rowReadyIsPeer ? f : -1))
      return false;
  }
  // The flags were acquired through the generic proxy; the rows are read by TMA (async
  // proxy), which is ordered after the acquire only through this fence.
  ptx::fenceProxyAsync();
  return true;
}

// ---- timeline stamps (GemmParams::trace, trace.h) -------------------------------------------

// kTrace: only the stand-alone kernel's traced instantiation (gemm_launch.cuh) is built with
// the stamps; fused operators' compute roles are not (the stamps' live values spilled in the
// GEMM + collective kernels), nor stream-K, grouped or SwiGLU GEMMs, nor CTA pairs with the
// wide ring (which spilled traced; the deep-ring pairs are traced). The per-tile
// stamps are clock64 values (one SM's counter, so their differences are exact, where
// globaltimer may tick only every microsecond); the headers hold both clocks, which convert
// them to time and line the SMs up.

// Record n of role `row` (0 producer, 1 + wg consumers) of CTA `cta`, or nullptr when tracing
// is off or the role is past its traceTiles records. Only the role's thread 0 stamps.
template <bool kTrace>
__device__ __forceinline__ uint64_t* traceRecord(const GemmParams& p, int32_t cta, int32_t row,
                                                 int32_t n) {
  if constexpr (!kTrace) return nullptr;
  if (p.trace == nullptr || n >= p.traceTiles || cta >= p.traceCtas) return nullptr;
  return p.trace + traceRow(cta, row, p.traceTiles) + (size_t)(1 + n) * kTraceWords;
}

// A traced role's ring wait: mbarWait, adding the cycles it took (a stage already complete
// costs the probe, tens of cycles) to *waited; plain mbarWait when waited is null (untraced).
// Every thread of a traced consumer warpgroup counts (thread 0 stores): counting in thread 0
// alone diverges warp 0 ahead of its wgmmas, and with it the traced ping-pong's unit k-step
// took 0.57 us where session 44's trace had 0.40 (call AK; the cooperative trace kept its span).
// Whether the consumers starve (full waits inside the main loop) or the ring runs full (the
// producer's empty waits) says which side a slow k-step is on. 32 bits (clock()): a register fewer
// next to the 128 accumulators (64 spilled 8 bytes in the traced wide kernel); a tile's waits are
// far below 2^32 cycles.
__device__ __forceinline__ void mbarWaitCounted(uint64_t* bar, uint32_t parity, uint32_t* waited) {
  if (waited == nullptr) {
    ptx::mbarWait(bar, parity);
    return;
  }
  const uint32_t t0 = (uint32_t)clock();
  ptx::mbarWait(bar, parity);
  *waited += (uint32_t)clock() - t0;
}

// The role's header: globaltimer and clock64 at its start (at 0) or end (at 2).
template <bool kTrace>
__device__ __forceinline__ void traceHeader(const GemmParams& p, int32_t cta, int32_t row, int at) {
  if constexpr (!kTrace) return;
  if (p.trace == nullptr || cta >= p.traceCtas) return;
  uint64_t* h = p.trace + traceRow(cta, row, p.traceTiles);
  h[at] = ptx::globalTimerNs();
  h[at + 1] = clock64();
}

// ---- the schedule both roles walk ----------------------------------------------------------

// Positions of the schedule: tiles, or tile pairs for CTA pairs (a pair's CTAs walk
// positions cta / 2, cta / 2 + nCtas / 2, ...).
template <class Tr>
__device__ __forceinline__ int32_t numTilesOf(const GemmParams& p,
                                              const SmemLayout<typename Tr::Pipe>& sm) {
  if constexpr (Tr::kGrouped) return sm.grp[p.grpNum] * p.tilesN;
  if constexpr (Tr::kCluster == 2) return (p.tilesM + 1) / 2 * p.tilesN;
  return p.tilesM * p.tilesN;
}

// Tile t: its group (0 unless grouped), first row and column, and row block (m0 / kTileM:
// group starts are tile-aligned).
template <class Tr>
__device__ __forceinline__ void tileAt(const GemmParams& p, const SmemLayout<typename Tr::Pipe>& sm,
                                       int32_t t, int32_t* group, int32_t* m0, int32_t* n0,
                                       int32_t* mBlk, int32_t* nBlk) {
  if constexpr (Tr::kGrouped && Tr::kCluster == 2) {
    groupPairTile(p, sm.grp, t, (int32_t)ptx::clusterCtaRank(), group, m0, nBlk);
    *mBlk = *m0 / kTileM;
  } else if constexpr (Tr::kGrouped) {
    groupTile(p, sm.grp, t, group, m0, nBlk);
    *mBlk = *m0 / kTileM;
  } else if constexpr (Tr::kCluster == 2) {
    // The raster over row-block pairs (groups of groupM / 2 pairs keep groupM row blocks).
    // With an odd tilesM the last pair's second block is past M: that CTA still takes part
    // in the loads (its B half feeds its partner) and stores nothing.
    int32_t pm;
    rasterCoords((p.tilesM + 1) / 2, p.tilesN, max(1, p.groupM / 2), t, &pm, nBlk);
    *mBlk = 2 * pm + (int32_t)ptx::clusterCtaRank();
    *group = 0;
    *m0 = *mBlk * kTileM;
  } else {
    tileCoords(p, t, mBlk, nBlk);
    *group = 0;
    *m0 = *mBlk * kTileM;
  }
  *n0 = *nBlk * Tr::kOutCols;  // gated: D's first column, also gate's row in B (up: p.N on)
}

// B's box for k-step k of column block n0 (of group g when grouped: B is then 3-D).
template <class Tr>
__device__ __forceinline__ void loadB(const GemmParams& p, uint8_t* dst, uint64_t* bar, int32_t k,
                                      int32_t n0, int32_t g) {
  if constexpr (Tr::kCluster == 2) {
    // This CTA's half of the pair's B tile, into both CTAs: [N,K] rows n0 + 128 r .. (tmB's
    // box is 128 rows for pairs; the same bytes and swizzle as half of one 256-row box), or
    // [K,N] 64-column boxes 2r and 2r + 1.
    const uint32_t r = ptx::clusterCtaRank();
    if constexpr (Tr::kTransB) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int32_t box = 2 * (int32_t)r + j;
        if constexpr (Tr::kGrouped) {
          ptx::tmaLoad3dMulticast(dst + box * (kTileK * 128), &p.tmB, bar, n0 + 64 * box,
                                  k * kTileK, g, 0x3);
        } else {
          ptx::tmaLoad2dMulticast(dst + box * (kTileK * 128), &p.tmB, bar, n0 + 64 * box,
                                  k * kTileK, 0x3);
        }
      }
    } else {
      constexpr int kHalfBytes = (kTileN / 2) * kTileK * 2;
      const int32_t row = n0 + (int32_t)r * (kTileN / 2);
      if constexpr (Tr::kGrouped) {
        ptx::tmaLoad3dMulticast(dst + r * kHalfBytes, &p.tmB, bar, k * kTileK, row, g, 0x3);
      } else {
        ptx::tmaLoad2dMulticast(dst + r * kHalfBytes, &p.tmB, bar, k * kTileK, row, 0x3);
      }
    }
  } else if constexpr (Tr::kGated) {
    // Two 128-row boxes (tmB's box is 128 rows here): gate rows n0.., then up rows p.N + n0..
    // 16 KB further, the same bytes and swizzle as one 256-row box. In the last column tile
    // gate rows past p.N are up rows and up rows past 2 * p.N are TMA's zeros: either only
    // feeds output columns past D's width, which are never stored.
    constexpr int kHalfBytes = (kTileN / 2) * kTileK * 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t row = n0 + h * p.N;
      if constexpr (Tr::kGrouped) {
        ptx::tmaLoad3d(dst + h * kHalfBytes, &p.tmB, bar, k * kTileK, row, g);
      } else {
        ptx::tmaLoad2d(dst + h * kHalfBytes, &p.tmB, bar, k * kTileK, row);
      }
    }
  } else if constexpr (Tr::kTransB) {
#pragma unroll
    for (int j = 0; j < kTileN / 64; ++j) {
      if constexpr (Tr::kGrouped) {
        ptx::tmaLoad3d(dst + j * (kTileK * 128), &p.tmB, bar, n0 + 64 * j, k * kTileK, g);
      } else {
        ptx::tmaLoad2d(dst + j * (kTileK * 128), &p.tmB, bar, n0 + 64 * j, k * kTileK);
      }
    }
  } else if constexpr (Tr::kGrouped) {
    ptx::tmaLoad3d(dst, &p.tmB, bar, k * kTileK, n0, g);
  } else {
    ptx::tmaLoad2d(dst, &p.tmB, bar, k * kTileK, n0);
  }
}

// Whether the kernel lends each tile's last stage to the epilogue: LendPipe, wherever the store
// threads issue the stores (buildParams resolves storeWarps to 1 for it wherever D goes through
// TMA stores; otherwise nothing is staged, nothing lent). Producer and consumers decide alike.
template <class Tr>
__device__ __forceinline__ bool lendsStage(const GemmParams& p) {
  return Tr::Pipe::kLentBufs > 0 && p.storeWarps != 0;
}

// LendPipe's producer state: bit s of `held` says stage s's last use was a tile's last k-step,
// whose stage the epilogue stages boxes in (wait for lentDone[s] before reloading it); bit s of
// `parity` is the parity of lentDone[s]'s next phase. on: lendsStage.
struct LentRing {
  bool on;
  uint32_t held;
  uint32_t parity;
};

// The loads of one tile's k-steps into the ring (stage, phase advanced), each stage with the
// tile's `word`; when !ok (the rows never came: timeout/abort) the stages complete without
// data, so the consumers drain the tile and stop. lent: LendPipe's state (required with it).
template <class Tr>
__device__ __forceinline__ void produceTile(const GemmParams& p,
                                            const SmemLayout<typename Tr::Pipe>& sm, bool ok,
                                            uint32_t word, int32_t aRow, int32_t n0, int32_t g,
                                            int32_t& stage, uint32_t& phase,
                                            volatile uint32_t* stageAbort, uint64_t* rec = nullptr,
                                            LentRing* lent = nullptr) {
  uint32_t waited = 0;  // traced: cycles in the empty waits after the tile's first load
  for (int32_t k = 0; k < p.kTiles; ++k) {
    mbarWaitCounted(&sm.empty[stage], phase ^ 1, rec != nullptr && k > 0 ? &waited : nullptr);
    if constexpr (Tr::Pipe::kLentBufs > 0) {
      const uint32_t bit = 1u << stage;
      if (lent->held & bit) {  // the stage's last use staged boxes: wait until they are read
        mbarWaitCounted(lentDone(sm, stage), (lent->parity & bit) != 0,
                        rec != nullptr && k > 0 ? &waited : nullptr);
        lent->parity ^= bit;
        lent->held &= ~bit;
      }
      if (lent->on && k == p.kTiles - 1) lent->held |= bit;
    }
    if (rec != nullptr && k == 0) rec[0] = (uint64_t)clock64();
    // Written per stage before the `full` arrive that publishes it, so both consumer WGs read
    // the same verdict for a tile (a single CTA-wide word could change between their reads
    // while the producer runs ahead into the next tile).
    stageAbort[stage] = word;
    if (ok) {
      ptx::mbarArriveExpectTx(&sm.full[stage], kStageBytes);
      ptx::tmaLoad2d(sm.a(stage), &p.tmA, &sm.full[stage], k * kTileK, aRow);
      loadB<Tr>(p, sm.b(stage), &sm.full[stage], k, n0, g);
    } else {
      ptx::mbarArrive(&sm.full[stage]);
    }
    if (++stage == Tr::Pipe::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  if (rec != nullptr) {
    rec[1] = (uint64_t)clock64();
    rec[2] = waited;
  }
}

// kDyn: the dynamic schedule (tiles claimed from p.tileClaim; `cta` unused; `nCtas` only for
// p.claimReset, set by the stand-alone launch, whose nCtas is the grid).
// (LendPipe: LentRing tracks the stages whose last use was a tile's last k-step.)
template <class Tr, bool kDyn, bool kTrace>
__device__ __forceinline__ void gemmProducer(const GemmParams& p,
                                             const SmemLayout<typename Tr::Pipe>& sm, int32_t cta,
                                             int32_t nCtas, volatile uint32_t* stageAbort) {
  static_assert(!kDyn || Tr::kCluster == 1, "CTA pairs walk the static schedule only");
  const int32_t numTiles = numTilesOf<Tr>(p, sm);
  int32_t stage = 0;
  uint32_t phase = 0;
  int32_t nth = 0;  // tiles walked (trace records)
  LentRing lent{lendsStage<Tr>(p), 0u, 0u};
  int32_t t = kDyn ? atomicAdd(p.tileClaim, 1) : cta / Tr::kCluster;
  for (; t < numTiles; t = kDyn ? atomicAdd(p.tileClaim, 1) : t + nCtas / Tr::kCluster) {
    int32_t g, m0, n0, mBlk, nBlk;
    tileAt<Tr>(p, sm, t, &g, &m0, &n0, &mBlk, &nBlk);
    const bool ok = p.hooks.rowReady == nullptr || waitRowsReady(p, m0);
    // A pair's row block past M (or past its group) loads the last real one of A (never
    // stored): in-bounds boxes only.
    const int32_t aRow = Tr::kCluster == 2 ? min(m0, (p.tilesM - 1) * kTileM) : m0;
    // Dynamic: the tile id as the word.
    const uint32_t word = kDyn ? (ok ? (uint32_t)t : kStageAbort) : (ok ? 0u : 1u);
    produceTile<Tr>(p, sm, ok, word, aRow, n0, g, stage, phase, stageAbort,
                    traceRecord<kTrace>(p, cta, 0, nth++), &lent);
    if (!ok) return;  // the consumers stop at the aborted tile: no end word
  }
  if constexpr (kDyn) {
    // Every CTA's producer claims until one claim fails, so the counter ends at numTiles +
    // nCtas, and the claim that returned numTiles + nCtas - 1 was the launch's last: no CTA
    // touches the counter after it (the stand-alone kernel: nCtas is the grid).
    if (p.claimReset != 0 && t == numTiles + nCtas - 1) atomicExch(p.tileClaim, 0);
    // No tile left: the end word on the next stage, once the consumers released it, completing
    // its phase without data (the consumers read the word before touching the stage).
    ptx::mbarWait(&sm.empty[stage], phase ^ 1);
    stageAbort[stage] = kStageEnd;
    ptx::mbarArrive(&sm.full[stage]);
  }
}

// The stream-K schedule's producer (Traits::kStreamK): the CTA's items (streamk.h), each
// tile's k-steps [kBegin, kEnd) only. No hooks take part (canImplement), so nothing aborts.
template <class Tr>
__device__ __forceinline__ void gemmProducerSk(const GemmParams& p,
                                               const SmemLayout<typename Tr::Pipe>& sm, int32_t cta,
                                               volatile uint32_t* stageAbort) {
  int32_t stage = 0;
  uint32_t phase = 0;
  SkWalk w;
  skWalkBegin(p.sk, cta, &w);
  int32_t t, kb, ke;
  while (skWalkNext(p.sk, &w, &t, &kb, &ke)) {
    int32_t g, m0, n0, mBlk, nBlk;
    tileAt<Tr>(p, sm, t, &g, &m0, &n0, &mBlk, &nBlk);
    for (int32_t k = kb; k < ke; ++k) {
      ptx::mbarWait(&sm.empty[stage], phase ^ 1);
      stageAbort[stage] = 0u;
      ptx::mbarArriveExpectTx(&sm.full[stage], kStageBytes);
      ptx::tmaLoad2d(sm.a(stage), &p.tmA, &sm.full[stage], k * kTileK, m0);
      loadB<Tr>(p, sm.b(stage), &sm.full[stage], k, n0, g);
      if (++stage == Tr::Pipe::kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
  }
}

// ---- consumer: main loop (the epilogue: gemm_epilogue.cuh) -------------------------------

// Publishes a finished tile (hook 2): its stores complete (wait_group 0, not .read) and
// ordered before the generic-proxy flag release. Called for the previous tile once the next
// tile's main loop is done, so the consumers never stall on their own stores' completion.
__device__ __forceinline__ void publishTile(const GemmParams& p, int32_t id, int32_t wg) {
  const int32_t tid = threadIdx.x & 127;
  if (p.useTmaStore && tid == 0) {
    ptx::bulkWait<0>();
    ptx::fenceProxyAsync();
  }
  __threadfence();
  ptx::namedBarSync(kBarConsumers, 256);
  if (wg == 0 && tid == 0) {
    if (p.hooks.tileDoneRows) {
      uint64_t* rowFlag = p.hooks.tileDone + id / p.tilesN;
      if (p.hooks.tileDoneSys) {
        ptx::redAddReleaseSys(rowFlag, 1);
      } else {
        ptx::redAddReleaseGpu(rowFlag, 1);
      }
    } else {
      const uint64_t base = p.hooks.seqBase != nullptr ? *p.hooks.seqBase : 0;
      rt::releaseFlag(p.hooks.tileDone + id, base + p.hooks.tileDoneValue, p.hooks.tileDoneSys);
    }
  }
}

// No work inside the main loop (tileMainLoop's mid).
struct NoMid {
  __device__ void operator()(int32_t, int32_t) const {}
};

// A consumer warp is done reading a stage: its CTA's producer (and, for CTA pairs, the partner's,
// which multicasts into this CTA's copy of the stage) may reload it. Called by every lane; one
// arrive per warp and CTA: for pairs lane r arrives on CTA r's barrier, both in one instruction
// (not two in a row from lane 0, in the path to the warp's next wgmma).
template <class Tr>
__device__ __forceinline__ void releaseStage(uint64_t* empty, int32_t lane) {
  if constexpr (Tr::kCluster == 2) {
    if (lane < 2) ptx::mbarArriveCluster(empty, (uint32_t)lane);
  } else {
    if (lane == 0) ptx::mbarArrive(empty);
  }
}

// One tile's main loop over k-steps [kb, ke) (a stream-K item's, or the whole tile): each
// stage's wgmmas, the stage released once the next one's are issued; returns with every wgmma
// done and every stage released (stage, phase advanced). lent (LendPipe): gets the last stage
// and the parity of its `empty` phase that these releases complete (gemm_epilogue.cuh).
// kDyn: the caller waited for the first stage (it read the tile's word there). Static schedule:
// returns the abort verdict of the tile's first stage word; dynamic: false (the caller read it).
// waited (traced: every thread counts, thread 0's count is stored): gets the cycles of the full
// waits after the first k-step's. mid(i, n): called after the i-th of the n k-steps is issued
// (and the stage before it released), while its wgmmas run (CarryPipe stages the previous
// tile's carried boxes there).
template <class Tr, bool kDyn, class Mid = NoMid>
__device__ __forceinline__ bool tileMainLoop(const SmemLayout<typename Tr::Pipe>& sm,
                                             const volatile uint32_t* stageAbort, float (&acc)[128],
                                             int32_t kb, int32_t ke, int32_t wg, int32_t lane,
                                             int32_t& stage, uint32_t& phase,
                                             uint32_t* waited = nullptr, int32_t* lent = nullptr,
                                             uint32_t* lentPh = nullptr, Mid&& mid = Mid{}) {
  bool aborted = false;
  int32_t prev = 0;
  uint32_t prevPh = 0;
  for (int32_t k = kb; k < ke; ++k) {
    if (!kDyn || k > kb) mbarWaitCounted(&sm.full[stage], phase, k > kb ? waited : nullptr);
    if (!kDyn && k == kb) {
      // Read by the lane whose arrive hands this stage back to this CTA's producer (lane r
      // arrives on CTA r's barrier) and broadcast: only that lane's read is ordered before the
      // arrive after which the producer rewrites the word for the stage's next load
      // (compute-sanitizer's racecheck flagged the other lanes' reads once a CTA reused a
      // stage; they could not see the new value, but nothing ordered them).
      const int src = Tr::kCluster == 2 ? (int)ptx::clusterCtaRank() : 0;
      const uint32_t v = lane == src ? stageAbort[stage] : 0u;
      aborted = __shfl_sync(0xffffffffu, v, src) != 0;
    }
    const uint32_t a = ptx::smemAddr(sm.a(stage)) + wg * (64 * 128);
    const uint32_t b = ptx::smemAddr(sm.b(stage));
    ptx::fenceAccumulators(acc);
    ptx::wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      const uint64_t da = descKMajor(a + kk * 32);
      const uint64_t db = Tr::kTransB ? descMNMajor(b + kk * 2048) : descKMajor(b + kk * 32);
      // scale-d 0 at the item's first k-step: no accumulator zeroing (a stream-K part too)
      ptx::wgmmaM64N256K16<Tr::kF16In, Tr::kTransB>(acc, da, db, (k > kb || kk > 0) ? 1 : 0);
    }
    ptx::wgmmaCommit();
    ptx::fenceAccumulators(acc);
    // Keep one batch in flight: the previous stage's wgmmas are done, release it.
    ptx::wgmmaWait<1>();
    ptx::fenceAccumulators(acc);
    if (k > kb) releaseStage<Tr>(&sm.empty[prev], lane);
    mid(k - kb, ke - kb);
    prev = stage;
    prevPh = phase;
    if (++stage == Tr::Pipe::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  ptx::wgmmaWait<0>();
  ptx::fenceAccumulators(acc);
  releaseStage<Tr>(&sm.empty[prev], lane);
  if (lent != nullptr) {
    *lent = prev;
    *lentPh = prevPh;
  }
  return aborted;
}

// kDyn: the dynamic schedule (the tile comes with the stage; `cta`, `nCtas` unused).
// Traits::kStreamK: the CTA's stream-K items (streamk.h), parts of tiles included.
// kStoreWarp: the stand-alone kernel (gemm_epilogue.cuh's store warps, when p.storeWarps).
template <class Tr, bool kDyn, bool kTrace, bool kStoreWarp>
__device__ __forceinline__ void gemmConsumer(const GemmParams& p,
                                             const SmemLayout<typename Tr::Pipe>& sm, int32_t cta,
                                             int32_t nCtas, int32_t wg,
                                             const volatile uint32_t* stageAbort) {
  const int32_t numTiles = numTilesOf<Tr>(p, sm);
  const int32_t tid = threadIdx.x & 127, lane = tid & 31;
  float acc[128];
  uint32_t nStores = 0;  // TMA stores issued by this WG (uniform across its threads)
  uint32_t posts = 0;    // groups handed to the store thread (kStoreWarp)
  int32_t pending = -1;  // tile whose stores are issued but not yet published
  int32_t stage = 0;
  uint32_t phase = 0;
  constexpr bool kSK = Tr::kStreamK;
  static_assert(!kSK || !kDyn, "stream-K walks the static schedule");
  // LendPipe: the tile's last stage holds part of the epilogue's staging; only the store
  // threads can say when their stores have read it.
  static_assert(Tr::Pipe::kLentBufs == 0 || kStoreWarp, "LendPipe runs with store threads");
  const bool lend = lendsStage<Tr>(p);
  // CarryPipe: the half-tile's second half carried into the next tile's main loop, where the
  // store threads take the TMA stores, with beta 0; else the kernel runs as the deep ring (the
  // epilogue reads C, or the store threads are off: D not storable through TMA).
  constexpr int kCarry = Tr::Pipe::kCarry;
  [[maybe_unused]] const bool carry =
      kCarry > 0 && kStoreWarp && p.storeWarps != 0 && p.beta == 0.0f;
  Carried carried;
  carried.count = 0;
  // After the second k-step's wgmmas are issued (the only one with a single k-step): the
  // first k-step's wait for its stage is then behind, and the store thread has had the
  // first boxes' post for the time of one k-step more.
  [[maybe_unused]] auto stageCarried = [&](int32_t i, int32_t n) {
    if constexpr (kCarry > 0) {
      if (i == (n > 1 ? 1 : 0)) carryStage<Tr>(sm, wg, &posts, carried);
    }
  };
  SkWalk walk;
  if constexpr (kSK) skWalkBegin(p.sk, cta, &walk);
  int32_t nth = 0;  // tiles walked (trace records)
  for (int32_t t = kDyn ? 0 : cta / Tr::kCluster; kDyn || kSK || t < numTiles;
       t += kSK ? 0 : nCtas / Tr::kCluster) {
    bool aborted = false;
    // Stamped once the tile is known to be one (the dynamic schedule's end word is not).
    uint64_t* rec = tid == 0 ? traceRecord<kTrace>(p, cta, 1 + wg, nth) : nullptr;
    const uint64_t tStart = rec != nullptr ? (uint64_t)clock64() : 0;
    int32_t kb = 0, ke = p.kTiles;  // the item's k-steps: the whole tile unless stream-K
    if constexpr (kSK) {
      if (!skWalkNext(p.sk, &walk, &t, &kb, &ke)) break;
    }
    if constexpr (kDyn) {
      // The tile comes with its first stage, read by lane 0 (whose arrive hands the stage
      // back: see the static path's read below) and broadcast, so both WGs see the same.
      ptx::mbarWait(&sm.full[stage], phase);
      const uint64_t tFirst = rec != nullptr ? (uint64_t)clock64() : 0;
      const uint32_t v = __shfl_sync(0xffffffffu, lane == 0 ? stageAbort[stage] : 0u, 0);
      if (v == kStageEnd) break;  // never released: the producer loads nothing after it
      if (rec != nullptr) rec[1] = tFirst;
      aborted = v == kStageAbort;
      t = aborted ? 0 : (int32_t)v;  // an aborted tile's coordinates are never used
    }
    ++nth;
    if (rec != nullptr) rec[0] = tStart;
    int32_t g, m0, n0, mBlk, nBlk;
    tileAt<Tr>(p, sm, t, &g, &m0, &n0, &mBlk, &nBlk);
    if constexpr (kCarry > 0 && Tr::kGrouped) {
      // The first k-step's wgmmas name the accumulators as inputs (scale-d is a run-time
      // operand), so ptxas keeps the last tile's values alive until then, across the group
      // lookup above; overwriting them here ends their life at their last use. With the carried
      // half also alive, ptxas spilled 16 bytes in this kernel alone (8 with this).
#pragma unroll
      for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
    }
    if (!kDyn && rec != nullptr) {
      // The first stage's wait, ahead of the main loop's own (which then passes at once: the
      // stage cannot move on before this warpgroup releases it).
      ptx::mbarWait(&sm.full[stage], phase);
      rec[1] = (uint64_t)clock64();
    }
    uint32_t waited = 0;
    int32_t lent = -1;
    uint32_t lentPh = 0;
    bool mainAborted;
    if constexpr (kCarry > 0) {
      mainAborted =
          tileMainLoop<Tr, kDyn>(sm, stageAbort, acc, kb, ke, wg, lane, stage, phase,
                                 kTrace ? &waited : nullptr, nullptr, nullptr, stageCarried);
    } else {
      mainAborted =
          tileMainLoop<Tr, kDyn>(sm, stageAbort, acc, kb, ke, wg, lane, stage, phase,
                                 kTrace ? &waited : nullptr, lend ? &lent : nullptr, &lentPh);
    }
    if (mainAborted) aborted = true;
    if (rec != nullptr) {
      rec[2] = (uint64_t)clock64();
      rec[7] = waited;
    }
    if (aborted) break;  // producer gave up (timeout/abort): no epilogue, stop
    if constexpr (kSK) {
      if (kb > 0) {  // a non-finisher part: the partial goes to the finisher, no epilogue
        skStorePartial(p, acc, cta, wg);
        continue;
      }
      // The finisher part (the CTA's last item): the other parts added in, then the epilogue.
      if (ke < p.kTiles && !skAddPartials(p, acc, cta, t, wg)) break;
    }
    if (p.hooks.tileDone != nullptr && pending >= 0) publishTile(p, pending, wg);

    constexpr bool kRegs =
        !(kTrace && Tr::Pipe::kStoreBufs >= 4) && Tr::Pipe::kLentBufs == 0 && kCarry == 0;
    if constexpr (kCarry > 0) {
      if (carry) {
        if (p.alpha == 1.0f) {
          carryEpilogue<Tr, true>(p, sm, acc, wg, m0, n0, &posts, carried, rec);
        } else {
          carryEpilogue<Tr, false>(p, sm, acc, wg, m0, n0, &posts, carried, rec);
        }
      } else {
        tileEpilogue<Tr, kStoreWarp, kRegs>(p, sm, acc, wg, m0, n0, nStores, rec, &posts);
      }
    } else if (!tileEpilogue<Tr, kStoreWarp, kRegs>(p, sm, acc, wg, m0, n0, nStores, rec, &posts,
                                                    lent, lentPh) &&
               lent >= 0 && tid == 0) {
      ptx::mbarArrive(lentDone(sm, lent));  // nothing of this WG staged there
    }
    if (rec != nullptr) rec[3] = (uint64_t)clock64();
    pending = mBlk * p.tilesN + nBlk;
  }
  // Both WGs leave the loop at the same tile (the abort verdict is per stage), so the
  // barrier inside publishTile is reached by all 256 consumer threads.
  if (p.hooks.tileDone != nullptr && pending >= 0) publishTile(p, pending, wg);
  if constexpr (kCarry > 0) carryStage<Tr>(sm, wg, &posts, carried);  // the last tile's
  if (kStoreWarp && p.storeWarps != 0) {
    // The store thread's end: a post of no boxes, once it handed the staging back.
    ptx::mbarWait(storeBar(sm, 1, wg), posts & 1);
    postStores(sm, wg, 0, 0, 0, 0, 0, -1, &posts);
  } else if (tid == 0) {
    ptx::bulkWait<0>();  // shared memory must outlive the last bulk stores reading it
  }
}

// Thread 0, before the CTA's barrier: the ring's barriers and per-stage words.
template <class Tr>
__device__ __forceinline__ void initPipe(const SmemLayout<typename Tr::Pipe>& sm,
                                         uint32_t* stageAbort) {
  for (int s = 0; s < Tr::Pipe::kStages; ++s) {
    ptx::mbarInit(&sm.full[s], 1);
    // one arrive per consumer warp (of both CTAs of a pair)
    ptx::mbarInit(&sm.empty[s], kConsumerWGs * 4 * Tr::kCluster);
    stageAbort[s] = 0;
  }
  ptx::fenceMbarInit();
}

__device__ __forceinline__ void prefetchMaps(const GemmParams& p) {
  ptx::prefetchTensorMap(&p.tmA);
  ptx::prefetchTensorMap(&p.tmB);
  if (p.useTmaStore) ptx::prefetchTensorMap(&p.tmD);
}

// No side job for the producer warpgroup's idle warps (gemmCta).
struct NoSide {
  __device__ void operator()() const {}
};

// One GEMM CTA: CTA `cta` of `nCtas` persistent CTAs. Needs kThreads threads, Pipe::kSmemBytes of
// dynamic shared memory and a kernel declared __launch_bounds__(kThreads, 1) (setmaxnreg).
// `side`: run by the producer warpgroup's warps 1-3 (96 threads, kProducerRegs registers
// each, named barrier kBarSide free for them) while warp 0 feeds the pipeline: a fused
// kernel's memory-bound work that then costs the GEMM no SM. It must not touch the GEMM's
// shared memory, and gemmCta returns to those warps only once it returns.
// kStoreWarp: the stand-alone kernel (gemm_launch.cuh), whose producer warpgroup's warps 1 and
// 2 issue the consumers' TMA stores when p.storeWarps says so (gemm_epilogue.cuh); `side` must
// then be NoSide.
template <class Tr, class Side = NoSide, bool kTraced = false, bool kStoreWarp = false>
__device__ __forceinline__ void gemmCta(const GemmParams& p, uint8_t* smemRaw, int32_t cta,
                                        int32_t nCtas, const Side& side = Side{}) {
  using Pipe = typename Tr::Pipe;
  constexpr bool kTr = kTraced && !Tr::kStreamK;
  SmemLayout<Pipe> sm(smemRaw);
  uint32_t* stageAbort = reinterpret_cast<uint32_t*>(sm.empty + Pipe::kStages);  // [kStages]
  if (threadIdx.x == 0) {
    if constexpr (kStoreWarp) initStoreBars(sm);  // before initPipe's fence
    initPipe<Tr>(sm, stageAbort);
    prefetchMaps(p);
  }
  // Both roles walk the groups' tiles from the same prefix sums (no host synchronisation:
  // the counts are read here, after whatever wrote them earlier in stream order).
  if constexpr (Tr::kGrouped) groupPrefix(p, sm.grp, Tr::kCluster);
  // A pair's partner multicasts into this CTA's stages and arrives on its barriers: both CTAs'
  // barriers are initialised before either CTA goes on.
  if constexpr (Tr::kCluster == 2) {
    ptx::clusterSync();
  } else {
    __syncthreads();
  }
  const int32_t wg = threadIdx.x / 128;
  // The dynamic schedule exists for single CTAs only (the host refuses pairs with tileClaim).
  if (wg == 0) {
    ptx::setmaxnregDec<kProducerRegs>();
    if (threadIdx.x == 0) {
      traceHeader<kTr>(p, cta, 0, 0);
      if constexpr (Tr::kStreamK) {
        gemmProducerSk<Tr>(p, sm, cta, stageAbort);
      } else if constexpr (Tr::kCluster == 1) {
        if (p.tileClaim != nullptr) {
          gemmProducer<Tr, true, kTr>(p, sm, cta, nCtas, stageAbort);
        } else {
          gemmProducer<Tr, false, kTr>(p, sm, cta, nCtas, stageAbort);
        }
      } else {
        gemmProducer<Tr, false, kTr>(p, sm, cta, nCtas, stageAbort);
      }
      traceHeader<kTr>(p, cta, 0, 2);
    } else if (kStoreWarp && p.storeWarps != 0) {
      // Lane 0 of warps 1 .. kConsumerWGs: one store thread a consumer WG.
      const int32_t w = threadIdx.x / 32;
      if ((threadIdx.x & 31) == 0 && w >= 1 && w <= kConsumerWGs) storeThreadLoop<Tr>(p, sm, w - 1);
    } else if (threadIdx.x >= 32) {
      side();
    }
  } else {
    ptx::setmaxnregInc<kConsumerRegs>();
    const bool stamp = (threadIdx.x & 127) == 0;  // trace row wg: consumer warpgroup wg - 1
    if (stamp) traceHeader<kTr>(p, cta, wg, 0);
    if constexpr (Tr::kStreamK) {
      gemmConsumer<Tr, false, kTr, kStoreWarp>(p, sm, cta, nCtas, wg - 1, stageAbort);
    } else if constexpr (Tr::kCluster == 1) {
      if (p.tileClaim != nullptr) {
        gemmConsumer<Tr, true, kTr, kStoreWarp>(p, sm, cta, nCtas, wg - 1, stageAbort);
      } else {
        gemmConsumer<Tr, false, kTr, kStoreWarp>(p, sm, cta, nCtas, wg - 1, stageAbort);
      }
    } else {
      gemmConsumer<Tr, false, kTr, kStoreWarp>(p, sm, cta, nCtas, wg - 1, stageAbort);
    }
    if (stamp) traceHeader<kTr>(p, cta, wg, 2);
  }
  // The partner's consumers arrive on this CTA's `empty` barriers up to their last stage: its
  // shared memory must outlive them.
  if constexpr (Tr::kCluster == 2) ptx::clusterSync();
}

// After gemmCta, for a CTA that goes on with other work in the same kernel (the fused
// reduce role's tail): every warpgroup back at the launch's register count (the producer
// grows only once the consumers have shrunk: setmaxnreg.inc waits for free registers) and the
// pipeline's barriers invalidated, so the shared memory is free for any use. Every thread of
// the CTA must call it; unpaired CTAs only (a partner may still arrive on a pair's barriers).
template <class Tr>
__device__ __forceinline__ void gemmCtaHandBack(uint8_t* smemRaw) {
  static_assert(Tr::kCluster == 1, "a CTA pair's shared memory is not handed back");
  using Pipe = typename Tr::Pipe;
  // PTX wants the warps of a warpgroup synchronised between two of their setmaxnreg (the
  // producer's idle warps would otherwise grow back while the consumers may still wait in
  // their own inc), and converged at it (thread 0 ran the producer alone). The GEMM's roles
  // use named barriers 1.. only, so barrier 0 here meets nothing of theirs.
  __syncthreads();
  if (threadIdx.x / 128 == 0) {
    ptx::setmaxnregInc<kLaunchRegs>();
  } else {
    ptx::setmaxnregDec<kLaunchRegs>();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    SmemLayout<Pipe> sm(smemRaw);
    for (int s = 0; s < Pipe::kStages; ++s) {
      ptx::mbarInval(&sm.full[s]);
      ptx::mbarInval(&sm.empty[s]);
    }
  }
  __syncthreads();
}

}  // namespace gemm
}  // namespace mk
