// Ping-pong over whole 128x192 units (GemmArgs::pipeline = 4, session 56): the stand-alone
// GEMM kernel for small K modelled on cuBLAS's fastest kernel at 8192x8192x1024 (H100, session
// 55's free-clock ncu: a ping-pong of 176-column units with 5 stages, 174 us against the
// engine's 190; 93% of the tensor peak per SM cycle where the engine's cooperative tile runs
// 82%).
//
// What differs from the half-tile ping-pong (gemm_pingpong.cuh, pipeline 3) and from session
// 44's first 192-column kernel (3 stages of 40 KB next to 96 KB of staging, slower at every K):
//  - the schedule is units, not tiles: D is cut into 128x192 units (GemmParams::tilesN counts
//    192-column units), CTA c walks units c, c + grid, ... and its consumer warpgroups take
//    them in turn (local unit j goes to WG j % 2). At 8192x8192 that is 2752 units on 132
//    SMs, 20.85 a CTA on average and at most 21 (the walk 99.3% busy), where 128x384
//    tiles left CTAs with 20 or 22 units and the 128x256 tiles 15 or 16 tiles (97%);
//  - five 40 KB stages, so three can load while a warpgroup holds two (the k-step it computes
//    and the one whose wgmmas are retiring); session 44's three stages left one loading;
//  - a small staging (session 57): one 8 KB box a WG beside the 200 KB of stages, through which
//    the unit's six 64x64 boxes of D leave by TMA stores, one after another. Register stores (8
//    columns per 16-byte store after a transpose inside each quad, gemm_epilogue.cuh
//    quadTranspose; session 56) took 4.7 us a unit in its trace, more than a main loop at
//    K = 512. A staging lent from the unit's last stage was not taken: the stage would stay
//    out of the ring until the stores read it, and the whole GPU's epilogues write at the
//    rate of HBM (session 47: two boxes a WG read in ~1.5 us), so the producer would wait for
//    it within the other WG's first four k-steps. Register stores stay for beta != 0 (C read
//    element by element at the accumulators' positions before the transpose; C may alias D: the
//    quad's shuffles order every read of a quad before its stores, and no other thread touches
//    those elements) and GemmArgs::regStores = 1.
// So: plain unpaired GEMMs without hooks, 16-bit D with 16-byte aligned rows and N % 8 == 0
// (canImplement); B either layout ([N,K] one 192-row box, [K,N] three 64-column boxes).
// Session 63 added 176-column units (B [N,K] only; gemm.h unitWidth picks them under
// MKERNEL_GEMM_UNIT_NARROW, e.g. where 176 tiles N exactly and 192 does not): two whole boxes
// staged, the last 48 columns from registers.
//
// Turn-taking: as pipeline 3's order barriers (kBarOrder + wg), generalised to any unit count:
// WG w waits before each of its units but WG0's first, and after a unit's main loop arrives on
// the other WG's barrier when a next unit exists (which is the other WG's). Every wait thus has
// exactly one arrive, whatever the count (0, 1, odd), and none is left pending at exit. There
// is no abort verdict: without hooks the producer never waits outside the ring.
#pragma once
#include <cstdint>

#include "fused/gemm/gemm_pingpong.cuh"

namespace mk {
namespace gemm {

// GroupInts: a grouped GEMM's tile prefix sums (kMaxGroups + 1 ints) after the barriers.
// UnitN: kPingUnitN, or kPingUnitNarrowN where unitWidth (gemm.h) picks it (e.g. 1408 = 8 x 176,
// where 192-column units and 256-column tiles both compute a twelfth of zero columns).
template <int GroupInts, int UnitN = kPingUnitN>
struct UnitPipeCfg {
  static constexpr int kUnitN = UnitN;
  static constexpr int kStages = 5;
  static constexpr int kGroupInts = GroupInts;
  static constexpr int kStageBytesA = kTileM * kTileK * 2;             // 16 KB
  static constexpr int kStageBytesB = kUnitN * kTileK * 2;             // 24 KB (176: 22 KB)
  static constexpr int kStageBytes = kStageBytesA + kStageBytesB;      // 40 KB (176: 38 KB)
  static constexpr int kChunks = kUnitN / 64;                          // whole 64-column boxes
  static constexpr int kTailCols = kUnitN % 64;                        // 176: 48 columns more
  static constexpr int kStagingBytes = kConsumerWGs * kStoreBoxBytes;  // a box a consumer WG
  static constexpr int kSmemBytes =
      kStages * kStageBytes + kStagingBytes + kBarrierBytes + 4 * GroupInts + 1024;
  static_assert(kSmemBytes <= kMaxSmemPerBlock, "unit ping-pong CTA exceeds shared memory");
  static_assert(2 * kStages * 8 + kStages * 4 <= kBarrierBytes, "barrier area too small");
  static_assert(kStageBytesA % 1024 == 0 && kStageBytesB % 1024 == 0, "SW128 alignment");
  // wgmma's N steps by 8 up to 256 (m64nNk16); the register stores take 8 columns a lane.
  static_assert(kUnitN % 16 == 0 && kUnitN <= 256, "unit width");
};
static_assert(UnitPipeCfg<0>::kUnitN == kPingUnitN, "host and kernel unit widths");

// Grouped (session 57): the groups' 128-row blocks (groupPrefix / groupTile, as the other
// kernels) by 192-column units, B [G][N,K] or [G][K,N] through a 3-D tensor map. The narrow
// unit (176 columns, session 63) takes B [N,K] only: [K,N] arrives in 64-column boxes.
template <DType kIn, DType kOut, BLayout kB, bool Grouped = false, int UnitN = kPingUnitN>
struct UnitTraits {
  using Pipe = UnitPipeCfg<Grouped ? kMaxGroups + 1 : 0, UnitN>;
  static constexpr int kCluster = 1;  // launchKernel and releaseStage read it
  static constexpr bool kGrouped = Grouped;
  static constexpr int kUnitN = Pipe::kUnitN;
  static constexpr int kAcc = kUnitN / 2;  // fp32 accumulators a consumer thread, a row half
  // kUnitN fp32 accumulators a consumer thread; the producer thread's walk fits 24.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kProducerRegs + kConsumerWGs * kConsumerRegs <= 504, "register budget exceeded");
  static constexpr bool kF16In = kIn == DType::kF16;
  static constexpr int kTransB = kB == BLayout::kKN ? 1 : 0;
  static constexpr DType kOutType = kOut;
  static_assert(kOut != DType::kF32, "16-byte stores of 8 columns: 16-bit D only");
  static_assert(kB == BLayout::kNK || kUnitN % 64 == 0, "[K,N] units: whole 64-column boxes");
};

// Units this CTA walks: cta, cta + nCtas, ... below the row blocks (the groups' when grouped)
// times tilesN.
template <class Tr>
__device__ __forceinline__ int32_t unitCount(const GemmParams& p,
                                             const PingSmem<typename Tr::Pipe>& sm, int32_t cta,
                                             int32_t nCtas) {
  const int32_t units = (Tr::kGrouped ? sm.grp[p.grpNum] : p.tilesM) * p.tilesN;
  return cta < units ? (units - cta + nCtas - 1) / nCtas : 0;
}

// Unit t's group (0 when not grouped), first row and first column.
template <class Tr>
__device__ __forceinline__ void unitAt(const GemmParams& p, const PingSmem<typename Tr::Pipe>& sm,
                                       int32_t t, int32_t* g, int32_t* m0, int32_t* n0) {
  int32_t mBlk, nBlk;
  if constexpr (Tr::kGrouped) {
    groupTile(p, sm.grp, t, g, m0, &nBlk);
  } else {
    tileCoords(p, t, &mBlk, &nBlk);
    *g = 0;
    *m0 = mBlk * kTileM;
  }
  *n0 = nBlk * Tr::kUnitN;
}

// Records (traced instantiation): one a unit, words 0 / 1 the unit's first and last loads'
// issue, 2 the empty waits between them.
template <class Tr, bool kTrace>
__device__ __forceinline__ void unitProducer(const GemmParams& p,
                                             const PingSmem<typename Tr::Pipe>& sm, int32_t cta,
                                             int32_t nCtas) {
  using Pipe = typename Tr::Pipe;
  const int32_t n = unitCount<Tr>(p, sm, cta, nCtas);
  RingPos<Pipe::kStages> ring;
  for (int32_t j = 0; j < n; ++j) {
    uint64_t* rec = traceRecord<kTrace>(p, cta, 0, j);
    int32_t g, m0, n0;
    unitAt<Tr>(p, sm, cta + j * nCtas, &g, &m0, &n0);
    uint32_t waited = 0;
    for (int32_t k = 0; k < p.kTiles; ++k) {
      const int32_t s = ring.stage;
      mbarWaitCounted(&sm.empty[s], ring.phase ^ 1, rec != nullptr && k > 0 ? &waited : nullptr);
      if (rec != nullptr) {
        const uint64_t now = (uint64_t)clock64();
        if (k == 0) rec[0] = now;
        rec[1] = now;
      }
      ptx::mbarArriveExpectTx(&sm.full[s], Pipe::kStageBytes);
      ptx::tmaLoad2d(sm.a(s), &p.tmA, &sm.full[s], k * kTileK, m0);
      loadUnitB<Tr>(p, sm.b(s), &sm.full[s], k, n0, g);
      ring.next();
    }
    if (rec != nullptr) rec[2] = waited;
  }
}

// Groups [J0, J1) of one row half's accumulators (m64nUnitN fragment: thread value 4g + 2h + e
// is row 16 warp + lane / 4 + 8 h, column 8 g + 2 (lane & 3) + e) to D rows m0.., columns n0..:
// 16-byte stores after quadTranspose (lane q gets group j0 + q of groups j0..j0+3; a last set
// of fewer than four groups leaves lanes past J1 without a store: 176 columns are 5.5 sets).
// N % 8 == 0, so a group is wholly inside or past N.
template <class Tr, bool kUnitAlpha, bool kBeta, int J0 = 0, int J1 = Tr::kUnitN / 8>
__device__ __forceinline__ void unitStoreHalf(const GemmParams& p, const float (&acc)[Tr::kAcc],
                                              int32_t m0, int32_t n0) {
  const int32_t tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31, q = lane & 3;
  const int32_t row0 = m0 + warp * 16 + (lane >> 2);
  uint16_t* d = static_cast<uint16_t*>(p.D);
#pragma unroll
  for (int j0 = J0; j0 < J1; j0 += 4) {
    if (n0 + 8 * j0 >= p.N) break;  // uniform over the warpgroup: later groups are past N too
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t row = row0 + 8 * h;
      uint32_t v[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        if (j0 + t >= J1) {  // past the unit (a set of fewer than four groups): no data
          v[t] = 0;
          continue;
        }
        const int i = 4 * (j0 + t) + 2 * h;
        float a0 = acc[i], a1 = acc[i + 1];
        if constexpr (kBeta) {
          a0 *= p.alpha;
          a1 *= p.alpha;
          const int32_t col = n0 + 8 * (j0 + t) + 2 * q;
          if (row < p.M && col < p.N) {
            const int64_t idx = (int64_t)row * p.ldc + col;
            a0 += p.beta * loadOut<Tr::kOutType>(p.C, idx);
            a1 += p.beta * loadOut<Tr::kOutType>(p.C, idx + 1);
          }
          v[t] = pack2<Tr::kOutType>(a0, a1);
        } else {
          v[t] = packOut<Tr::kOutType, kUnitAlpha>(p.alpha, a0, a1);
        }
      }
      quadTranspose(v, q);
      const int32_t col = n0 + 8 * (j0 + q);
      if (j0 + q < J1 && row < p.M && col < p.N)
        *reinterpret_cast<uint4*>(d + (int64_t)row * p.ldd + col) =
            make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
}

// The staged epilogue (beta 0): the unit's whole 64x64 boxes (row half r, 64-column chunk c; six
// of a 192-column unit) one after another through the WG's own 8 KB box, each out by a TMA store
// that thread 0 issues and, before the box is written again, waits to have read it. Only the WG
// waits: the producer's ring is untouched, and the other WG's main loop (a whole unit of k-steps)
// hides the chain. A narrow unit's last 48 columns (no whole box: a 64-column store would
// overwrite the next unit's first 16) leave from registers, as with GemmArgs::regStores.
template <class Tr>
__device__ __forceinline__ void unitEpilogueStaged(const GemmParams& p,
                                                   const PingSmem<typename Tr::Pipe>& sm,
                                                   const float (&acc0)[Tr::kAcc],
                                                   const float (&acc1)[Tr::kAcc], int32_t wg,
                                                   int32_t m0, int32_t n0) {
  constexpr int kEC = 64;
  const int32_t tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
  uint8_t* box = sm.staging + wg * kStoreBoxBytes;
  const bool unitAlpha = p.alpha == 1.0f;
  const int nRows = m0 + 64 < p.M ? 2 : 1;  // m0 < M: units cover rows below M only
  constexpr int kChunks = Tr::Pipe::kChunks;
  const int nCols = min(kChunks, (p.N - n0 + kEC - 1) / kEC);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (r >= nRows) break;
    const float(&acc)[Tr::kAcc] = r == 0 ? acc0 : acc1;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (c >= nCols) break;
      // the box's previous store (this unit's, or the WG's previous unit's) has read it
      if (tid == 0) ptx::bulkWaitRead<0>();
      ptx::namedBarSync(1 + wg, 128);
      if (unitAlpha) {
        stageBoxStmatrix<Tr::kOutType, true>(box, acc + c * 32, 1.0f, warp, lane);
      } else {
        stageBoxStmatrix<Tr::kOutType, false>(box, acc + c * 32, p.alpha, warp, lane);
      }
      // generic-proxy writes above, read next by the TMA engine (async proxy)
      ptx::fenceProxyAsyncShared();
      ptx::namedBarSync(1 + wg, 128);
      if (tid == 0) {
        ptx::tmaStore2d(&p.tmD, box, n0 + c * kEC, m0 + 64 * r);
        ptx::bulkCommit();
      }
    }
  }
  if constexpr (Tr::Pipe::kTailCols != 0) {
    constexpr int kJ0 = kChunks * kEC / 8;
    if (unitAlpha) {
      unitStoreHalf<Tr, true, false, kJ0>(p, acc0, m0, n0);
      unitStoreHalf<Tr, true, false, kJ0>(p, acc1, m0 + 64, n0);
    } else {
      unitStoreHalf<Tr, false, false, kJ0>(p, acc0, m0, n0);
      unitStoreHalf<Tr, false, false, kJ0>(p, acc1, m0 + 64, n0);
    }
  }
}

template <class Tr>
__device__ __forceinline__ void unitEpilogue(const GemmParams& p, const float (&acc0)[Tr::kAcc],
                                             const float (&acc1)[Tr::kAcc], int32_t m0,
                                             int32_t n0) {
  if (p.beta != 0.0f) {
    unitStoreHalf<Tr, false, true>(p, acc0, m0, n0);
    unitStoreHalf<Tr, false, true>(p, acc1, m0 + 64, n0);
  } else if (p.alpha == 1.0f) {
    unitStoreHalf<Tr, true, false>(p, acc0, m0, n0);
    unitStoreHalf<Tr, true, false>(p, acc1, m0 + 64, n0);
  } else {
    unitStoreHalf<Tr, false, false>(p, acc0, m0, n0);
    unitStoreHalf<Tr, false, false>(p, acc1, m0 + 64, n0);
  }
}

// Consumer WG `wg` (0 or 1): local units wg, wg + 2, ... (turn-taking: see the file comment).
// Records (traced): words 0-3 the unit's start, first stage ready, main loop done, stores
// issued; 7 the full waits after the first k-step's (4-6, the staging's stamps, stay 0).
template <class Tr, bool kTrace>
__device__ __forceinline__ void unitConsumer(const GemmParams& p,
                                             const PingSmem<typename Tr::Pipe>& sm, int32_t cta,
                                             int32_t nCtas, int32_t wg) {
  constexpr int kStages = Tr::Pipe::kStages;
  const int32_t n = unitCount<Tr>(p, sm, cta, nCtas);
  const int32_t tid = threadIdx.x & 127, lane = tid & 31;
  const int32_t kTiles = p.kTiles;
  // Uniform over the CTA: the staged epilogue, or the register stores (beta reads C).
  const bool staged = p.regStores == 0 && p.beta == 0.0f;
  float acc0[Tr::kAcc], acc1[Tr::kAcc];
  RingPos<kStages> ring;
  if (wg == 1) ring.advance(kTiles);  // WG0's first unit comes first in the ring
  int32_t nth = 0;                    // units run (trace records)
  for (int32_t j = wg; j < n; j += 2) {
    const uint64_t tStart = kTrace ? (uint64_t)clock64() : 0;
    int32_t g, m0, n0;
    unitAt<Tr>(p, sm, cta + j * nCtas, &g, &m0, &n0);
    if (j > 0) ptx::namedBarSync(kBarOrder + wg, 256);
    uint64_t* rec = tid == 0 ? traceRecord<kTrace>(p, cta, 1 + wg, nth) : nullptr;
    ++nth;
    if (rec != nullptr) rec[0] = tStart;
    int32_t prev = 0;
    uint32_t waited = 0;
    for (int32_t k = 0; k < kTiles; ++k) {
      mbarWaitCounted(&sm.full[ring.stage], ring.phase, kTrace && k > 0 ? &waited : nullptr);
      if (k == 0 && rec != nullptr) rec[1] = (uint64_t)clock64();
      pingKStep<Tr::kUnitN, Tr::kF16In, Tr::kTransB>(
          ptx::smemAddr(sm.a(ring.stage)), ptx::smemAddr(sm.b(ring.stage)), acc0, acc1, k == 0);
      if (k > 0) releaseStage<Tr>(&sm.empty[prev], lane);
      prev = ring.stage;
      ring.next();
    }
    // The turn goes to the other WG once this WG's last batch is issued: its wgmmas queue
    // behind these while this WG waits for them and stores its unit.
    if (j + 1 < n) ptx::namedBarArrive(kBarOrder + (1 - wg), 256);
    ptx::wgmmaWait<0>();
    ptx::fenceRegs(acc0);
    ptx::fenceRegs(acc1);
    if (rec != nullptr) {
      rec[2] = (uint64_t)clock64();
      rec[7] = waited;
    }
    releaseStage<Tr>(&sm.empty[prev], lane);
    if (staged) {
      unitEpilogueStaged<Tr>(p, sm, acc0, acc1, wg, m0, n0);
    } else {
      unitEpilogue<Tr>(p, acc0, acc1, m0, n0);
    }
    if (rec != nullptr) rec[3] = (uint64_t)clock64();
    ring.advance(kTiles);  // the other WG's unit j + 1
  }
  if (tid == 0) ptx::bulkWait<0>();  // the last unit's stores done before the CTA exits
}

template <class Tr, bool kTrace = false>
__global__ void __launch_bounds__(kThreads, 1)
    gemmUnitKernel(const __grid_constant__ GemmParams p) {
  extern __shared__ uint8_t smemRaw[];
  PingSmem<typename Tr::Pipe> sm(smemRaw);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Tr::Pipe::kStages; ++s) {
      ptx::mbarInit(&sm.full[s], 1);
      ptx::mbarInit(&sm.empty[s], 4);  // one arrive per warp of the WG that reads the stage
    }
    ptx::fenceMbarInit();
    ptx::prefetchTensorMap(&p.tmA);
    ptx::prefetchTensorMap(&p.tmB);
    if (p.useTmaStore) ptx::prefetchTensorMap(&p.tmD);
  }
  // Both roles walk the groups' units from the same prefix sums (warp 0, from the device's
  // counts: no host synchronisation).
  if constexpr (Tr::kGrouped) groupPrefix(p, sm.grp);
  __syncthreads();
  const int32_t wg = threadIdx.x / 128;
  if (wg == 0) {
    ptx::setmaxnregDec<Tr::kProducerRegs>();
    if (threadIdx.x == 0) {
      traceHeader<kTrace>(p, blockIdx.x, 0, 0);
      unitProducer<Tr, kTrace>(p, sm, blockIdx.x, gridDim.x);
      traceHeader<kTrace>(p, blockIdx.x, 0, 2);
    }
  } else {
    ptx::setmaxnregInc<Tr::kConsumerRegs>();
    const bool stamp = (threadIdx.x & 127) == 0;
    if (stamp) traceHeader<kTrace>(p, blockIdx.x, wg, 0);
    unitConsumer<Tr, kTrace>(p, sm, blockIdx.x, gridDim.x, wg - 1);
    if (stamp) traceHeader<kTrace>(p, blockIdx.x, wg, 2);
  }
}

}  // namespace gemm
}  // namespace mk
