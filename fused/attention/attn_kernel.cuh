// The flash-attention forward CTA (sm_90a), persistent and warp-specialised like the GEMM
// engine (fused/gemm/gemm_kernel.cuh):
//
//   WG0 (producer): one thread loads, per tile, the tile's first kStages - 1 visible K/V blocks,
//       the tile's Q block once ([128 rows][D], as D/64 boxes of 128-byte swizzled rows) and
//       then its other visible K/V blocks of every source into a kStages ring (K and V
//       completing on their own mbarriers, so S = Q.K^T starts before V has landed). With
//       two Q buffers (head dim 64, variant 3) the Q block comes first.
//   WG1, WG2 (consumers; WG3 too in head dim 64's variant 4): 64 query rows each. S = Q.K^T with
//   wgmma SS (K-major K), online
//       softmax on S's accumulators (scale folded into exp2; the row max and the running sum
//       per row, the sum kept per thread and reduced across the quad only at the end), P
//       rounded to the input type in registers in the A-fragment layout, O += P.V with wgmma
//       RS (V is MN-major: [kv rows][D], D contiguous). Epilogue: O / l straight to global
//       memory, lse = ln(sum exp) per row.
//
// Both roles walk the same tiles and the same visible K/V blocks (kvVisible), so the ring's
// phases stay in step without any other handshake. Masking compares global positions
// (SeqMap), which makes one kernel serve one rank, contiguous rings and zigzag rings.
#pragma once
#include <cstdint>
#include <type_traits>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device/rt/ptx.cuh"
#include "device/rt/ptx_ext.cuh"
#include "device/rt/wait.cuh"
#include "fused/attention/attn.h"
#include "fused/gemm/primitives.cuh"

namespace mk {
namespace attn {

// ---- configuration -----------------------------------------------------------------------

// kOverlapIn: FlashAttention-3's schedule (intra-WG pipelining of S and P.V, ping-pong of the
// two consumer WGs); false: one block at a time (the reference schedule, kept to compare).
// kVariantIn (head dim 64 with the overlapped schedule only; MKERNEL_ATTN_D64_VARIANT): at head
// dim 64 a key block costs half the products of head dim 128 for the same exps, so the fixed
// costs per block (barriers, row max and rescale, handshakes) and per tile (the Q load behind
// the last P.V) weigh twice as much. 0 = 128-key blocks, 3 stages, one Q buffer (head dim
// 128's variant 0); 1 = 192-key blocks (a third fewer blocks: fewer fixed costs per key);
// 2 = 4 stages (more loads in flight); 3 = two Q buffers (the next tile's Q loads while this
// tile still runs); 4 = three consumer WGs (192-row tiles: each K/V block serves 1.5x the
// query rows, and a third WG's softmax hides behind the other two's products; 160 registers
// per consumer thread). Which wins is measured on the GPU (docs/ring-attention.md).
// Head dim 128 (MKERNEL_ATTN_D128_VARIANT): 0 = 128-key blocks, 3 stages; 1 = 176-key blocks
// in 2 stages (a quarter fewer blocks per row, hence fewer barrier turns, row maxima and O
// rescales; 64 + 88 + 44 fragment registers of the 200 left, 3 stages would not fit).
template <int kD, bool kF16In, bool kOverlapIn = true, int kVariantIn = 0>
struct Cfg {
  static constexpr int D = kD;
  static constexpr bool kF16 = kF16In;
  static constexpr bool kOverlap = kOverlapIn;
  static constexpr int kVariant = kVariantIn;
  static constexpr int kConsumerWGs = kVariant == 4 ? 3 : 2;
  static constexpr int kBM = 64 * kConsumerWGs;  // query rows per tile (64 per consumer WG)
  // Key rows per K/V block: 64 at head dim 256 (O alone takes 128 registers per thread).
  static constexpr int kBN = kD > 128 ? 64 : (kVariant == 1 ? (kD == 64 ? 192 : 176) : 128);
  // 3 stages where they fit (head dim 64, head dim 128 with 128-key blocks); K and V of a stage
  // are freed separately.
  static constexpr int kStages = kD > 128 || (kD == 128 && kVariant == 1) ? 2
                                                                          : (kVariant == 2 ? 4 : 3);
  static constexpr int kQBufs = kVariant == 3 ? 2 : 1;
  static constexpr int kSub = kD / 64;  // 64-column (128-byte) sub-tiles of a row
  static constexpr int kQBytes = kBM * kD * 2;
  static constexpr int kKBytes = kBN * kD * 2;  // one K (or V) block
  static constexpr int kStageBytes = 2 * kKBytes;
  // qFull, qEmpty per Q buffer; kFull, vFull, kEmpty, vEmpty per stage; then one tile word per
  // Q buffer and the producer's claimed tile (the dynamic schedule, AttnParams::claim).
  static constexpr int kBarrierCount = 2 * kQBufs + 4 * kStages;
  static constexpr int kBarrierUsed = kBarrierCount * 8 + (kQBufs + 1) * 4;
  static constexpr int kBarrierBytes = kBarrierUsed <= 128 ? 128 : 256;
  static constexpr int kSmemBytes = kQBufs * kQBytes + kStages * kStageBytes + kBarrierBytes + 1024;
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  // The producer runs bounded waits (fused ring): 40 where the register file allows; with
  // three consumer WGs 32 (32 x 128 + 160 x 384 = 65536, the whole file).
  static constexpr int kProducerRegs = kConsumerWGs == 3 ? 32 : 40;
  static constexpr int kConsumerRegs = kConsumerWGs == 3 ? 160 : 232;
  static_assert(kD == 64 || kD == 128 || kD == 256, "head dims 64, 128, 256");
  static_assert(kVariant == 0 || (kD == 64 && kOverlap) || (kD == 128 && kOverlap),
                "variants are for head dims 64 and 128 with the overlapped schedule");
  static_assert(kVariant >= 0 && kVariant <= (kD == 64 ? kMaxD64Variant : kMaxD128Variant),
                "unknown variant");
  static_assert(kBN <= 256, "a TMA box holds at most 256 rows");
  static_assert(kBN % 16 == 0, "P.V walks the key block in k16 slices");
  static_assert(kSmemBytes <= 232448, "attention CTA exceeds the sm_90 shared-memory limit");
  static_assert(kQBytes % 1024 == 0 && kKBytes % 1024 == 0, "SW128 tiles need 1024-byte bases");
  static_assert(kBarrierUsed <= kBarrierBytes, "barrier area too small");
  static_assert(128 * (kProducerRegs + kConsumerWGs * kConsumerRegs) <= 65536,
                "register budget exceeded");
  // Consumer registers: O (D/2) + S (kBN/2) + P (kBN/4) per thread, plus 32 for addresses and
  // the softmax state (192-key blocks at head dim 64: 32 + 96 + 48 = 176; three WGs:
  // 32 + 64 + 32 = 128 of 160; 176-key blocks at head dim 128: 64 + 88 + 44 = 196 of 200).
  static_assert(kD / 2 + kBN / 2 + kBN / 4 <= kConsumerRegs - 32,
                "consumer fragments exceed the budget");
};

// Calls f(C{}) with the Cfg of head dim kD, input type kF16, the schedule and the resolved
// variant (AttnParams::variant; 0 for head dim 256 and the plain schedule), so every launcher
// picks the same configuration. Variants above kMaxVariant (head dim 64) or kMaxD128 (head
// dim 128) are not built for that launcher (variantOf never gives them to it) and run
// variant 0. Host code.
template <int kD, bool kF16, int kMaxVariant = kMaxD64Variant, int kMaxD128 = kMaxD128Variant,
          class F>
auto withCfg(bool overlap, int variant, F&& f) {
  if (!overlap) return f(Cfg<kD, kF16, false>{});
  if constexpr (kD == 128 && kMaxD128 >= 1) {
    static_assert(kMaxD128Variant == 1, "every variant needs its case here");
    if (variant == 1) return f(Cfg<kD, kF16, true, 1>{});
  }
  if constexpr (kD == 64) {
    static_assert(kMaxD64Variant == 4, "every variant needs its case here");
    switch (variant) {
      case 1:
        return f(Cfg<kD, kF16, true, 1>{});
      case 2:
        return f(Cfg<kD, kF16, true, 2>{});
      case 3:
        return f(Cfg<kD, kF16, true, 3>{});
      case 4:
        if constexpr (kMaxVariant >= 4) return f(Cfg<kD, kF16, true, 4>{});
        break;
      default:
        break;
    }
  }
  return f(Cfg<kD, kF16, true>{});
}

// Kernel parameters: one __grid_constant__ struct so the tensor maps stay in param space.
struct AttnParams {
  CUtensorMap tmQ;  // [B][S][Hq][D], box {64, 1, kBM, 1}
  CUtensorMap tmK;  // [nSrc][B][S][Hkv][D], box {64, 1, kBN, 1, 1}
  CUtensorMap tmV;
  void* out;
  float* lse;
  int32_t B, S, Hq, Hkv, group;  // group = Hq / Hkv
  int32_t mBlocks, numTiles;
  float scaleLog2;  // scale * log2(e)
  int32_t causal;
  int32_t tileOrder;  // MKERNEL_ATTN_TILE_ORDER
  SeqMap seq;
  int32_t qRank, nSrc;
  // The resolved variant (Cfg::kVariant of the launched kernel; host side only).
  // Here it fills the padding before hooks, so the other fields keep their offsets.
  int32_t variant;
  AttnHooks hooks;
  int32_t* claim;  // AttnArgs::tileClaim
  int32_t srcRank[kMaxSrc];
};

// Checks `args` (canImplement + device limits) and fills the kernel params; `grid` is the
// persistent CTA count (min(tiles, SM budget)). Used by launch() and by the fused ring kernel.
ncclResult_t buildParams(const AttnArgs& args, AttnParams* params, int32_t* grid);

// One source's K and V maps for attnCta's kvMaps: [1][B][S][Hkv][D] tensors at k and v, the
// shapes of `args` and the key block of `variant` (the launched kernel's: params->variant of
// buildParams). k and v 16-byte aligned, as buildParams checks for args.k / args.v.
ncclResult_t encodeKvSource(const AttnArgs& args, int variant, const void* k, const void* v,
                            CUtensorMap* tmK, CUtensorMap* tmV);

// Whether the schedule of `args` is the overlapped one (AttnArgs::schedule or the parameter).
bool overlapOf(const AttnArgs& args);

template <class C>
struct Smem {
  uint8_t* q;
  uint8_t* kv;
  uint64_t* qFull;
  uint64_t* qEmpty;
  uint64_t* kFull;  // [kStages]
  uint64_t* vFull;
  uint64_t* kEmpty;  // K of a stage is free once S is computed, V once P.V is
  uint64_t* vEmpty;
  // [kQBufs] the tile whose Q a buffer holds (dynamic schedule; -1: no tile left). The
  // producer writes it before its arrive on qFull, which releases it to the consumers' wait.
  // Shared-window addresses (st.shared / ld.shared) computed from qFull (the first barrier):
  // generic pointers of their own made ptxas spill the producer's 40 registers.
  __device__ uint32_t tileWord(int32_t buf) const {
    return ptx::smemAddr(qFull) + C::kBarrierCount * 8 + 4 * buf;
  }
  // The tile the producer claimed last, parked here until its Q load.
  __device__ uint32_t claimed() const { return tileWord(C::kQBufs); }
  __device__ explicit Smem(uint8_t* raw) {
    q = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    kv = q + C::kQBufs * C::kQBytes;
    qFull = reinterpret_cast<uint64_t*>(kv + C::kStages * C::kStageBytes);  // [kQBufs]
    qEmpty = qFull + C::kQBufs;
    kFull = qEmpty + C::kQBufs;
    vFull = kFull + C::kStages;
    kEmpty = vFull + C::kStages;
    vEmpty = kEmpty + C::kStages;
  }
  __device__ uint8_t* qBuf(int b) const { return q + b * C::kQBytes; }
  __device__ uint8_t* k(int s) const { return kv + s * C::kStageBytes; }
  __device__ uint8_t* v(int s) const { return kv + s * C::kStageBytes + C::kKBytes; }
};

// ---- the schedule both roles walk -----------------------------------------------------------

struct Tile {
  int32_t b, h, m0;
  int64_t qLo, qHi;  // positions of the tile's valid rows
};

template <class C>
__device__ __forceinline__ Tile tileAt(const AttnParams& p, int32_t t) {
  int32_t hb, mb;
  tileCoords(t, p.B * p.Hq, p.mBlocks, p.causal != 0, p.tileOrder != 0, &hb, &mb);
  Tile x;
  x.b = hb / p.Hq;
  x.h = hb % p.Hq;
  x.m0 = mb * C::kBM;
  p.seq.range(p.qRank, x.m0, min(x.m0 + C::kBM, p.S), &x.qLo, &x.qHi);
  return x;
}

// The walk over the visible K/V blocks of a tile, source by source (KvCursor, attn.h: it
// jumps past each source's invisible tail). Start from BlockCursor{}; next() moves to the
// next visible block (false at the end).
struct BlockCursor : KvCursor {
  template <int kBN>
  __device__ __forceinline__ bool next(const AttnParams& p, const Tile& x) {
    return KvCursor::next(p.seq, p.causal != 0, x.qLo, x.qHi, p.srcRank, p.nSrc, kBN);
  }
};

// ---- producer -----------------------------------------------------------------------------

template <class C>
__device__ __forceinline__ void loadBlock(const CUtensorMap* map, uint8_t* dst, uint64_t* bar,
                                          int32_t head, int32_t row, int32_t b, int32_t src) {
#pragma unroll
  for (int c = 0; c < C::kSub; ++c) {
    ptx::tmaLoad5d(dst + c * (C::kBN * 128), map, bar, 64 * c, head, row, b, src);
  }
}

// The producer's K/V ring: one visible block (K, then V, each on its own stage barriers).
template <class C>
struct KvRing {
  int32_t stage = 0;
  uint32_t phase = 0;
  int32_t waited = -1;  // the last source whose ready flag the current tile has seen
  uint32_t have = 0;    // the ready value of source `waited` seen (hooks.rowsPerUnit > 0)
  // nullptr: every source through p.tmK / p.tmV (one [nSrc] tensor). Else source j's K and V
  // maps at maps[2j], maps[2j + 1] (each a [1][B][S][Hkv][D] tensor of its own), for sources
  // that live in separate allocations (the fused ring kernel's direct reads).
  const CUtensorMap* maps = nullptr;

  // The ready value block c needs (hooks.ready set). Per source (rowsPerUnit 0): 1. Per
  // unit: the units up to the block's last row, k and v (fused/ops/ring_attn/xnode.h
  // rxUnitsFor; counts fit 32 bits there).
  __device__ __forceinline__ uint32_t need(const AttnParams& p, const Tile& x,
                                           const BlockCursor& c) const {
    if (p.hooks.rowsPerUnit <= 0) return 1;
    const int64_t end = (int64_t)x.b * p.S + min(c.n0 + C::kBN, p.S);
    return 2u * (uint32_t)((end + p.hooks.rowsPerUnit - 1) / p.hooks.rowsPerUnit);
  }
  // Whether loading block c may have to wait for its ready value first.
  __device__ __forceinline__ bool mayWait(const AttnParams& p, const Tile& x,
                                          const BlockCursor& c) const {
    return p.hooks.ready != nullptr && (c.j != waited || need(p, x, c) > have);
  }

  __device__ __forceinline__ void load(const AttnParams& p, const Smem<C>& sm, const Tile& x,
                                       const BlockCursor& c) {
    const int32_t kvh = x.h / p.group;
    if (p.hooks.ready != nullptr) {
      const uint32_t need = this->need(p, x, c);
      if (c.j != waited || need > have) {
        // On failure the comm has recorded its error; going on keeps the consumers' ring in
        // step (later waits of a failed comm return at once), the result is unspecified.
        rt::waitFlag(p.hooks.wait, p.hooks.ready + c.j, need, c.j, false, p.srcRank[c.j]);
        // The slice was written through the generic proxy; TMA reads it (async proxy).
        ptx::fenceProxyAsync();
        waited = c.j;
        have = need;
      }
    }
    const CUtensorMap* mapK = maps != nullptr ? maps + 2 * c.j : &p.tmK;
    const int32_t src = maps != nullptr ? 0 : c.j;
    ptx::mbarWait(&sm.kEmpty[stage], phase ^ 1);
    ptx::mbarArriveExpectTx(&sm.kFull[stage], C::kKBytes);
    loadBlock<C>(mapK, sm.k(stage), &sm.kFull[stage], kvh, c.n0, x.b, src);
    ptx::mbarWait(&sm.vEmpty[stage], phase ^ 1);
    ptx::mbarArriveExpectTx(&sm.vFull[stage], C::kKBytes);
    loadBlock<C>(maps != nullptr ? mapK + 1 : &p.tmV, sm.v(stage), &sm.vFull[stage], kvh, c.n0, x.b,
                 src);
    if (++stage == C::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// The tile's Q block into buffer `buf` once the consumers of its previous user released it.
// Dynamic schedule: the tile's id (parked in sm.claimed) handed to the consumers in the
// buffer's tile word.
template <class C, bool kDyn>
__device__ __forceinline__ void loadQ(const AttnParams& p, const Smem<C>& sm, const Tile& x,
                                      int32_t buf, uint32_t phase) {
  ptx::mbarWait(&sm.qEmpty[buf], phase ^ 1);
  if constexpr (kDyn) ptx::stShared32(sm.tileWord(buf), ptx::ldShared32(sm.claimed()));
  ptx::mbarArriveExpectTx(&sm.qFull[buf], C::kQBytes);
#pragma unroll
  for (int s = 0; s < C::kSub; ++s) {
    ptx::tmaLoad4d(sm.qBuf(buf) + s * (C::kBM * 128), &p.tmQ, &sm.qFull[buf], 64 * s, x.h, x.m0,
                   x.b);
  }
}

// kDyn: the dynamic schedule (p.claim). A kernel of its own (attnCta's kDyn): with both loops
// in one kernel, or a run-time choice in one loop, ptxas spilled in the static kernel too.
template <class C, bool kDyn>
__device__ __forceinline__ void producer(const AttnParams& p, const Smem<C>& sm, int32_t cta,
                                         int32_t nCtas, const CUtensorMap* kvMaps) {
  // One Q buffer: a tile's first kStages - 1 blocks go into the ring before its Q: their
  // stages are freed by the previous tile's last blocks while the consumers still hold the
  // one Q buffer, so the ring keeps flowing across the tile boundary instead of draining
  // behind the Q load. kStages - 1 fills the ring (any number up to kStages cannot deadlock:
  // the stages they wait for are freed by blocks of earlier tiles, which need nothing of this
  // tile). The ring order is unchanged.
  // Two Q buffers: Q first. Its buffer was released by the tile before the previous one, long
  // done, so the load neither waits nor holds up the ring, and it lands while the consumers
  // still run the previous tile (the tile boundary no longer waits for a Q load).
  constexpr int kAhead = C::kQBufs > 1 ? 0 : C::kStages - 1;
  KvRing<C> ring;
  ring.maps = kvMaps;
  for (int32_t k = 0;; ++k) {
    int32_t qBuf;
    uint32_t qPhase;
    qSlot(k, C::kQBufs, &qBuf, &qPhase);
    // Dynamic schedule: tiles in order, heaviest first, to whichever CTA asks next, so a CTA
    // that became resident late (another kernel held its SM) takes fewer of them.
    const int32_t t = kDyn ? atomicAdd(p.claim, 1)
                           : tileOfRound(k, cta, nCtas, p.causal != 0 && p.tileOrder != 0);
    if (t >= p.numTiles) {
      if constexpr (kDyn) {
        // No tile left: the consumers learn it from the next buffer's word (a bare arrive
        // completes its phase without data).
        ptx::mbarWait(&sm.qEmpty[qBuf], qPhase ^ 1);
        ptx::stShared32(sm.tileWord(qBuf), -1);
        ptx::mbarArrive(&sm.qFull[qBuf]);
      }
      break;
    }
    if constexpr (kDyn) ptx::stShared32(sm.claimed(), t);
    const Tile x = tileAt<C>(p, t);
    BlockCursor c{};
    ring.waited = -1;
    bool more = true, pending = false;
    for (int i = 0; i < kAhead; ++i) {
      if (!(more = c.next<C::kBN>(p, x))) break;
      // A later source whose ready flag this tile has not seen (the fused ring), or rows of a
      // source beyond the units seen (across nodes), may still be on their way: the block
      // waits until after Q, so the blocks already here are not held up.
      if (i > 0 && ring.mayWait(p, x, c)) {
        pending = true;
        break;
      }
      ring.load(p, sm, x, c);
    }
    loadQ<C, kDyn>(p, sm, x, qBuf, qPhase);
    if (pending) ring.load(p, sm, x, c);
    while (more && c.next<C::kBN>(p, x)) ring.load(p, sm, x, c);
  }
}

// ---- consumer -----------------------------------------------------------------------------

template <bool kF16>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (kF16) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// Max (or sum) over the 4 lanes of a quad: the threads holding one row of a fragment.
__device__ __forceinline__ float quadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Fragment coordinates of accumulator i (m64nNk16, fp32): row (0: lane/4, 1: lane/4 + 8 of the
// warp's 16) and column.
__device__ __forceinline__ int fragRow(int i) {
  return (i >> 1) & 1;
}
__device__ __forceinline__ int fragCol(int i, int lane) {
  return 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
}

// Online softmax of one block: masks S, updates the row max m and running sums l (per
// thread, both in the exp2 domain: scale * log2(e) folded into one FFMA per element), leaves
// P (fp32) in s and returns in alpha the factor O must be rescaled by. The mask is a branch
// around its own loop, not a test per element: per-element branches spread the unmasked
// loop over several instruction-cache lines, and fetching them stalled every warp (ncu).
// The caller rescales O and packs P (packP) only once no wgmma still reads or writes them:
// an A register of an in-flight wgmma must not be redefined (ptxas would serialise).
template <class C>
__device__ __forceinline__ void softmaxScores(const AttnParams& p, float (&s)[C::kBN / 2],
                                              float (&m)[2], float (&l)[2], float (&alpha)[2],
                                              bool mask, int32_t src, int32_t n0,
                                              const int64_t (&qpos)[2], int lane) {
  constexpr int kS = C::kBN / 2;
  float mx[2] = {-INFINITY, -INFINITY};
  if (C::D <= 128 && !mask) {
#pragma unroll
    for (int i = 0; i < kS; ++i) mx[fragRow(i)] = fmaxf(mx[fragRow(i)], s[i]);
  } else if (C::D <= 128) {
    const int32_t end = min(n0 + C::kBN, p.S);
    int32_t lim[2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
      lim[r] = p.causal ? (int32_t)min((int64_t)end, p.seq.prefixUpTo(src, qpos[r])) : end;
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      if (n0 + fragCol(i, lane) >= lim[fragRow(i)]) s[i] = -INFINITY;
      mx[fragRow(i)] = fmaxf(mx[fragRow(i)], s[i]);
    }
  } else {
    // Head dim 256 (O alone takes 128 registers): a second loop, or a bound per row computed
    // up front, pushes the overlapped schedule into spills, so one loop tests per element.
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      if (mask) {
        const int32_t col = n0 + fragCol(i, lane);
        if (col >= p.S || (p.causal && p.seq.pos(src, col) > qpos[fragRow(i)])) s[i] = -INFINITY;
      }
      mx[fragRow(i)] = fmaxf(mx[fragRow(i)], s[i]);
    }
  }
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // The scale is positive (checked on the host), so max(s) * scale = max(s * scale).
    const float mNew = fmaxf(m[r], quadMax(mx[r]) * p.scaleLog2);
    // A row with no visible key yet keeps m = -inf; subtracting 0 then gives exp2(-inf) = 0
    // instead of NaN.
    base[r] = mNew == -INFINITY ? 0.0f : mNew;
    alpha[r] = ptx::exp2Approx(m[r] - base[r]);
    m[r] = mNew;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int i = 0; i < kS; ++i) {
    const float e = ptx::exp2Approx(fmaf(s[i], p.scaleLog2, -base[fragRow(i)]));
    s[i] = e;
    l[fragRow(i)] += e;
  }
}

// P rounded to the input type in the A-fragment layout of P.V: columns 16kk..16kk+15 of S's
// accumulator fragment are exactly the A fragment of k-slice kk.
template <class C>
__device__ __forceinline__ void packP(const float (&s)[C::kBN / 2],
                                      uint32_t (&pa)[C::kBN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < C::kBN / 16; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r)
      pa[kk][r] = pack2<C::kF16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
  }
}

template <class C>
__device__ __forceinline__ void rescale(float (&o)[C::D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < C::D / 2; ++i) o[i] *= alpha[fragRow(i)];
}

// S = Q.K^T for the WG's 64 rows (issued, not committed). K-major operands: sub-tile kk/4 of
// 64 columns, then 32 bytes per k16 slice.
template <class C>
__device__ __forceinline__ void issueS(float (&s)[C::kBN / 2], uint32_t qBase, uint32_t kBase) {
#pragma unroll
  for (int kk = 0; kk < C::D / 16; ++kk) {
    const uint32_t off = (kk & 3) * 32;
    const uint64_t da = gemm::descKMajor(qBase + (kk >> 2) * (C::kBM * 128) + off);
    const uint64_t db = gemm::descKMajor(kBase + (kk >> 2) * (C::kBN * 128) + off);
    ptx::wgmmaSS<C::kBN, C::kF16, 0>(s, da, db, kk > 0 ? 1 : 0);
  }
}

// O += P.V (issued, not committed). V is MN-major: 64-column blocks kBN rows tall (LBO),
// 8-row groups 1024 B apart, 16 rows (2048 B) per k16 slice.
template <class C>
__device__ __forceinline__ void issuePV(float (&o)[C::D / 2], uint32_t (&pa)[C::kBN / 16][4],
                                        uint32_t vBase) {
#pragma unroll
  for (int kk = 0; kk < C::kBN / 16; ++kk) {
    const uint64_t db = gemm::makeDesc(vBase + kk * 2048, C::kBN * 128, 1024);
    ptx::wgmmaRS<C::D, C::kF16, 1>(o, pa[kk], db, 1);
  }
}

template <class C>
__device__ __forceinline__ void epilogue(const AttnParams& p, const Tile& x, int32_t wg,
                                         float (&o)[C::D / 2], const float (&m)[2],
                                         const float (&l)[2]) {
  const int32_t tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
  constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quadSum(l[r]);
    const int32_t row = x.m0 + 64 * wg + 16 * warp + (lane >> 2) + 8 * r;
    if (row >= p.S) continue;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    using T = typename std::conditional<C::kF16, __half, __nv_bfloat16>::type;
    T* dst = static_cast<T*>(p.out) + (((int64_t)x.b * p.S + row) * p.Hq + x.h) * C::D;
#pragma unroll
    for (int i = 0; i < C::D / 2; i += 2) {
      if (fragRow(i) != r) continue;
      *reinterpret_cast<uint32_t*>(dst + fragCol(i, lane)) =
          pack2<C::kF16>(o[i] * inv, o[i + 1] * inv);
    }
    if (p.lse != nullptr && (lane & 3) == 0) {
      const float v = sum > 0.0f ? (m[r] + __log2f(sum)) * kLn2 : -INFINITY;
      p.lse[((int64_t)x.b * p.Hq + x.h) * p.S + row] = v;
    }
  }
}

// Ring position helper: stage index and phase advance together.
template <class C>
__device__ __forceinline__ void advance(int32_t& stage, uint32_t& phase) {
  if (++stage == C::kStages) {
    stage = 0;
    phase ^= 1;
  }
}

// One block's S in the one-at-a-time order: waited for, K released, softmax applied (P left
// in s, the factor for O in alpha).
template <class C>
__device__ __forceinline__ void blockS(const AttnParams& p, const Smem<C>& sm, int32_t stage,
                                       uint32_t phase, uint32_t qBase, float (&s)[C::kBN / 2],
                                       float (&m)[2], float (&l)[2], float (&alpha)[2],
                                       const BlockCursor& cur, const int64_t (&qpos)[2], int lane) {
  ptx::mbarWait(&sm.kFull[stage], phase);
  ptx::fenceRegs(s);
  ptx::wgmmaFence();
  issueS<C>(s, qBase, ptx::smemAddr(sm.k(stage)));
  ptx::wgmmaCommit();
  ptx::wgmmaWait<0>();
  ptx::fenceRegs(s);
  if (lane == 0) ptx::mbarArrive(&sm.kEmpty[stage]);
  softmaxScores<C>(p, s, m, l, alpha, cur.vis == 2, p.srcRank[cur.j], cur.n0, qpos, lane);
}

// One block's O += P.V (P packed in pa), waited for, V released.
template <class C>
__device__ __forceinline__ void blockPV(const Smem<C>& sm, int32_t stage, uint32_t phase,
                                        float (&o)[C::D / 2], uint32_t (&pa)[C::kBN / 16][4],
                                        int lane) {
  ptx::mbarWait(&sm.vFull[stage], phase);
  ptx::fenceRegs(o);
  ptx::wgmmaFence();
  issuePV<C>(o, pa, ptx::smemAddr(sm.v(stage)));
  ptx::wgmmaCommit();
  ptx::wgmmaWait<0>();
  ptx::fenceRegs(o);
  if (lane == 0) ptx::mbarArrive(&sm.vEmpty[stage]);
}

// Named barriers of the consumer WGs' turns: WG w waits on kBarTurn0 + w (id 0 is
// __syncthreads).
constexpr int kBarTurn0 = 1;

// kDyn: each tile comes from the producer's claim (its Q buffer's tile word); else the static
// schedule, which the producer walks alike.
template <class C, bool kDyn>
__device__ __forceinline__ void consumer(const AttnParams& p, const Smem<C>& sm, int32_t cta,
                                         int32_t nCtas, int32_t wg) {
  const int32_t tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
  int32_t stage = 0;
  uint32_t phase = 0;
  // Ping-pong: a WG issues its wgmmas only on its turn, then hands the turn to the next WG
  // (round robin), so one WG's softmax runs while the others' products occupy the tensor
  // cores. Every WG takes one turn per key block of the same tiles, so the last WG gives WG0
  // the first turn and WG0 takes the last hand-over back after the loop (every arrive is
  // matched). Each turn barrier joins two WGs: the one handing over and the one taking it.
  constexpr int kWGs = C::kConsumerWGs;
  if (C::kOverlap && wg == kWGs - 1) ptx::namedBarArrive(kBarTurn0, 256);
  for (int32_t k = 0;; ++k) {
    int32_t qBuf;
    uint32_t qPhase;
    qSlot(k, C::kQBufs, &qBuf, &qPhase);
    int32_t t;
    if constexpr (kDyn) {
      ptx::mbarWait(&sm.qFull[qBuf], qPhase);
      t = ptx::ldShared32(sm.tileWord(qBuf));
      if (t < 0) break;
    } else {
      t = tileOfRound(k, cta, nCtas, p.causal != 0 && p.tileOrder != 0);
      if (t >= p.numTiles) break;
    }
    const Tile x = tileAt<C>(p, t);
    int64_t qpos[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int32_t row = min(x.m0 + 64 * wg + 16 * warp + (lane >> 2) + 8 * r, p.S - 1);
      qpos[r] = p.seq.pos(p.qRank, row);
    }
    float o[C::D / 2];
#pragma unroll
    for (int i = 0; i < C::D / 2; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
    float s[C::kBN / 2];
    uint32_t pa[C::kBN / 16][4];
    if constexpr (!kDyn) ptx::mbarWait(&sm.qFull[qBuf], qPhase);
    const uint32_t qBase = ptx::smemAddr(sm.qBuf(qBuf)) + wg * (64 * 128);
    BlockCursor cur{};
    if constexpr (!C::kOverlap) {
      // Plain order: S, softmax, P.V, one block at a time.
      while (cur.next<C::kBN>(p, x)) {
        blockS<C>(p, sm, stage, phase, qBase, s, m, l, alpha, cur, qpos, lane);
        rescale<C>(o, alpha);
        packP<C>(s, pa);
        blockPV<C>(sm, stage, phase, o, pa, lane);
        advance<C>(stage, phase);
      }
    } else if (cur.next<C::kBN>(p, x)) {
      // Overlapped order (FlashAttention-3's intra-warpgroup pipelining): S of block i and
      // P.V of block i-1 are in flight together, and block i's softmax runs while P.V of
      // block i-1 still occupies the tensor cores; O is rescaled once that P.V is done.
      blockS<C>(p, sm, stage, phase, qBase, s, m, l, alpha, cur, qpos, lane);
      packP<C>(s, pa);  // O is still 0: no rescale
      int32_t prev = stage;
      uint32_t prevPhase = phase;
      advance<C>(stage, phase);
      while (true) {
        BlockCursor nxt = cur;
        if (!nxt.next<C::kBN>(p, x)) break;
        ptx::namedBarSync(kBarTurn0 + wg, 256);
        ptx::mbarWait(&sm.kFull[stage], phase);
        ptx::fenceRegs(s);
        ptx::fenceRegs(o);
        ptx::wgmmaFence();
        issueS<C>(s, qBase, ptx::smemAddr(sm.k(stage)));
        ptx::wgmmaCommit();
        ptx::mbarWait(&sm.vFull[prev], prevPhase);
        ptx::wgmmaFence();
        issuePV<C>(o, pa, ptx::smemAddr(sm.v(prev)));
        ptx::wgmmaCommit();
        ptx::namedBarArrive(kBarTurn0 + nextTurnWG(wg, kWGs), 256);
        ptx::wgmmaWait<1>();  // S done (groups complete in order); P.V may still run
        ptx::fenceRegs(s);
        if (lane == 0) ptx::mbarArrive(&sm.kEmpty[stage]);
        softmaxScores<C>(p, s, m, l, alpha, nxt.vis == 2, p.srcRank[nxt.j], nxt.n0, qpos, lane);
        ptx::wgmmaWait<0>();
        ptx::fenceRegs(o);
        if (lane == 0) ptx::mbarArrive(&sm.vEmpty[prev]);
        rescale<C>(o, alpha);
        packP<C>(s, pa);
        prev = stage;
        prevPhase = phase;
        advance<C>(stage, phase);
        cur = nxt;
      }
      blockPV<C>(sm, prev, prevPhase, o, pa, lane);
    }
    // Q is no longer read: the producer may load the next tile's while this epilogue runs.
    if (lane == 0) ptx::mbarArrive(&sm.qEmpty[qBuf]);
    epilogue<C>(p, x, wg, o, m, l);
  }
  if (C::kOverlap && wg == 0) ptx::namedBarSync(kBarTurn0, 256);
}

struct NoSideWork {
  __device__ void operator()() const {}
};

// One attention CTA: needs C::kThreads threads, C::kSmemBytes of dynamic shared memory and a
// kernel declared __launch_bounds__(C::kThreads, 1) (setmaxnreg). kvMaps: per-source K/V maps
// (KvRing::maps; in param space, a __grid_constant__'s member) or nullptr for p.tmK / p.tmV.
// side(): run by lane 0 of the producer warpgroup's second warp, otherwise idle (a caller's
// flag relays; it has the producer's registers, C::kProducerRegs). kDyn: the CTAs claim their
// tiles from p.claim (AttnArgs::tileClaim, not nullptr) instead of walking the static schedule.
template <class C, bool kDyn = false, class Side = NoSideWork>
__device__ __forceinline__ void attnCta(const AttnParams& p, uint8_t* smemRaw, int32_t cta,
                                        int32_t nCtas, const CUtensorMap* kvMaps = nullptr,
                                        const Side& side = Side{}) {
  Smem<C> sm(smemRaw);
  constexpr int kConsumerWarps = 4 * C::kConsumerWGs;  // one release arrive per consumer warp
  if (threadIdx.x == 0) {
    for (int b = 0; b < C::kQBufs; ++b) {
      ptx::mbarInit(&sm.qFull[b], 1);
      ptx::mbarInit(&sm.qEmpty[b], kConsumerWarps);
    }
    for (int s = 0; s < C::kStages; ++s) {
      ptx::mbarInit(&sm.kFull[s], 1);
      ptx::mbarInit(&sm.vFull[s], 1);
      ptx::mbarInit(&sm.kEmpty[s], kConsumerWarps);
      ptx::mbarInit(&sm.vEmpty[s], kConsumerWarps);
    }
    ptx::fenceMbarInit();
    ptx::prefetchTensorMap(&p.tmQ);
    ptx::prefetchTensorMap(&p.tmK);
    ptx::prefetchTensorMap(&p.tmV);
  }
  __syncthreads();
  const int32_t wg = threadIdx.x / 128;
  if (wg == 0) {
    ptx::setmaxnregDec<C::kProducerRegs>();
    if (threadIdx.x == 0) {
      producer<C, kDyn>(p, sm, cta, nCtas, kvMaps);
    } else if (threadIdx.x == 32) {
      side();
    }
  } else {
    ptx::setmaxnregInc<C::kConsumerRegs>();
    consumer<C, kDyn>(p, sm, cta, nCtas, wg - 1);
  }
}

}  // namespace attn
}  // namespace mk
