// Ping-pong consumers (GemmArgs::pipeline = 3): the stand-alone GEMM kernel for small K, where
// a tile's main loop is short and the epilogue (accumulators -> staging -> TMA store) would
// leave the tensor cores idle if both consumer warpgroups finished the same tile together.
//
// The schedule is the engine's (128x256 tiles, grouped raster, tileOrder/rowBlockOffset), but
// each tile is split into two 128x128 halves, one per consumer warpgroup: WG0 always owns
// columns n0..n0+127, WG1 columns n0+128..n0+255. Each half is one "unit" (two m64n128k16 row
// halves, 128 fp32 accumulators a thread, as the other pipelines). The producer loads units in
// the order WG0 tile i, WG1 tile i, WG0 tile i+1, ... into a ring of 32 KB stages (A 128x64 and
// half of B); the consumers take turns in the main loop through an "order" pair of named
// barriers, so WG1's main loop runs during WG0's epilogue and the reverse. Why halves of one
// tile rather than alternate tiles: both warpgroups then walk the same tile list and always
// have the same number of units (no warpgroup without a tile when the CTA's tile count is odd),
// and the rowReady hook and the abort verdict stay per tile as in the other pipelines.
//
// Supported (canImplement): 16-bit D (TMA store, or the direct fallback), alpha, beta (C may
// alias D: every element is read by the thread that writes it, before its write), grouped
// GEMMs (session 31: the groups' tile walk of the other pipelines, B as a 3-D tensor map), the
// rowReady / tileOrder / rowBlockOffset / seqBase hooks (unpaired only). Refused: fp32 D,
// SwiGLU, tile-by-tile D, tileDone.
//
// CTA pairs (PingTraits::kCluster == 2, GemmArgs::cluster = 2; session 43, plain GEMMs without
// hooks, as the cooperative kernel's pairs): a cluster of 2 along M walks pair positions (row
// blocks 2 pm and 2 pm + 1 of one column block) unit by unit in step. Each CTA loads its own
// A and one 64-row half of the unit's B, multicast into both CTAs' stage, so a unit k-step
// reads 24 KB from L2 instead of 32 KB, the cooperative 128x256 tile's bytes per FLOP. Tried
// because the ping-pong's k-step was the slow part (session 42); measured in session 43 (H100)
// slower than unpaired at every K (half k-step 0.420 against 0.392 us at K = 1024): each CTA's
// shared memory still receives every byte, and coupling two rings costs. Opt-in only; see
// docs/gemm-notes.md, session 43.
//
// 192-column units (GemmArgs::pipeline = 4) are gemm_pingunit.cuh's kernel since session 56:
// each warpgroup walks its own units there, not halves of one tile.
//
// Empty halves (session 31): where N % 256 is in 1..128 the last column tile's second half
// lies wholly past N. The other pipelines compute those 128 columns of TMA's zeros (1/12 of
// the MMA work at N = 1408, the MoE small model's GEMM1); here WG1 skips such a half: the
// producer loads nothing for it and WG1 only passes the turn on. Without the rowReady hook
// only, so that no abort verdict (which travels in the stages) can be missed.
#pragma once
#include <cstdint>
#include <type_traits>

#include "fused/gemm/gemm_kernel.cuh"
#include "device/rt/ptx_ext.cuh"

namespace mk {
namespace gemm {

// 5 stages of 32 KB and a whole 128x128 staging area per consumer WG (4 boxes of 64x64 16-bit
// values), so the epilogue writes every box after one barrier and never waits for stores of its
// own tile. 5 * 32 + 64 KB + barriers (+ a grouped GEMM's tile prefix sums) fit the 227 KB
// limit; 6 stages would not.
template <int GroupInts>
struct PingPipeCfg {
  static constexpr int kUnitN = 128;  // columns of one consumer WG's unit: half a tile
  static constexpr int kStages = 5;
  static constexpr int kGroupInts = GroupInts;
  static constexpr int kStageBytesA = kTileM * kTileK * 2;         // 16 KB
  static constexpr int kStageBytesB = kUnitN * kTileK * 2;         // the unit's B: 16 KB
  static constexpr int kStageBytes = kStageBytesA + kStageBytesB;  // 32 KB
  static constexpr int kChunks = kUnitN / 64;                      // 64-column boxes per row half
  static constexpr int kBoxesPerWg = 2 * kChunks;                  // 2 row halves
  static constexpr int kStagingBytes = kConsumerWGs * kBoxesPerWg * kStoreBoxBytes;
  static constexpr int kSmemBytes =
      kStages * kStageBytes + kStagingBytes + kBarrierBytes + 4 * GroupInts + 1024;
  static_assert(kSmemBytes <= kMaxSmemPerBlock, "ping-pong CTA exceeds shared memory");
  static_assert(2 * kStages * 8 + kStages * 4 <= kBarrierBytes, "barrier area too small");
  static_assert(kStageBytesA % 1024 == 0 && kStageBytesB % 1024 == 0, "SW128 alignment");
};
using PingPipe = PingPipeCfg<0>;
using PingGroupPipe = PingPipeCfg<kMaxGroups + 1>;

template <DType kIn, DType kOut, BLayout kB, bool Grouped = false, int Cluster = 1>
struct PingTraits {
  using Pipe = typename std::conditional<Grouped, PingGroupPipe, PingPipe>::type;
  static constexpr bool kGrouped = Grouped;
  static constexpr int kCluster = Cluster;  // releaseStage (gemm_kernel.cuh) reads it too
  static constexpr int kUnitN = Pipe::kUnitN;
  static_assert(Cluster == 1 || (Cluster == 2 && !Grouped), "CTA pairs run plain GEMMs");
  static constexpr int kProducerRegs = gemm::kProducerRegs;
  static constexpr int kConsumerRegs = gemm::kConsumerRegs;
  static_assert(kProducerRegs + kConsumerWGs * kConsumerRegs <= 504, "register budget exceeded");
  static constexpr bool kF16In = kIn == DType::kF16;
  static constexpr int kTransB = kB == BLayout::kKN ? 1 : 0;
  static constexpr DType kOutType = kOut;
  static_assert(kOut != DType::kF32, "ping-pong consumers store 16-bit D only");
};

// Named barrier ids (gemm_kernel.cuh uses 1, 2 per WG and 3 for both consumer WGs): WG w
// waits on kBarOrder + w for its turn in the main loop; the other WG arrives on it.
constexpr int kBarOrder = 4;

template <class Pipe>
struct PingSmem {
  uint8_t* base;
  uint8_t* staging;
  uint64_t* full;
  uint64_t* empty;
  uint32_t* abortWord;  // [kStages]: the producer's verdict for the unit the stage belongs to
  int32_t* grp;         // [Pipe::kGroupInts]: tiles of groups 0..g-1 at [g] (grouped GEMMs)
  __device__ explicit PingSmem(uint8_t* raw) {
    base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    staging = base + Pipe::kStages * Pipe::kStageBytes;
    full = reinterpret_cast<uint64_t*>(staging + Pipe::kStagingBytes);
    empty = full + Pipe::kStages;
    abortWord = reinterpret_cast<uint32_t*>(empty + Pipe::kStages);
    grp = reinterpret_cast<int32_t*>(reinterpret_cast<uint8_t*>(full) + kBarrierBytes);
  }
  __device__ uint8_t* a(int32_t s) const { return base + s * Pipe::kStageBytes; }
  __device__ uint8_t* b(int32_t s) const { return a(s) + Pipe::kStageBytesA; }
};

// The tile list both roles walk: tiles cta, cta + nCtas, ... of the plain GEMM's schedule
// (raster grouped by groupM as for the other pipelines), or of the grouped GEMM's walk over
// its groups (prefix sums in shared memory, as the other pipelines). CTA pairs walk pair
// positions cta / 2, cta / 2 + nCtas / 2, ... (both CTAs of a pair the same list).
template <class Tr>
__device__ __forceinline__ int32_t pingNumTiles(const GemmParams& p,
                                                const PingSmem<typename Tr::Pipe>& sm) {
  if constexpr (Tr::kGrouped) return sm.grp[p.grpNum] * p.tilesN;
  if constexpr (Tr::kCluster == 2) return (p.tilesM + 1) / 2 * p.tilesN;
  return p.tilesM * p.tilesN;
}

template <class Tr>
__device__ __forceinline__ void pingTileAt(const GemmParams& p,
                                           const PingSmem<typename Tr::Pipe>& sm, int32_t t,
                                           int32_t* g, int32_t* m0, int32_t* n0) {
  int32_t mBlk, nBlk;
  if constexpr (Tr::kGrouped) {
    groupTile(p, sm.grp, t, g, m0, &nBlk);
  } else if constexpr (Tr::kCluster == 2) {
    // As the cooperative kernel's pairs (tileAt): with an odd tilesM the last pair's second
    // row block is past M; that CTA still loads (its B halves feed its partner), stores nothing.
    int32_t pm;
    rasterCoords((p.tilesM + 1) / 2, p.tilesN, max(1, p.groupM / 2), t, &pm, &nBlk);
    *g = 0;
    *m0 = (2 * pm + (int32_t)ptx::clusterCtaRank()) * kTileM;
  } else {
    tileCoords(p, t, &mBlk, &nBlk);
    *g = 0;
    *m0 = mBlk * kTileM;
  }
  *n0 = nBlk * 2 * Tr::kUnitN;
}

// Whether tile n0's second half (WG1's unit) is skipped: wholly past N, and no rowReady hook
// (whose failed wait is reported to both WGs through the stages of both units). Producer and
// consumers decide alike from kernel parameters.
template <class Tr>
__device__ __forceinline__ bool pingSkipRight(const GemmParams& p, int32_t n0) {
  return p.hooks.rowReady == nullptr && n0 + Tr::kUnitN >= p.N;
}

// Unit nu's B for k-step k (of group g when grouped), one CTA's: [K,N] as the unit's 64-column
// boxes of kTileK rows (the MN-major descriptor's LBO apart), [N,K] as one box of Tr::kUnitN
// rows (tmB's box for pipelines 3 and 4); rows and columns past N arrive as zeros. Pipeline 3's
// and pipeline 4's producers (gemm_pingunit.cuh).
template <class Tr>
__device__ __forceinline__ void loadUnitB(const GemmParams& p, uint8_t* dst, uint64_t* bar,
                                          int32_t k, int32_t nu, int32_t g) {
  if constexpr (Tr::kTransB) {
#pragma unroll
    for (int j = 0; j < Tr::kUnitN / 64; ++j) {
      if constexpr (Tr::kGrouped) {
        ptx::tmaLoad3d(dst + j * (kTileK * 128), &p.tmB, bar, nu + 64 * j, k * kTileK, g);
      } else {
        ptx::tmaLoad2d(dst + j * (kTileK * 128), &p.tmB, bar, nu + 64 * j, k * kTileK);
      }
    }
  } else if constexpr (Tr::kGrouped) {
    ptx::tmaLoad3d(dst, &p.tmB, bar, k * kTileK, nu, g);
  } else {
    ptx::tmaLoad2d(dst, &p.tmB, bar, k * kTileK, nu);
  }
}

// CTA pairs: this CTA's half of unit nu's B for k-step k, into both CTAs' stage (each CTA's
// `full` barrier then counts its own A, its B half and the partner's: Pipe::kStageBytes).
// [N,K]: rows nu + 64 r .. of a 64-row box (tmB's box for paired ping-pong), the same bytes
// and 128B swizzle as that half of one 128-row box; [K,N]: the unit's 64-column box r.
template <class Tr>
__device__ __forceinline__ void pingLoadBPair(const GemmParams& p, uint8_t* dst, uint64_t* bar,
                                              int32_t k, int32_t nu) {
  const int32_t r = (int32_t)ptx::clusterCtaRank();
  constexpr int kHalfBytes = Tr::Pipe::kStageBytesB / 2;
  if constexpr (Tr::kTransB) {
    ptx::tmaLoad2dMulticast(dst + r * kHalfBytes, &p.tmB, bar, nu + 64 * r, k * kTileK, 0x3);
  } else {
    ptx::tmaLoad2dMulticast(dst + r * kHalfBytes, &p.tmB, bar, k * kTileK, nu + 64 * r, 0x3);
  }
}

// kTrace: the traced instantiation (GemmArgs::trace; trace.h's records, a tile's per role of
// the producer, a unit's per consumer warpgroup), as for the other pipelines.
template <class Tr, bool kTrace>
__device__ __forceinline__ void pingProducer(const GemmParams& p,
                                             const PingSmem<typename Tr::Pipe>& sm, int32_t cta,
                                             int32_t nCtas) {
  using Pipe = typename Tr::Pipe;
  const int32_t numTiles = pingNumTiles<Tr>(p, sm);
  int32_t stage = 0;
  uint32_t phase = 0;
  int32_t nth = 0;  // tiles walked (trace records)
  for (int32_t t = cta / Tr::kCluster; t < numTiles; t += nCtas / Tr::kCluster) {
    uint64_t* rec = traceRecord<kTrace>(p, cta, 0, nth++);
    int32_t g, m0, n0;
    pingTileAt<Tr>(p, sm, t, &g, &m0, &n0);
    // A pair's row block past M loads the last real one (never stored): in-bounds boxes only.
    const int32_t aRow = Tr::kCluster == 2 ? min(m0, (p.tilesM - 1) * kTileM) : m0;
    // One bounded wait per tile: both units read the same rows. On failure both units are
    // still completed (without data) so that both consumer WGs drain this tile and stop.
    const bool ok = p.hooks.rowReady == nullptr || waitRowsReady(p, m0);
    const int32_t halves = pingSkipRight<Tr>(p, n0) ? 1 : 2;
    uint32_t waited = 0;  // traced: cycles in the empty waits after the tile's first load
    for (int32_t h = 0; h < halves; ++h) {
      const int32_t nu = n0 + h * Tr::kUnitN;
      for (int32_t k = 0; k < p.kTiles; ++k) {
        mbarWaitCounted(&sm.empty[stage], phase ^ 1,
                        rec != nullptr && (h > 0 || k > 0) ? &waited : nullptr);
        if (rec != nullptr) rec[h == 0 && k == 0 ? 0 : 1] = (uint64_t)clock64();
        // Per stage, before the arrive that publishes it (see gemmProducer).
        sm.abortWord[stage] = ok ? 0u : 1u;
        if (ok) {
          ptx::mbarArriveExpectTx(&sm.full[stage], Pipe::kStageBytes);
          ptx::tmaLoad2d(sm.a(stage), &p.tmA, &sm.full[stage], k * kTileK, aRow);
          if constexpr (Tr::kCluster == 2) {
            pingLoadBPair<Tr>(p, sm.b(stage), &sm.full[stage], k, nu);
          } else {
            loadUnitB<Tr>(p, sm.b(stage), &sm.full[stage], k, nu, g);
          }
        } else {
          ptx::mbarArrive(&sm.full[stage]);
        }
        if (++stage == Pipe::kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    if (rec != nullptr) rec[2] = waited;
    if (!ok) break;
  }
}

// Registers -> 128B-swizzled staging -> TMA store of one WG's 128 x kUnitN unit: 2 x kChunks
// boxes (row half r of 64 rows, 64-column chunk c), written after a single barrier since the
// staging holds the whole unit; the previous unit's stores were issued a whole main loop of the
// other WG ago. rec: the traced instantiation's stamps (see epilogueTma). Without the multiply when
// alpha is 1, as epilogueTma (a per-box branch: 0 spills here).
template <class Tr>
__device__ __forceinline__ void pingEpilogueTma(const GemmParams& p,
                                                const PingSmem<typename Tr::Pipe>& sm,
                                                float (&acc0)[Tr::kUnitN / 2],
                                                float (&acc1)[Tr::kUnitN / 2], int32_t wg,
                                                int32_t m0, int32_t n0, uint64_t* rec) {
  constexpr int kEC = 64;  // 16-bit columns per 128-byte box row
  constexpr int kChunks = Tr::Pipe::kChunks;
  const int32_t tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
  uint8_t* stg = sm.staging + wg * Tr::Pipe::kBoxesPerWg * kStoreBoxBytes;
  const bool useBeta = p.beta != 0.0f;
  const float alpha = p.alpha;
  const bool unitAlpha = alpha == 1.0f;
  // The whole unit past N, or a pair's row block past M (uniform over the WG).
  if (n0 >= p.N || m0 >= p.M) return;
  const int nRows = m0 + 64 < p.M ? 2 : 1;
  const int nCols = min(kChunks, (p.N - n0 + kEC - 1) / kEC);
  if (tid == 0) ptx::bulkWaitRead<0>();
  ptx::namedBarSync(1 + wg, 128);
  if (rec != nullptr) rec[4] = (uint64_t)clock64();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float(&acc)[Tr::kUnitN / 2] = r == 0 ? acc0 : acc1;
    if (r >= nRows) break;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (c >= nCols) break;
      uint8_t* buf = stg + (kChunks * r + c) * kStoreBoxBytes;
      if (!useBeta) {
        const float* box = acc + c * kEC / 2;  // 8 groups of 4 accumulators
        if (unitAlpha) {
          stageBoxStmatrix<Tr::kOutType, true>(buf, box, alpha, warp, lane);
        } else {
          stageBoxStmatrix<Tr::kOutType, false>(buf, box, alpha, warp, lane);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kEC / 8; ++j) {
          const int ib = (c * kEC / 8 + j) * 4;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int32_t rr = warp * 16 + (lane >> 2) + 8 * h;
            const int32_t cc = 8 * j + 2 * (lane & 3);
            float v0 = alpha * acc[ib + 2 * h], v1 = alpha * acc[ib + 2 * h + 1];
            const int32_t gm = m0 + 64 * r + rr, gn = n0 + c * kEC + cc;
            if (gm < p.M) {
              const int64_t idx = (int64_t)gm * p.ldc + gn;
              if (gn < p.N) v0 += p.beta * loadOut<Tr::kOutType>(p.C, idx);
              if (gn + 1 < p.N) v1 += p.beta * loadOut<Tr::kOutType>(p.C, idx + 1);
            }
            const uint32_t byte = cc * 2;
            uint8_t* dst = buf + rr * 128 + ((((byte >> 4) ^ (rr & 7))) << 4) + (byte & 15);
            *reinterpret_cast<uint32_t*>(dst) = pack2<Tr::kOutType>(v0, v1);
          }
        }
      }
    }
  }
  if (rec != nullptr) rec[5] = (uint64_t)clock64();
  // generic-proxy writes above, read next by the TMA engine (async proxy)
  ptx::fenceProxyAsyncShared();
  ptx::namedBarSync(1 + wg, 128);
  if (rec != nullptr) rec[6] = (uint64_t)clock64();
  if (tid == 0) {
    for (int r = 0; r < nRows; ++r) {
      for (int c = 0; c < nCols; ++c) {
        ptx::tmaStore2d(&p.tmD, stg + (kChunks * r + c) * kStoreBoxBytes, n0 + c * kEC,
                        m0 + 64 * r);
      }
    }
    ptx::bulkCommit();
  }
}

// D not describable by a tensor map: bounds-checked scalar stores straight from the fragment
// (m64nN fragment: thread's value i is row 16 warp + lane / 4 + 8 ((i >> 1) & 1), column
// 8 (i >> 2) + 2 (lane & 3) + (i & 1)).
template <class Tr>
__device__ __forceinline__ void pingEpilogueDirect(const GemmParams& p,
                                                   float (&acc0)[Tr::kUnitN / 2],
                                                   float (&acc1)[Tr::kUnitN / 2], int32_t m0,
                                                   int32_t n0) {
  constexpr int kR = Tr::kUnitN / 2;
  const int32_t tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float(&acc)[kR] = r == 0 ? acc0 : acc1;
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const int32_t gm = m0 + 64 * r + warp * 16 + (lane >> 2) + 8 * ((i >> 1) & 1);
      const int32_t gn = n0 + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
      if (gm < p.M && gn < p.N) {
        float v = p.alpha * acc[i];
        if (p.beta != 0.0f) v += p.beta * loadOut<Tr::kOutType>(p.C, (int64_t)gm * p.ldc + gn);
        storeOut<Tr::kOutType>(p.D, (int64_t)gm * p.ldd + gn, v);
      }
    }
  }
}

// A consumer warpgroup's position in the stage ring. Its units are every other unit of the
// ring (the other warpgroup's in between), so it skips whole units with advance().
template <int kStages>
struct RingPos {
  int32_t stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void next() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  __device__ __forceinline__ void advance(int32_t steps) {
    // steps < 2^31 ring positions; a stage wraps every kStages, flipping the phase.
    const int32_t s = stage + steps % kStages;
    const int32_t laps = steps / kStages + (s >= kStages ? 1 : 0);
    stage = s >= kStages ? s - kStages : s;
    phase ^= (uint32_t)(laps & 1);
  }
};

// One k-step of a 128 x UnitN unit from stage (a, b): both row halves' wgmmas (A rows 0..63 and
// 64..127 against the same B), committed; returns once the previous k-step's are done, so the
// caller may release that stage. first: the unit's first k-step (accumulators start at 0).
template <int UnitN, bool kF16In, int kTransB>
__device__ __forceinline__ void pingKStep(uint32_t a, uint32_t b, float (&acc0)[UnitN / 2],
                                          float (&acc1)[UnitN / 2], bool first) {
  ptx::fenceRegs(acc0);
  ptx::fenceRegs(acc1);
  ptx::wgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kTileK / 16; ++kk) {
    const uint64_t db = kTransB ? descMNMajor(b + kk * 2048) : descKMajor(b + kk * 32);
    const int scale = (!first || kk > 0) ? 1 : 0;
    ptx::wgmmaSS<UnitN, kF16In, kTransB>(acc0, descKMajor(a + kk * 32), db, scale);
    ptx::wgmmaSS<UnitN, kF16In, kTransB>(acc1, descKMajor(a + 64 * 128 + kk * 32), db, scale);
  }
  ptx::wgmmaCommit();
  ptx::fenceRegs(acc0);
  ptx::fenceRegs(acc1);
  ptx::wgmmaWait<1>();
  ptx::fenceRegs(acc0);
  ptx::fenceRegs(acc1);
}

// Consumer WG `wg` (0 or 1). Turn-taking: before each unit but WG0's first, the WG waits on
// its order barrier (bar.sync, 256 threads: its own 128 plus the other WG's 128 arrivals);
// after its main loop it arrives on the other WG's barrier, then runs its epilogue while the
// other WG computes. Every bar.sync is matched by exactly one bar.arrive:
//  - WG0 arrives on WG1's barrier after every unit it ran, and WG1 runs exactly those units
//    (both walk the same tile list and stop after the same tile: the abort verdict is the
//    producer's per-tile one, written into every stage of both units), so WG1 syncs once per
//    WG0 arrive.
//  - WG1 arrives on WG0's barrier after a unit only when WG0 will run another one (a next
//    tile exists and this one was not aborted); WG0 syncs before each unit but its first.
// So no WG waits on a barrier the other will never arrive on, whatever the tile count (1 tile
// per CTA, an odd count, budget 1), and no arrive is left pending at exit. An empty half
// (pingSkipRight: never aborted, since there is no rowReady hook) is a unit WG1 runs without a
// main loop: it takes its turn and passes it on as after a unit. The mbarrier waits are plain
// try_wait loops like the other pipelines' (the producer completes every stage, with or
// without data; its only external wait, rowReady, is the engine's bounded rt::waitFlag).
template <class Tr, bool kTrace>
__device__ __forceinline__ void pingConsumer(const GemmParams& p,
                                             const PingSmem<typename Tr::Pipe>& sm, int32_t cta,
                                             int32_t nCtas, int32_t wg) {
  constexpr int kStages = Tr::Pipe::kStages;
  const int32_t numTiles = pingNumTiles<Tr>(p, sm);
  const int32_t tid = threadIdx.x & 127, lane = tid & 31;
  const int32_t kTiles = p.kTiles;
  float acc0[Tr::kUnitN / 2], acc1[Tr::kUnitN / 2];
  // Ring position of this WG's first unit: WG1's units follow WG0's of the same tile.
  RingPos<kStages> ring;
  if (wg == 1) ring.advance(kTiles);
  bool first = true;
  int32_t nth = 0;  // units run (trace records)
  const int32_t step = nCtas / Tr::kCluster;
  for (int32_t t = cta / Tr::kCluster; t < numTiles; t += step) {
    const uint64_t tStart = kTrace ? (uint64_t)clock64() : 0;
    int32_t g, m0, n0;
    pingTileAt<Tr>(p, sm, t, &g, &m0, &n0);
    const bool skipRight = pingSkipRight<Tr>(p, n0);
    n0 += wg * Tr::kUnitN;
    if (wg == 1 || !first) ptx::namedBarSync(kBarOrder + wg, 256);
    first = false;
    if (wg == 1 && skipRight) {
      // No stage of this tile is WG1's; the ring's next positions are WG0's next unit.
      if (t + step < numTiles) ptx::namedBarArrive(kBarOrder, 256);
      ring.advance(kTiles);
      continue;
    }
    uint64_t* rec = tid == 0 ? traceRecord<kTrace>(p, cta, 1 + wg, nth) : nullptr;
    ++nth;
    if (rec != nullptr) rec[0] = tStart;
    int32_t prev = 0;
    bool aborted = false;
    uint32_t waited = 0;  // traced: cycles in the full waits after the first k-step's
    for (int32_t k = 0; k < kTiles; ++k) {
      mbarWaitCounted(&sm.full[ring.stage], ring.phase, kTrace && k > 0 ? &waited : nullptr);
      if (k == 0 && rec != nullptr) rec[1] = (uint64_t)clock64();
      if (k == 0) {
        // Read by the lane whose arrive hands the stage back to this CTA's producer (lane r
        // arrives on CTA r's barrier in a pair) and broadcast (see tileMainLoop).
        const int src = Tr::kCluster == 2 ? (int)ptx::clusterCtaRank() : 0;
        const uint32_t v = lane == src ? sm.abortWord[ring.stage] : 0u;
        aborted = __shfl_sync(0xffffffffu, v, src) != 0;
      }
      pingKStep<Tr::kUnitN, Tr::kF16In, Tr::kTransB>(
          ptx::smemAddr(sm.a(ring.stage)), ptx::smemAddr(sm.b(ring.stage)), acc0, acc1, k == 0);
      if (k > 0) releaseStage<Tr>(&sm.empty[prev], lane);
      prev = ring.stage;
      ring.next();
    }
    const bool more = !aborted && t + step < numTiles;
    // The turn goes to the other WG once this WG's last batch is issued: its wgmmas queue
    // behind these on the tensor cores while this WG waits for them and runs its epilogue.
    if (wg == 0 || more) ptx::namedBarArrive(kBarOrder + (1 - wg), 256);
    ptx::wgmmaWait<0>();
    ptx::fenceRegs(acc0);
    ptx::fenceRegs(acc1);
    if (rec != nullptr) {
      rec[2] = (uint64_t)clock64();
      rec[7] = waited;
    }
    releaseStage<Tr>(&sm.empty[prev], lane);
    if (aborted) break;  // producer gave up (timeout/abort): no epilogue, stop
    if (p.useTmaStore) {
      pingEpilogueTma<Tr>(p, sm, acc0, acc1, wg, m0, n0, rec);
    } else {
      pingEpilogueDirect<Tr>(p, acc0, acc1, m0, n0);
    }
    if (rec != nullptr) rec[3] = (uint64_t)clock64();
    // Skip the other WG's unit of the ring: WG1's of this tile (none when it is empty), or
    // WG0's of the next tile.
    ring.advance(wg == 0 && skipRight ? 0 : kTiles);
  }
  // Shared memory must outlive the last bulk stores reading it.
  if (tid == 0) ptx::bulkWait<0>();
}

template <class Tr, bool kTrace = false>
__global__ void __launch_bounds__(kThreads, 1)
    gemmPingKernel(const __grid_constant__ GemmParams p) {
  using Pipe = typename Tr::Pipe;
  extern __shared__ uint8_t smemRaw[];
  PingSmem<Pipe> sm(smemRaw);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Pipe::kStages; ++s) {
      ptx::mbarInit(&sm.full[s], 1);
      // one arrive per warp of the one WG that reads the stage (in both CTAs of a pair)
      ptx::mbarInit(&sm.empty[s], 4 * Tr::kCluster);
      sm.abortWord[s] = 0;
    }
    ptx::fenceMbarInit();
    ptx::prefetchTensorMap(&p.tmA);
    ptx::prefetchTensorMap(&p.tmB);
    if (p.useTmaStore) ptx::prefetchTensorMap(&p.tmD);
  }
  // Both roles walk the groups' tiles from the same prefix sums (warp 0; no host
  // synchronisation: counts are read on the device).
  if constexpr (Tr::kGrouped) groupPrefix(p, sm.grp);
  // A pair's partner multicasts into this CTA's stages and arrives on its barriers: both CTAs'
  // barriers are initialised before either goes on.
  if constexpr (Tr::kCluster == 2) {
    ptx::clusterSync();
  } else {
    __syncthreads();
  }
  const int32_t wg = threadIdx.x / 128;
  if (wg == 0) {
    ptx::setmaxnregDec<Tr::kProducerRegs>();
    if (threadIdx.x == 0) {
      traceHeader<kTrace>(p, blockIdx.x, 0, 0);
      pingProducer<Tr, kTrace>(p, sm, blockIdx.x, gridDim.x);
      traceHeader<kTrace>(p, blockIdx.x, 0, 2);
    }
  } else {
    ptx::setmaxnregInc<Tr::kConsumerRegs>();
    const bool stamp = (threadIdx.x & 127) == 0;  // trace row wg: consumer warpgroup wg - 1
    if (stamp) traceHeader<kTrace>(p, blockIdx.x, wg, 0);
    pingConsumer<Tr, kTrace>(p, sm, blockIdx.x, gridDim.x, wg - 1);
    if (stamp) traceHeader<kTrace>(p, blockIdx.x, wg, 2);
  }
  // The partner arrives on this CTA's `empty` barriers up to its last stage, and its
  // producer's last multicasts land here: the shared memory must outlive both.
  if constexpr (Tr::kCluster == 2) ptx::clusterSync();
}

}  // namespace gemm
}  // namespace mk
