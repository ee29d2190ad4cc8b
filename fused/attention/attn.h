// Hopper (sm_90a) flash-attention forward engine: the compute core of ncclRingAttention.
// Internal API (namespace mk::attn); the public entry point lives in include/mkernel/fused.h.
//
//   q   [B, S, Hq, D]            the queries of one rank's slice of the sequence
//   k,v [nSrc][B, S, Hkv, D]     the keys/values of nSrc slices (source j at k + j * srcStride
//                                elements), each slice S positions long
//   out [B, S, Hq, D]            inType; lse [B, Hq, S] fp32 natural log (optional)
//
// Every slice holds the positions of one rank of a sequence split over nRanks ranks
// (SeqMap): contiguous, or zigzag (two chunks per rank). The causal mask compares positions,
// so the kernel is the same for one rank (nSrc = 1, nRanks = 1) and for the gathered
// sequence of a ring (nSrc = nRanks). Accumulation fp32, P rounded to the input type before
// P.V, exp2 with the scale folded in.
#pragma once
#include <cstdint>
#include <string>
#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/workspace.h"  // MK_HD
#include "device/rt/err.h"
#include "fused/gemm/gemm.h"

namespace mk {
namespace attn {

using gemm::DType;

// Most slices one call reads (sources of a ring: one per rank).
constexpr int kMaxSrc = 512;

// Global position of row s (0 <= s < S) of rank r's slice. chunks = 1: rank r holds
// [r*S, (r+1)*S); chunks = 2 (zigzag, S even, C = S/2): rows [0,C) are chunk r, rows [C,S)
// chunk 2n-1-r. Host and device.
struct SeqMap {
  int32_t S = 0;
  int32_t chunks = 1;
  int32_t nRanks = 1;
  MK_HD int64_t pos(int32_t rank, int32_t s) const {
    if (chunks == 1) return (int64_t)rank * S + s;
    const int32_t c = S / 2;
    return s < c ? (int64_t)rank * c + s : (int64_t)(2 * nRanks - 1 - rank) * c + (s - c);
  }
  // How many rows of rank r's slice have a position <= q. Positions grow with the row in
  // both layouts (zigzag's second chunk lies after its first), so those rows are a prefix of
  // the slice: the causal mask of a key block is one bound per query row.
  MK_HD int64_t prefixUpTo(int32_t rank, int64_t q) const {
    if (chunks == 1) return clampRows(q - (int64_t)rank * S + 1, S);
    const int32_t c = S / 2;
    const int64_t first = clampRows(q - (int64_t)rank * c + 1, c);
    if (first < c) return first;
    return c + clampRows(q - (int64_t)(2 * nRanks - 1 - rank) * c + 1, S - c);
  }
  MK_HD static int64_t clampRows(int64_t v, int64_t hi) { return v < 0 ? 0 : (v > hi ? hi : v); }
  // Smallest and largest position of rows [s0, s1) of rank r (s0 < s1 <= S).
  MK_HD void range(int32_t rank, int32_t s0, int32_t s1, int64_t* lo, int64_t* hi) const {
    if (chunks == 1 || s1 <= S / 2 || s0 >= S / 2) {
      *lo = pos(rank, s0);
      *hi = pos(rank, s1 - 1);
      return;
    }
    const int64_t a0 = pos(rank, s0), a1 = pos(rank, S / 2 - 1);
    const int64_t b0 = pos(rank, S / 2), b1 = pos(rank, s1 - 1);
    *lo = a0 < b0 ? a0 : b0;
    *hi = a1 > b1 ? a1 : b1;
  }
};

// Visibility of key rows [n0, n0 + bn) of rank kRank's slice (S rows) to query rows whose
// positions lie in [qLo, qHi]: 0 = no key visible to any query (every key after every query:
// the block is skipped), 1 = every pair visible (no mask), 2 = the element mask is needed
// (causal overlap, or key rows past the slice's end). Producer and consumers of the kernel
// walk the blocks with it, so both skip the same ones. Host and device.
MK_HD inline int kvVisible(const SeqMap& seq, bool causal, int64_t qLo, int64_t qHi, int32_t kRank,
                           int32_t n0, int32_t bn) {
  const bool tail = n0 + bn > seq.S;
  if (!causal) return tail ? 2 : 1;
  int64_t kLo, kHi;
  seq.range(kRank, n0, n0 + bn < seq.S ? n0 + bn : seq.S, &kLo, &kHi);
  if (kLo > qHi) return 0;
  return (tail || kHi > qLo) ? 2 : 1;
}

// End of the visible key rows of source rank kRank for a tile whose last query position is
// qHi: the key blocks kvVisible does not skip are exactly those with n0 < kvEnd. A block is
// skipped when its first position is past qHi, and positions grow with the row over the
// whole slice in both layouts (zigzag's first chunk r lies before its second, 2n-1-r, even
// for a block straddling the two halves), so the rows with position <= qHi are a prefix of
// the slice: prefixUpTo. Non-causal: every block, S. Host and device.
MK_HD inline int32_t kvEnd(const SeqMap& seq, bool causal, int64_t qHi, int32_t kRank) {
  return causal ? (int32_t)seq.prefixUpTo(kRank, qHi) : seq.S;
}

// The walk over a tile's visible K/V blocks, source by source (j = 0..nSrc-1, n0 stepping by
// bn), that the kernel's producer and consumers share. It jumps from the last visible block
// of a source straight to the next source instead of testing every block of the slice (at
// S = 32K the first causal row blocks tested all 256 blocks to compute one); a source with
// no visible block is never visited, as before. vis is kvVisible's verdict (1 or 2, never 0
// inside [0, end)). Start from KvCursor{}; next() moves to the next visible block (false at
// the end, then j == nSrc). srcRank: rank of source j (its positions).
struct KvCursor {
  int32_t j = -1, n0 = 0, end = 0, vis = 0;
  MK_HD bool next(const SeqMap& seq, bool causal, int64_t qLo, int64_t qHi, const int32_t* srcRank,
                  int32_t nSrc, int32_t bn) {
    n0 += bn;
    while (n0 >= end) {
      if (++j >= nSrc) return false;
      n0 = 0;
      end = kvEnd(seq, causal, qHi, srcRank[j]);
    }
    vis = kvVisible(seq, causal, qLo, qHi, srcRank[j], n0, bn);
    return true;
  }
};

// Tile t's head (hb = b * Hq + h, of bh = B * Hq) and row block. Causal tiles come heaviest
// first (the last row blocks of a contiguous slice attend to the most keys), row block by row
// block over all heads, so that every round of the persistent CTAs holds tiles of similar
// cost. Non-causal tiles all cost the same; with headMajor they go head by head, so the CTAs
// of one round share a head's K and V in L2 instead of streaming every head's.
MK_HD inline void tileCoords(int32_t t, int32_t bh, int32_t mBlocks, bool causal, bool headMajor,
                             int32_t* hb, int32_t* mb) {
  const bool byHead = headMajor && !causal;
  *hb = byHead ? t / mBlocks : t % bh;
  *mb = byHead ? t % mBlocks : t / bh;
  if (causal) *mb = mBlocks - 1 - *mb;
}

// Tile of persistent CTA `cta` (of nCtas) in round k. Causal tiles come heaviest first, so a
// plain stride (k * nCtas + cta) gives CTA 0 the heaviest tile of every round and the last
// CTA the lightest: a spread that grows with the rounds. `snake` reverses every other round,
// so the spread of one round is paid back in the next. Every tile of [k * nCtas, (k + 1) *
// nCtas) belongs to exactly one CTA either way; a CTA stops at its first tile >= numTiles.
MK_HD inline int32_t tileOfRound(int32_t k, int32_t cta, int32_t nCtas, bool snake) {
  return k * nCtas + ((snake && (k & 1)) ? nCtas - 1 - cta : cta);
}

// Q buffer of a CTA's round k when the kernel keeps nBufs of them (used in turn) and the
// parity of that buffer's use: the producer waits for the buffer's release with phase ^ 1,
// the consumers for its load with phase. Both roles walk the same rounds. Host and device.
MK_HD inline void qSlot(int32_t k, int32_t nBufs, int32_t* buf, uint32_t* phase) {
  *buf = k % nBufs;
  *phase = (uint32_t)(k / nBufs) & 1u;
}

// The consumer warpgroup that takes the tensor-core turn after `wg` (of nWGs, round robin): the
// overlapped schedule's WGs issue their products one after the other. Host and device.
MK_HD inline int32_t nextTurnWG(int32_t wg, int32_t nWGs) {
  return wg + 1 == nWGs ? 0 : wg + 1;
}

// Compile-time configurations of head dim 64 (MKERNEL_ATTN_D64_VARIANT; Cfg, attn_kernel.cuh):
// 0 = 128-key blocks, 3 stages, one Q buffer; 1 (the default) = 192-key blocks, 2 = 4 stages,
// 3 = two Q buffers, 4 = three consumer warpgroups (192-row tiles). Only the overlapped
// schedule has them; head dim 128 has its own (below), head dim 256 and schedule 0 run 0.
constexpr int kMaxD64Variant = 4;
// The fused ring kernel (AttnHooks::ready set) has variants 0..3 only: with three consumer
// WGs its producer's 32 registers spill there (ptxas), so variant 4 runs it as variant 0.
constexpr int kMaxRingD64Variant = 3;
// Head dim 128 (MKERNEL_ATTN_D128_VARIANT): 0 = 128-key blocks, 3 stages; 1 (the default) =
// 176-key blocks, 2 stages (FlashAttention-3's block for this head dim without a mask, measured
// faster here with one too): the widest S whose fragments, with P and O, fit the consumer's
// registers; two stages of 176 keys are what the shared memory holds. The fused ring kernel
// has both (session 33; before, it ran variant 0).
constexpr int kMaxD128Variant = 1;
constexpr int kMaxRingD128Variant = 1;

// Fused ring kernel: source j's blocks are loaded only once ready[j] >= 1 (written on this GPU
// by the kernel's communication CTAs, or with direct reads by the relay warp), waited for with
// `wait` (bounded, abortable; a failed wait records the comm's error and the kernel goes on with
// whatever the buffer holds: its result is then unspecified, and the comm reports the failure).
// rowsPerUnit > 0 (the layout across nodes, fused/ops/ring_attn/xnode.h): ready[j] counts
// the units of source j in place, k and v of rowsPerUnit rows (row = one position of one
// batch, [B][S] flattened) each, in order; a block waits only for the units holding its rows,
// so a source's first blocks are used while its later rows are still on their way.
struct AttnHooks {
  const uint64_t* ready = nullptr;  // [nSrc] or nullptr: every source is in place already
  rt::WaitCtx wait{};
  int32_t rowsPerUnit = 0;  // 0: ready[j] >= 1 once all of source j is in place
};

struct AttnArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // nullptr: not written
  int32_t B = 0, S = 0, Hq = 0, Hkv = 0, D = 0;
  DType in = DType::kBF16;
  float scale = 0.0f;  // <= 0: 1/sqrt(D)
  bool causal = false;
  SeqMap seq;                      // S must equal seq.S
  int32_t qRank = 0;               // rank whose slice q (and out, lse) is
  int32_t nSrc = 1;                // slices in k/v
  int64_t srcStride = 0;           // elements between sources; 0 = B*S*Hkv*D
  int32_t srcRank[kMaxSrc] = {0};  // rank of source j (its positions); read in order j = 0..
  int32_t smBudget = 0;            // persistent CTAs: 0 = every SM of the device
  int32_t schedule = -1;           // -1: MKERNEL_ATTN_SCHEDULE; 0: plain; 1: overlapped (FA3)
  int32_t d64Variant = -1;         // -1: MKERNEL_ATTN_D64_VARIANT; 0..kMaxD64Variant
  int32_t d128Variant = -1;        // -1: MKERNEL_ATTN_D128_VARIANT; 0..kMaxD128Variant
  AttnHooks hooks;
  // Dynamic tile schedule: a device int32 zeroed in stream order before the launch, from
  // which the CTAs claim tiles in order (heaviest first) instead of each walking a fixed
  // share; nullptr: the static schedule (MKERNEL_ATTN_TILE_ORDER). For kernels that share
  // the SMs with other kernels, whose CTAs become resident at different times.
  int32_t* tileClaim = nullptr;
};

// Host-only check (no CUDA call): false with the rule broken when the engine cannot run it.
bool canImplement(const AttnArgs& args, std::string* why);

// Checks (canImplement + device limits), then launches on `stream`; ncclInvalidArgument with
// a logged reason when the arguments are not supported.
ncclResult_t launch(const AttnArgs& args, cudaStream_t stream);

// Loads the kernel `args` selects without launching it (see gemm::preload).
ncclResult_t preload(const AttnArgs& args);

// The variant `args` runs: head dim 64 AttnArgs::d64Variant or its parameter, head dim 128
// d128Variant or its parameter; 0 for head dim 256, for the plain schedule, and for variants
// above kMaxRingD64Variant / kMaxRingD128Variant in the fused ring kernel (hooks.ready set).
// Host only.
int variantOf(const AttnArgs& args);

// Key rows per K/V block of head dim D in `variant` (the tensor maps' box, the kernel's kBN).
int kvRows(int D, int variant);

// Query rows per tile of head dim D in `variant` (the Q box, the kernel's kBM).
int qRows(int D, int variant);

// Dynamic shared memory of one attention CTA for head dim D and the variant variantOf gives
// (fused kernels size theirs with it; no default: a forgotten variant would size it wrong).
size_t smemBytes(int D, int variant);

}  // namespace attn
}  // namespace mk
