// The GEMM CTA's epilogue (gemm_kernel.cuh): a finished tile's fp32 accumulators converted and
// stored to D, through 128B-swizzled staging and TMA stores, or straight from the fragment
// when D has no tensor map; the SwiGLU epilogue of gated tiles. Templates on the kernel's
// Traits (Tr::kOutType, kBoxCols, kChunks, kGroup, kGated, Pipe); also used by the ping-pong
// consumers, the chained GEMMs and the attention engine (the output conversions).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device/rt/ptx_ext.cuh"
#include "fused/gemm/primitives.cuh"

namespace mk {
namespace gemm {

// ---- output conversion --------------------------------------------------------------------

template <DType kOut>
__device__ __forceinline__ float loadOut(const void* base, int64_t idx) {
  if constexpr (kOut == DType::kF32) {
    return __ldg(static_cast<const float*>(base) + idx);
  } else if constexpr (kOut == DType::kBF16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[idx]);
  } else {
    return __half2float(static_cast<const __half*>(base)[idx]);
  }
}

template <DType kOut>
__device__ __forceinline__ void storeOut(void* base, int64_t idx, float v) {
  if constexpr (kOut == DType::kF32) {
    static_cast<float*>(base)[idx] = v;
  } else if constexpr (kOut == DType::kBF16) {
    static_cast<__nv_bfloat16*>(base)[idx] = __float2bfloat16_rn(v);
  } else {
    static_cast<__half*>(base)[idx] = __float2half_rn(v);
  }
}

template <DType kOut>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (kOut == DType::kBF16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// ---- epilogue -----------------------------------------------------------------------------

// Two 16-bit values of D from two accumulators, rounded to nearest. kUnitAlpha: alpha is 1
// (checked by the caller), so the multiply is left out: 128 of them a thread and tile, 0.15 us
// of a 1.5 us epilogue at 8192 x 8192 x 1024 on the H100 (session 42's trace); x * 1 is x.
template <DType kOut, bool kUnitAlpha>
__device__ __forceinline__ uint32_t packOut(float alpha, float a, float b) {
  if constexpr (!kUnitAlpha) {
    a *= alpha;
    b *= alpha;
  }
  return pack2<kOut>(a, b);
}

// One 64-column box of a warp's 16 rows into 128B-swizzled staging with stmatrix: one
// instruction stores a lane's pairs of two 8-column groups, both row halves (matrix q =
// lane / 8: group j + q / 2, rows 8 * (q % 2) of the warp's 16), a quarter of the st.shared
// count (the consumers' tensor cores idle through this). pk: the box's 32 accumulators as 16
// packed pairs (pk[i] from accumulators 2i, 2i + 1).
__device__ __forceinline__ void stageBoxPacked(uint8_t* buf, const uint32_t* pk, int32_t warp,
                                               int32_t lane) {
  const int q = lane >> 3, row = warp * 16 + 8 * (q & 1) + (lane & 7);
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    const int chunk = j + (q >> 1);  // this lane's row address: its 16-byte chunk
    ptx::stmatrixX4(ptx::smemAddr(buf + row * 128 + ((chunk ^ (row & 7)) << 4)), pk[2 * j],
                    pk[2 * j + 1], pk[2 * j + 2], pk[2 * j + 3]);
  }
}

// A box's 32 accumulators packed into 16 pairs of D's type.
template <DType kOut, bool kUnitAlpha>
__device__ __forceinline__ void packBox(uint32_t* pk, const float* acc, float alpha) {
#pragma unroll
  for (int i = 0; i < 16; ++i) pk[i] = packOut<kOut, kUnitAlpha>(alpha, acc[2 * i], acc[2 * i + 1]);
}

template <DType kOut, bool kUnitAlpha>
__device__ __forceinline__ void stageBoxStmatrix(uint8_t* buf, const float* acc, float alpha,
                                                 int32_t warp, int32_t lane) {
  uint32_t pk[16];
  packBox<kOut, kUnitAlpha>(pk, acc, alpha);
  stageBoxPacked(buf, pk, warp, lane);
}

// ---- store warps (GemmParams::storeWarps) ---------------------------------------------------
// A consumer thread issuing the TMA stores of its warpgroup's boxes waited ~0.7 us a tile for
// the TMA unit to take them (both warpgroups' 8 boxes at once, behind the producer's loads),
// and its warpgroup's next wgmma waited for that thread (session 42, calls X and Y). In the
// stand-alone kernel lane 0 of warp 1 + wg of the producer warpgroup (idle there) issues them
// instead. The handshake is two mbarriers per consumer warpgroup, not named barriers, so that
// no consumer warp waits for another (call Y: a named barrier over the warpgroup cost 0.25 us a
// tile, the spread of its warps' last wgmmas):
//  - free[wg] (1 arrive): the staging may be written. The store thread arrives once at the
//    start, then after each group's stores have read it (all but the newest kBufs - kGroup);
//  - full[wg] (one arrive per consumer warp): a group of boxes is staged. Each lane fences its
//    shared writes for the async proxy, the warp syncs, lane 0 arrives (release); thread 0 of
//    the warpgroup has written the mailbox before its warp's arrive.
// Post j waits for free's phase j and completes full's phase j; the store thread handles post
// j after full's phase j and then completes free's phase j + 1, so neither side runs a phase
// ahead (parities never alias). A posted count of 0 ends the store thread's loop.
// LendPipe: a post also names the tile's last stage (mailbox word 5), in which the post's last
// boxes are staged. The consumers released that stage as any other, so its `empty` phase tells
// a warpgroup when both warpgroups' wgmmas are done reading it (the other warpgroup's B and A
// rows lie under this one's lent boxes): it waits for that phase before writing them. The
// producer waits for the stage's lentDone barrier too before reloading it: one arrive per
// consumer warpgroup and lent tile, from the store thread once the post's stores have read the
// staging, or from the warpgroup itself when it posted nothing (its half-tile past M).

template <class Pipe>
__device__ __forceinline__ uint64_t* storeBar(const SmemLayout<Pipe>& sm, int which, int32_t wg) {
  return reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(sm.full) + kStoreBarsAt) +
         2 * which + wg;  // which: 0 = full, 1 = free
}

// Staging box `idx` (< Tr::kBufs) of warpgroup wg: its own boxes first, then (LendPipe) its
// boxes in the lent stage `lent`.
template <class Pipe>
__device__ __forceinline__ uint8_t* stagingBox(const SmemLayout<Pipe>& sm, int32_t wg, uint32_t idx,
                                               int32_t lent) {
  constexpr uint32_t kOwn = Pipe::kStoreBufs;
  if (Pipe::kLentBufs == 0 || idx < kOwn) return sm.staging + (wg * kOwn + idx) * kStoreBoxBytes;
  return sm.a(lent) + (wg * Pipe::kLentBufs + idx - kOwn) * kStoreBoxBytes;
}

template <class Pipe>
__device__ __forceinline__ uint64_t* lentDone(const SmemLayout<Pipe>& sm, int32_t stage) {
  return reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(sm.full) + kLentBarsAt) + stage;
}

template <class Pipe>
__device__ __forceinline__ volatile int32_t* storeMailbox(const SmemLayout<Pipe>& sm, int32_t wg) {
  return reinterpret_cast<volatile int32_t*>(reinterpret_cast<uint8_t*>(sm.full) +
                                             kStoreMailboxAt) +
         wg * kMailboxInts;
}

// Thread 0, before the CTA's barrier and the fence that initPipe ends with.
template <class Pipe>
__device__ __forceinline__ void initStoreBars(const SmemLayout<Pipe>& sm) {
  for (int wg = 0; wg < kConsumerWGs; ++wg) {
    ptx::mbarInit(storeBar(sm, 0, wg), 4);
    ptx::mbarInit(storeBar(sm, 1, wg), 1);
  }
  if constexpr (Pipe::kLentBufs > 0) {
    for (int s = 0; s < Pipe::kStages; ++s) ptx::mbarInit(lentDone(sm, s), kConsumerWGs);
  }
}

// The consumer warpgroup's post `posts` (then counted): every lane, after its shared writes
// and its fence for the async proxy.
template <class Pipe>
__device__ __forceinline__ void postStores(const SmemLayout<Pipe>& sm, int32_t wg, int32_t count,
                                           int32_t n0, int32_t m0, int32_t c0, int32_t buf,
                                           int32_t lent, uint32_t* posts) {
  if ((threadIdx.x & 127) == 0) {
    volatile int32_t* box = storeMailbox(sm, wg);
    box[0] = count;
    box[1] = n0;
    box[2] = m0;
    box[3] = c0;
    box[4] = buf;
    box[5] = lent;
  }
  __syncwarp();
  if ((threadIdx.x & 31) == 0) ptx::mbarArrive(storeBar(sm, 0, wg));
  ++*posts;
}

// The TMA stores of `count` staged boxes of warpgroup wg's half-tile (chunks c0.., staging
// buffers buf0.. in rotation), one bulk group each: issued by the warpgroup's thread 0 or by
// its store thread.
template <class Tr>
__device__ __forceinline__ void issueBoxStores(const GemmParams& p,
                                               const SmemLayout<typename Tr::Pipe>& sm, int32_t wg,
                                               int32_t n0, int32_t m0, int32_t c0, int32_t count,
                                               uint32_t buf0, int32_t lent) {
  constexpr int kEC = Tr::kBoxCols, kBufs = Tr::kBufs;
  const uint64_t policy = p.storeHint ? ptx::l2EvictFirstPolicy() : 0;
  for (int g = 0; g < count; ++g) {
    const int c = c0 + g;
    uint8_t* buf = stagingBox(sm, wg, (buf0 + g) % kBufs, lent);
    if (p.skipStores) {
      // (an empty bulk group: the waits on this post's reads pass at once)
    } else if (p.dTiled) {
      ptx::tmaStore4d(&p.tmD, buf, c * kEC, 64 * wg, n0 / kTileN, m0 / kTileM);
    } else if (p.storeHint) {
      ptx::tmaStore2dHint(&p.tmD, buf, n0 + c * kEC, m0 + 64 * wg, policy);
    } else {
      ptx::tmaStore2d(&p.tmD, buf, n0 + c * kEC, m0 + 64 * wg);
    }
    ptx::bulkCommit();
  }
}

// The store thread of consumer warpgroup wg.
template <class Tr>
__device__ __forceinline__ void storeThreadLoop(const GemmParams& p,
                                                const SmemLayout<typename Tr::Pipe>& sm,
                                                int32_t wg) {
  constexpr int kBufs = Tr::kBufs, kGroup = Tr::kGroup;
  const volatile int32_t* box = storeMailbox(sm, wg);
  ptx::mbarArrive(storeBar(sm, 1, wg));  // the staging starts free
  for (uint32_t k = 0;; ++k) {
    ptx::mbarWait(storeBar(sm, 0, wg), k & 1);
    const int32_t count = box[0];
    if (count == 0) break;
    const int32_t lent = box[5];
    issueBoxStores<Tr>(p, sm, wg, box[1], box[2], box[3], count, (uint32_t)box[4], lent);
    // LendPipe: kBufs == kGroup, so every store of the post has read its box here
    ptx::bulkWaitRead<kBufs - kGroup>();
    if constexpr (Tr::Pipe::kLentBufs > 0) {
      if (lent >= 0) ptx::mbarArrive(lentDone(sm, lent));
    }
    ptx::mbarArrive(storeBar(sm, 1, wg));
  }
  ptx::bulkWait<0>();  // shared memory must outlive the last bulk stores reading it
}

// rec (traced launches): words 4-6 of the warpgroup's record (trace.h), stamped by thread 0
// for the first group of boxes. kStoreWarp: the stand-alone kernel, whose store threads issue
// the stores when p.storeWarps says so (posts: the warpgroup's count). kUnitAlpha: alpha is 1.
// lent (LendPipe, store threads only): the tile's last stage, or -1; lentPh: the parity of its
// `empty` phase that completes once both warpgroups released it. True when the post went to
// the store thread with the lent stage (which then arrives on lentDone); false when the
// warpgroup posted nothing (its half-tile past M) and must arrive itself.
template <class Tr, bool kStoreWarp, bool kUnitAlpha>
__device__ __forceinline__ bool epilogueTma(const GemmParams& p,
                                            const SmemLayout<typename Tr::Pipe>& sm,
                                            float (&acc)[128], int32_t wg, int32_t m0, int32_t n0,
                                            uint32_t& nStores, uint64_t* rec, uint32_t* posts,
                                            int32_t lent, uint32_t lentPh) {
  constexpr bool kLend = Tr::Pipe::kLentBufs > 0;
  constexpr int kEC = Tr::kBoxCols, kBufs = Tr::kBufs, kGroup = Tr::kGroup;
  const int32_t tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
  const int32_t rowBase = m0 + 64 * wg;
  if (rowBase >= p.M) return false;  // the whole half-tile is past M (uniform over the WG)
  bool handed = false;
  const bool useBeta = p.beta != 0.0f;
  const float alpha = Tr::kGated ? 1.0f : p.alpha;  // swigluAcc applied it
#pragma unroll
  for (int c0 = 0; c0 < Tr::kChunks; c0 += kGroup) {
    if (n0 + c0 * kEC >= p.N) break;  // uniform: later chunks are past N too
    const int valid = min(kGroup, (p.N - n0 - c0 * kEC + kEC - 1) / kEC);
    // Buffers rotate per store issued (not per chunk: a tile clipped at N issues fewer), one
    // bulk group per store, so the stores that last read this group's buffers are all but
    // the kBufs - kGroup most recent ones.
    const bool handOff = kStoreWarp && p.storeWarps != 0;
    if (handOff) {
      ptx::mbarWait(storeBar(sm, 1, wg), *posts & 1);
    } else {
      if (tid == 0) ptx::bulkWaitRead<kBufs - kGroup>();
      ptx::namedBarSync(1 + wg, 128);
    }
    if (rec != nullptr && c0 == 0) rec[4] = (uint64_t)clock64();
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int c = c0 + g;
      if (g >= valid) break;
      // LendPipe: box g is staging box g (nStores advances by kBufs), the lent ones last, once
      // the other warpgroup's wgmmas are done with the stage too.
      // (lent >= 0 whenever kLend reaches here: the kernel lends exactly when p.storeWarps is
      // set, which is also what makes handOff true.)
      if (kLend && g == Tr::Pipe::kStoreBufs) ptx::mbarWait(&sm.empty[lent], lentPh);
      uint8_t* buf = stagingBox(sm, wg, (nStores + g) % kBufs, lent);
      if constexpr (Tr::kOutBytes == 2) {
        if (!useBeta) {
          static_assert(Tr::kOutBytes != 2 || kEC == 64, "a 16-bit box row is 64 columns");
          const float* box = acc + c * kEC / 2;  // 8 groups of 4 accumulators
          stageBoxStmatrix<Tr::kOutType, kUnitAlpha>(buf, box, alpha, warp, lane);
          continue;
        }
      }
#pragma unroll
      for (int j = 0; j < kEC / 8; ++j) {
        const int ib = (c * kEC / 8 + j) * 4;  // accumulator index of this 8-column group
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int32_t r = warp * 16 + (lane >> 2) + 8 * h;
          const int32_t cc = 8 * j + 2 * (lane & 3);
          float v0 = alpha * acc[ib + 2 * h], v1 = alpha * acc[ib + 2 * h + 1];
          if (useBeta) {
            const int32_t gm = rowBase + r, gn = n0 + c * kEC + cc;
            if (gm < p.M) {
              const int64_t idx = (int64_t)gm * p.ldc + gn;
              if (gn < p.N) v0 += p.beta * loadOut<Tr::kOutType>(p.C, idx);
              if (gn + 1 < p.N) v1 += p.beta * loadOut<Tr::kOutType>(p.C, idx + 1);
            }
          }
          const uint32_t byte = cc * Tr::kOutBytes;
          uint8_t* dst = buf + r * 128 + ((((byte >> 4) ^ (r & 7))) << 4) + (byte & 15);
          if constexpr (Tr::kOutBytes == 4) {
            *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
          } else {
            *reinterpret_cast<uint32_t*>(dst) = pack2<Tr::kOutType>(v0, v1);
          }
        }
      }
    }
    if (rec != nullptr && c0 == 0) rec[5] = (uint64_t)clock64();
    // stores above are generic-proxy writes that the TMA engine (async proxy) reads next
    ptx::fenceProxyAsyncShared();
    if (handOff) {
      postStores(sm, wg, valid, n0, m0, c0, (int32_t)(nStores % kBufs), lent, posts);
      handed = true;
      if (rec != nullptr && c0 == 0) rec[6] = (uint64_t)clock64();
      nStores += kLend ? kBufs : valid;
      continue;
    }
    ptx::namedBarSync(1 + wg, 128);
    if (rec != nullptr && c0 == 0) rec[6] = (uint64_t)clock64();
    if (tid == 0) issueBoxStores<Tr>(p, sm, wg, n0, m0, c0, valid, nStores, lent);
    nStores += valid;
  }
  return handed;
}

// ---- carried epilogue (CarryPipe: GemmArgs::pipeline 6) ------------------------------------
// A tile's epilogue stages its first two boxes (the own staging) and posts them to the store
// thread; the last two stay in registers, packed, and carryStage stages them in the next tile's
// main loop, after that tile's second k-step is issued (the store thread has long read the
// first two, so its wait rarely blocks), or after the walk's last tile. (Staging the first half
// under the second half's wgmmas, the tile's last k-step issued as two 128-column groups, was
// no faster: session 48, call BB.) The store thread's protocol is unchanged:
// posts of kGroup = 2 boxes, each waited for by bulkWaitRead<0> before the staging is free.

// The carried half of a warpgroup's tile: its position, the boxes left (0: none) and their
// packed pairs (2 boxes x 16).
struct Carried {
  int32_t m0, n0, count;
  uint32_t r[32];
};

// A finished tile's epilogue (16-bit D through TMA stores and store threads): boxes 0 and 1
// (those inside N) staged from accumulators 0..63 and posted; `c` gets the tile, the count of
// boxes 2 and 3 inside N and their packed pairs. Nothing when the warpgroup's half-tile is past M.
template <class Tr, bool kUnitAlpha>
__device__ __forceinline__ void carryEpilogue(const GemmParams& p,
                                              const SmemLayout<typename Tr::Pipe>& sm,
                                              const float (&acc)[128], int32_t wg, int32_t m0,
                                              int32_t n0, uint32_t* posts, Carried& c,
                                              uint64_t* rec) {
  constexpr int kEC = Tr::kBoxCols, kHalf = Tr::kBufs;
  const int32_t tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
  c.count = 0;
  // Uniform over the warpgroup.
  if (m0 + 64 * wg >= p.M) return;
  const int32_t boxes = min(Tr::kChunks, (p.N - n0 + kEC - 1) / kEC);  // n0 < N
  const int32_t first = min(kHalf, boxes);
  ptx::mbarWait(storeBar(sm, 1, wg), *posts & 1);
  if (rec != nullptr) rec[4] = (uint64_t)clock64();
#pragma unroll
  for (int g = 0; g < kHalf; ++g) {
    if (g >= first) break;
    stageBoxStmatrix<Tr::kOutType, kUnitAlpha>(stagingBox(sm, wg, g, -1), acc + g * kEC / 2,
                                               p.alpha, warp, lane);
  }
  if (rec != nullptr) rec[5] = (uint64_t)clock64();
  ptx::fenceProxyAsyncShared();
  postStores(sm, wg, first, n0, m0, 0, 0, -1, posts);
  if (rec != nullptr) rec[6] = (uint64_t)clock64();
  c.m0 = m0;
  c.n0 = n0;
  c.count = boxes - first;
  if (c.count == 0) return;
#pragma unroll
  for (int g = 0; g < kHalf; ++g)
    packBox<Tr::kOutType, kUnitAlpha>(c.r + 16 * g, acc + (kHalf + g) * kEC / 2, p.alpha);
}

// The carried boxes staged and posted (the caller: the next tile's main loop, or the end of
// the walk); nothing when none are carried.
template <class Tr>
__device__ __forceinline__ void carryStage(const SmemLayout<typename Tr::Pipe>& sm, int32_t wg,
                                           uint32_t* posts, Carried& c) {
  constexpr int kHalf = Tr::kBufs;
  if (c.count == 0) return;
  const int32_t tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
  ptx::mbarWait(storeBar(sm, 1, wg), *posts & 1);
#pragma unroll
  for (int g = 0; g < kHalf; ++g) {
    if (g >= c.count) break;
    stageBoxPacked(stagingBox(sm, wg, g, -1), c.r + 16 * g, warp, lane);
  }
  ptx::fenceProxyAsyncShared();
  postStores(sm, wg, c.count, c.n0, c.m0, kHalf, 0, -1, posts);
  c.count = 0;
}

// A 4x4 transpose of 32-bit words across a quad of lanes (q = lane & 3): before, v[t] is
// element (q, t); after, v[k] is element (k, q). Two butterfly rounds, each swapping the
// off-diagonal 2x2 blocks, so every select is between two registers (no run-time indexing).
__device__ __forceinline__ void quadTranspose(uint32_t (&v)[4], int32_t q) {
  const bool hi = (q & 2) != 0, odd = (q & 1) != 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t r = __shfl_xor_sync(0xffffffffu, hi ? v[i] : v[i + 2], 2);
    if (hi) {
      v[i] = r;
    } else {
      v[i + 2] = r;
    }
  }
#pragma unroll
  for (int i = 0; i < 4; i += 2) {
    const uint32_t r = __shfl_xor_sync(0xffffffffu, odd ? v[i] : v[i + 1], 1);
    if (odd) {
      v[i] = r;
    } else {
      v[i + 1] = r;
    }
  }
}

// GemmParams::regStores: D straight from the fragment, with no staging and no TMA store (no
// faster than the TMA epilogue where measured: GemmArgs::regStores). In the m64nN fragment
// lane q of a quad holds columns 2q, 2q + 1 of each 8-column group j (accumulators 4j + 2h,
// 4j + 2h + 1 for row half h); over groups j0..j0+3 the quad's words form a 4x4 matrix
// (lane, group), whose transpose leaves lane q the 8 columns of group j0 + q: one 16-byte store,
// and a warp's store covers 64 contiguous bytes of each of its 8 rows. buildParams allows it
// for 16-bit D, beta 0, 16-byte aligned rows and N % 8 == 0 only, so a store is wholly inside
// or wholly past N.
template <class Tr, bool kUnitAlpha>
__device__ __forceinline__ void epilogueRegs(const GemmParams& p, const float (&acc)[128],
                                             int32_t wg, int32_t m0, int32_t n0) {
  static_assert(Tr::kOutBytes == 2, "16-byte stores of 8 columns: 16-bit D only");
  const int32_t tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31, q = lane & 3;
  const int32_t row0 = m0 + 64 * wg + warp * 16 + (lane >> 2);
  uint16_t* d = static_cast<uint16_t*>(p.D);
#pragma unroll
  for (int j0 = 0; j0 < Tr::kAccOut / 4; j0 += 4) {
    if (n0 + 8 * j0 >= p.N) break;  // uniform: later groups are past N too
    const int32_t col = n0 + 8 * (j0 + q);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t v[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int i = 4 * (j0 + t) + 2 * h;
        v[t] = packOut<Tr::kOutType, kUnitAlpha>(p.alpha, acc[i], acc[i + 1]);
      }
      quadTranspose(v, q);
      const int32_t row = row0 + 8 * h;
      if (row < p.M && col < p.N)
        *reinterpret_cast<uint4*>(d + (int64_t)row * p.ldd + col) =
            make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
}

// Fallback when D cannot be described by a tensor map (pointer or row pitch not 16-byte
// aligned): bounds-checked scalar stores straight from the fragment.
template <class Tr>
__device__ __forceinline__ void epilogueDirect(const GemmParams& p, float (&acc)[128], int32_t wg,
                                               int32_t m0, int32_t n0) {
  const int32_t tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
  const float alpha = Tr::kGated ? 1.0f : p.alpha;  // swigluAcc applied it
#pragma unroll
  for (int i = 0; i < Tr::kAccOut; ++i) {
    const int32_t gm = m0 + 64 * wg + warp * 16 + (lane >> 2) + 8 * ((i >> 1) & 1);
    const int32_t gn = n0 + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
    if (gm < p.M && gn < p.N) {
      float v = alpha * acc[i];
      if (p.beta != 0.0f) v += p.beta * loadOut<Tr::kOutType>(p.C, (int64_t)gm * p.ldc + gn);
      storeOut<Tr::kOutType>(p.D, (int64_t)gm * p.ldd + gn, v);
    }
  }
}

// SwiGLU of a gated tile (Traits::kGated), in place: in the m64n256 fragment a thread's
// accumulator i < 64 and i + 64 are the same row, columns c and c + 128, i.e. gate column c
// and the up column it gates. silu(g) = g / (1 + e^-g) (e^-g = inf for very negative g gives
// -0, the limit), computed in fp32 before the one rounding to D's type.
__device__ __forceinline__ void swigluAcc(float alpha, float (&acc)[128]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const float g = alpha * acc[i], u = alpha * acc[i + 64];
    acc[i] = g / (1.0f + __expf(-g)) * u;
  }
}

// A finished tile's accumulators to D (SwiGLU first for gated tiles). kStoreWarp, lent, lentPh
// and the result: see epilogueTma (false: the caller arrives on a lent stage's lentDone). kRegs:
// the kernel has the register-store epilogue (GemmParams::regStores; the traced wide split and
// LendPipe leave it out: with it, the traced wide split spilled 8 bytes, and buildParams never
// resolves regStores for either).
template <class Tr, bool kStoreWarp = false, bool kRegs = true>
__device__ __forceinline__ bool tileEpilogue(const GemmParams& p,
                                             const SmemLayout<typename Tr::Pipe>& sm,
                                             float (&acc)[128], int32_t wg, int32_t m0, int32_t n0,
                                             uint32_t& nStores, uint64_t* rec = nullptr,
                                             uint32_t* posts = nullptr, int32_t lent = -1,
                                             uint32_t lentPh = 0) {
  if constexpr (Tr::kGated) swigluAcc(p.alpha, acc);
  if constexpr (Tr::kOutBytes == 2 && kRegs) {
    if (p.regStores) {
      if (Tr::kGated || p.alpha == 1.0f) {
        epilogueRegs<Tr, true>(p, acc, wg, m0, n0);
      } else {
        epilogueRegs<Tr, false>(p, acc, wg, m0, n0);
      }
      return false;
    }
  }
  if (p.useTmaStore) {
    // Gated tiles had alpha applied by swigluAcc. Two whole epilogues rather than a branch
    // per box (which cost a traced kernel spills).
    if (Tr::kGated || p.alpha == 1.0f)
      return epilogueTma<Tr, kStoreWarp, true>(p, sm, acc, wg, m0, n0, nStores, rec, posts, lent,
                                               lentPh);
    return epilogueTma<Tr, kStoreWarp, false>(p, sm, acc, wg, m0, n0, nStores, rec, posts, lent,
                                              lentPh);
  }
  epilogueDirect<Tr>(p, acc, wg, m0, n0);
  return false;
}

}  // namespace gemm
}  // namespace mk
