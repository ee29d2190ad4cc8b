// Primitives of the GEMM engine built on the PTX set (device/rt/ptx.cuh): shared-memory
// layout of one CTA, wgmma shared-memory descriptors, and the tile scheduler. Device code
// only (sm_90a).
#pragma once
#include <cuda.h>
#include <cstdint>

#include "fused/gemm/gemm.h"
#include "fused/gemm/raster.h"
#include "fused/gemm/streamk.h"
#include "device/rt/ptx.cuh"

namespace mk {
namespace gemm {

// Kernel parameters (one __grid_constant__ struct, so the tensor maps stay in param space
// and TMA reads them from there; CUtensorMap requires 64-byte alignment).
struct GemmParams {
  CUtensorMap tmA;
  CUtensorMap tmB;
  CUtensorMap tmD;  // valid when useTmaStore
  int32_t M, N, K;
  int32_t tilesM, tilesN, kTiles;
  int32_t groupM;
  int32_t useTmaStore;  // 0: direct st.global epilogue (D not 16-byte aligned)
  int32_t dTiled;       // tmD is the 4-D tile-by-tile view of D (GemmArgs::dTiled)
  int32_t wide;         // run WidePipe (GemmArgs::pipeline, resolved by buildParams)
  int32_t lend;         // run LendPipe (GemmArgs::pipeline 5)
  int32_t carry;        // run CarryPipe (GemmArgs::pipeline 6)
  int32_t pingpong;     // ping-pong consumers: 0 no, 1 128-column halves of tiles
                        // (GemmArgs::pipeline 3, gemm_pingpong.cuh), 2 whole 192-column units
                        // and tilesN counting them (4, gemm_pingunit.cuh)
  int32_t unitN;        // pipeline 4's unit width (kPingUnitN or kPingUnitNarrowN), else 0
  int32_t grpNum;       // GemmArgs::groups.num (0: not grouped); tmB is then 3-D
  int32_t swiglu;       // GemmArgs::swiglu: N is D's width (I), tmB's box 128 rows, up rows at N
  int32_t grpRaster;    // grouped raster: 0 = bands over all groups' row blocks, 1 = inside a group
  const int32_t* grpStart;
  const int32_t* grpCount;
  void* D;
  int64_t ldd;
  const void* C;
  int64_t ldc;
  float alpha, beta;
  int32_t cluster;     // CTAs per cluster (GemmArgs::cluster, resolved): 1, or 2 (Traits::kCluster)
  int32_t* tileClaim;  // GemmArgs::tileClaim: nullptr = the static schedule
  // 1: the counter is the engine's own (launch(): pipeline 0's carried epilogue or lent stage);
  // the launch's last claim (tiles + grid - 1) resets it to 0 for the next launch on the stream.
  int32_t claimReset;
  uint64_t* trace;  // GemmArgs::trace (trace.h): nullptr = off
  int32_t traceTiles;
  int32_t traceCtas;  // CTAs the trace buffer holds
  // The stand-alone kernel's consumers hand their staged boxes to store warps (gemm_kernel.cuh):
  // buildParams sets it where D goes through the TMA staging and no tileDone hook waits for
  // the stores; kernels built without store warps ignore it.
  int32_t storeWarps;
  // GemmArgs::regStores, resolved (1 only where D allows it): the cooperative kernels'
  // epilogue stores D from the accumulators (gemm_epilogue.cuh epilogueRegs), and so does the
  // unit walk's (gemm_pingunit.cuh unitEpilogue).
  int32_t regStores;
  // GemmArgs::skipStores, resolved (1 only with store threads): they issue no TMA stores.
  int32_t skipStores;
  // GemmArgs::storeHint, resolved (1 only where the cooperative kernels store D through its 2-D
  // map): D's stores carry L2 evict-first.
  int32_t storeHint;
  GemmHooks hooks;
  // Stream-K tail (GemmArgs::streamK, streamk.h): sk.units > 0 runs the stream-K kernel
  // variant (Traits::kStreamK). skWork: one partial per CTA ([cta][wg][32][128] float4, a
  // consumer thread's 128 accumulators in fragment order); skFlags: [cta][wg], a part is
  // published with skEpoch (per launch, increasing: nothing is ever reset).
  SkPlan sk;
  float4* skWork;
  uint64_t* skFlags;
  uint64_t skEpoch;
};

// Checks `args` (canImplement + device limits) and fills the kernel params; `grid` is the
// persistent CTA count (min(tiles, SM budget)). Used by launch() and by fused operators.
ncclResult_t buildParams(const GemmArgs& args, GemmParams* params, int32_t* grid);

// ---- configuration -----------------------------------------------------------------------

constexpr int kConsumerWGs = 2;
constexpr int kThreads = 128 * (1 + kConsumerWGs);
constexpr int kStageBytesA = kTileM * kTileK * 2;  // 16 KB
constexpr int kStageBytesB = kTileN * kTileK * 2;  // 32 KB
constexpr int kStageBytes = kStageBytesA + kStageBytesB;
// Epilogue staging unit: one 64-row x 128-byte box (the TMA store's box).
constexpr int kStoreBoxBytes = 64 * 128;
constexpr int kBarrierBytes = 256;
// Byte offsets in the barrier area of the stand-alone kernel's store-warp handshake
// (gemm_epilogue.cuh): 4 mbarriers, then LendPipe's `lentDone` mbarrier per stage, then 2
// mailboxes of 6 ints.
constexpr int kStoreBarsAt = 96;
constexpr int kLentBarsAt = 128;
constexpr int kStoreMailboxAt = 160;
// count (0: end), n0, m0, first chunk, first buffer, lent stage (-1: none; LendPipe)
constexpr int kMailboxInts = 6;
static_assert(kStoreBarsAt + 4 * 8 <= kLentBarsAt, "store barriers overlap the lent ones");
static_assert(kStoreMailboxAt + 2 * kMailboxInts * 4 <= kBarrierBytes,
              "store mailboxes do not fit");
constexpr int kMaxSmemPerBlock = 232448;  // sm_90 opt-in limit (227 KB)
static_assert(kStageBytesA % 1024 == 0 && kStageBytesB % 1024 == 0,
              "stage buffers must keep 1024-byte alignment for 128B swizzle");

// How shared memory is split between the load ring and the epilogue's store staging. The two
// compete for the same 227 KB, and which one matters depends on K:
//  - DeepPipe: 4 load stages, 2 store boxes per consumer WG. With many k-steps per tile the
//    deep ring keeps the tensor cores fed; the epilogue (once per long tile) may wait for its
//    own box stores.
//  - WidePipe: 3 load stages, a whole half-tile of boxes per consumer WG (16-bit outputs: 4).
//    With few k-steps the epilogue is a large share of a tile, and with 2 boxes every third
//    box waits for a TMA store issued just before to finish reading shared memory: measured
//    0.70-0.81x cuBLAS at K = 512-1024 on the H200. With a box per chunk the epilogue writes
//    all of them after one barrier and never waits for the stores of its own tile.
//  - LendPipe: the deep ring whose last stage of each tile is lent to the epilogue: once both
//    consumer WGs' wgmmas are done with it, each stages LentBufs boxes in it besides its own 2,
//    so a 16-bit half-tile is staged whole (as in WidePipe) while 4 stages feed the main loop.
//    The producer reloads the stage only once the store threads say their stores have read it
//    (gemm_epilogue.cuh); meanwhile it fills the other 3.
//  - CarryPipe (Carry 1): the deep ring whose epilogue stages only the first half of a 16-bit
//    half-tile (its 2 own boxes) and carries the second half in registers (packed: 32 a
//    thread) into the next tile's main loop, staging it there under the tensor work of that
//    tile's second k-step: neither the TMA's reading of the first boxes nor the second half's
//    staging holds the tensor cores (the deep ring's epilogue waited 1.5 us a tile for its own
//    stores; the lent stage leaves the next tile 3 stages). (Carrying fp32 accumulators
//    instead, 64 registers, spilled and measured slower: session 48, call BA.)
// GroupInts: shared ints for a grouped GEMM's tile prefix sums (0: not grouped).
template <int Stages, int StoreBufs, int GroupInts = 0, int LentBufs = 0, int Carry = 0>
struct PipeCfg {
  static constexpr int kStages = Stages;
  static constexpr int kStoreBufs = StoreBufs;  // per consumer WG
  static constexpr int kGroupInts = GroupInts;
  static constexpr int kLentBufs = LentBufs;  // per consumer WG, in the tile's last stage
  static constexpr int kCarry = Carry;        // 0 none, 1 the carried epilogue
  static_assert(Carry == 0 || (LentBufs == 0 && StoreBufs == 2),
                "the carried half-tile fills the 2 own boxes (no lent stage)");
  static_assert(kConsumerWGs * LentBufs * kStoreBoxBytes <= kStageBytes,
                "the lent boxes must fit in one stage");
  static_assert(LentBufs == 0 || kLentBarsAt + Stages * 8 <= kStoreMailboxAt,
                "a lentDone barrier per stage must fit");
  static constexpr int kStagingBytes = kConsumerWGs * StoreBufs * kStoreBoxBytes;
  // +1024: the dynamic smem base is only 16-byte aligned; SW128 tiles need 1024.
  static constexpr int kSmemBytes =
      Stages * kStageBytes + kStagingBytes + kBarrierBytes + 4 * GroupInts + 1024;
  static_assert(kSmemBytes <= kMaxSmemPerBlock, "GEMM CTA exceeds the sm_90 shared-memory limit");
  // full + empty mbarriers, then one abort word per stage (gemm_kernel.cuh); the store warps'
  // barriers and mailboxes from byte kStoreBarsAt of the area on
  static_assert(2 * Stages * 8 + Stages * 4 <= kStoreBarsAt, "barrier area too small");
  static_assert(StoreBufs >= 2, "the epilogue double-buffers at least");
};
using DeepPipe = PipeCfg<4, 2>;
using WidePipe = PipeCfg<3, 4>;
// GemmArgs::pipeline 5: the deep ring, its last stage of a tile lent to the epilogue.
using LendPipe = PipeCfg<4, 2, 0, 2>;
// GemmArgs::pipeline 6: the deep ring, the second half of each tile's epilogue carried into the
// next tile's main loop.
using CarryPipe = PipeCfg<4, 2, 0, 0, 1>;
// Grouped GEMMs: the deep ring plus the groups' tile prefix sums ([kMaxGroups + 1] ints).
using GroupPipe = PipeCfg<4, 2, kMaxGroups + 1>;
// Grouped GEMMs with the wide epilogue staging (GemmArgs::pipeline = 2, 16-bit outputs).
using GroupWidePipe = PipeCfg<3, 4, kMaxGroups + 1>;
// Grouped GEMMs with the carried epilogue (GemmArgs::pipeline = 6: B [N,K], 16-bit outputs,
// unpaired): the plain engine's choice at large K, where the grouped deep ring ran 0.97 of the
// plain engine (session 58).
using GroupCarryPipe = PipeCfg<4, 2, kMaxGroups + 1, 0, 1>;
// Shared memory a GEMM CTA is launched with, whichever pipeline it runs (fused kernels size
// their CTAs with it).
constexpr int kSmemBytes =
    DeepPipe::kSmemBytes > WidePipe::kSmemBytes ? DeepPipe::kSmemBytes : WidePipe::kSmemBytes;
static_assert(GroupPipe::kSmemBytes <= kMaxSmemPerBlock, "grouped GEMM CTA exceeds shared memory");
static_assert(GroupWidePipe::kSmemBytes <= kMaxSmemPerBlock,
              "grouped wide GEMM CTA exceeds shared memory");
static_assert(GroupCarryPipe::kSmemBytes <= kMaxSmemPerBlock,
              "grouped carried GEMM CTA exceeds shared memory");

// Register budgets (setmaxnreg): 384 threads start at 168; the three WGs must sum <= 504.
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
static_assert(kProducerRegs + kConsumerWGs * kConsumerRegs <= 504, "register budget exceeded");
static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0, "setmaxnreg needs multiples of 8");
// What every thread holds again after gemmCtaHandBack (a kernel of kThreads threads at one
// CTA per SM is launched with at most this many).
constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
static_assert(kLaunchRegs >= kProducerRegs && kLaunchRegs <= kConsumerRegs,
              "hand-back register count outside the roles' range");

// Addresses are computed from the stage index rather than kept in arrays: a run-time index
// into a register array would put it in local memory.
template <class Pipe>
struct SmemLayout {
  uint8_t* base;     // 1024-byte aligned
  uint8_t* staging;  // [wg][buf][64 rows][128 B]
  uint64_t* full;
  uint64_t* empty;
  int32_t* grp;  // [Pipe::kGroupInts]: tiles of groups 0..g-1 at [g] (grouped GEMMs)
  __device__ explicit SmemLayout(uint8_t* raw) {
    base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    staging = base + Pipe::kStages * kStageBytes;
    full = reinterpret_cast<uint64_t*>(staging + Pipe::kStagingBytes);
    empty = full + Pipe::kStages;
    grp = reinterpret_cast<int32_t*>(staging + Pipe::kStagingBytes + kBarrierBytes);
  }
  __device__ uint8_t* a(int32_t s) const { return base + s * kStageBytes; }
  __device__ uint8_t* b(int32_t s) const { return base + s * kStageBytes + kStageBytesA; }
};

// ---- wgmma shared-memory descriptors (128-byte swizzle) ---------------------------------

__device__ __forceinline__ uint64_t descField(uint32_t bytes) {
  return (bytes & 0x3FFFF) >> 4;
}

__device__ __forceinline__ uint64_t makeDesc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return descField(saddr) | (descField(lbo) << 16) | (descField(sbo) << 32) | (1ull << 62);
}

// K-major operand (rows of 64 elements = 128 B, 8-row atoms 1024 B apart). LBO is unused
// with SW128 K-major; the k16 slice advances the start address by 32 B inside the atom.
__device__ __forceinline__ uint64_t descKMajor(uint32_t saddr) {
  return makeDesc(saddr, 16, 1024);
}

// MN-major B ([K,N] row-major): 64-wide N blocks of BK rows x 128 B; LBO = distance between
// N blocks (BK*128 B), SBO = 8 K-rows (1024 B); a k16 slice is 16 rows = 2048 B further.
__device__ __forceinline__ uint64_t descMNMajor(uint32_t saddr) {
  return makeDesc(saddr, kTileK * 128, 1024);
}

// ---- tile scheduler ----------------------------------------------------------------------

// Maps the i-th tile of the persistent schedule to (mBlk, nBlk). Grouped raster: groups of
// groupM row blocks are walked column by column, so CTAs running at the same time share a
// few A row blocks and a band of B columns in L2. Caller order (tileOrder) or a row-block
// rotation override it for fused operators (e.g. local rows first).
__device__ __forceinline__ void tileCoords(const GemmParams& p, int32_t t, int32_t* mBlk,
                                           int32_t* nBlk) {
  if (p.hooks.tileOrder != nullptr) {
    const int32_t id = __ldg(p.hooks.tileOrder + t);
    *mBlk = id / p.tilesN;
    *nBlk = id - *mBlk * p.tilesN;
    return;
  }
  rasterCoords(p.tilesM, p.tilesN, p.groupM, t, mBlk, nBlk);
  if (p.hooks.rowBlockOffset != 0) *mBlk = (*mBlk + p.hooks.rowBlockOffset) % p.tilesM;
}

// ---- grouped GEMM schedule ----------------------------------------------------------------
//
// The row tiles of all groups form one virtual column of prefix[num] row blocks (group g owns
// blocks prefix[g] .. prefix[g+1]-1); its tiles are walked group by group, each with the
// grouped raster of an ordinary GEMM (GemmParams::grpRaster 1), so consecutive tiles share a
// group's B and a few of its A row blocks.

// A group's start or count. Not through the read-only (non-coherent) path: the fused MoE
// kernel's dispatch CTAs write them during the kernel (published to the GEMM CTAs by a flag
// they acquire first), which ld.global.nc does not promise to observe.
__device__ __forceinline__ int32_t ldGroupInt(const int32_t* p) {
  return *reinterpret_cast<const volatile int32_t*>(p);
}

// Warp 0 of the CTA: prefix[g] = row tiles of groups 0..g-1 (counts read from device memory),
// or with pairs = 2 (CTA pairs) row-tile pairs: a group of b row tiles holds (b + 1) / 2 pairs,
// so a pair never spans two groups (its CTAs share the group's B). The caller synchronises the
// CTA before anyone reads it.
__device__ __forceinline__ void groupPrefix(const GemmParams& p, int32_t* prefix,
                                            int32_t pairs = 1) {
  if (threadIdx.x >= 32) return;
  const int32_t lane = threadIdx.x;
  int32_t carry = 0;
  if (lane == 0) prefix[0] = 0;
  for (int32_t base = 0; base < p.grpNum; base += 32) {
    const int32_t g = base + lane;
    const int32_t c = g < p.grpNum ? ldGroupInt(p.grpCount + g) : 0;
    int32_t v = c > 0 ? ((c + kTileM - 1) / kTileM + pairs - 1) / pairs : 0;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {  // inclusive scan over the warp
      const int32_t u = __shfl_up_sync(0xffffffffu, v, d);
      if (lane >= d) v += u;
    }
    if (g < p.grpNum) prefix[g + 1] = carry + v;
    carry += __shfl_sync(0xffffffffu, v, 31);
  }
}

// Tile t of a grouped GEMM: its group, first row (in A and D) and column block (raster.h:
// groupTileCoords, GemmParams::grpRaster). The caller walks t < prefix[num] * tilesN.
__device__ __forceinline__ void groupTile(const GemmParams& p, const int32_t* prefix, int32_t t,
                                          int32_t* group, int32_t* m0, int32_t* nBlk) {
  int32_t g, blk;
  groupTileCoords(p.grpNum, prefix, p.tilesN, p.groupM, p.grpRaster, t, &g, &blk, nBlk);
  *group = g;
  *m0 = ldGroupInt(p.grpStart + g) + blk * kTileM;
}

// Position t of a grouped GEMM walked by CTA pairs (prefix from groupPrefix(..., 2)): the
// group, this CTA's first row and the column block. The pair's row tiles are 2 pm and 2 pm + 1
// of the group (bands of groupM / 2 pairs keep groupM row tiles); where the group's row tile
// count is odd its last pair's second tile lies past the group (its rows may be the next
// group's): *m0 is then p.tilesM * kTileM, past D, so its TMA stores fall outside D and the
// direct epilogue's row checks skip it, as for a plain pair's tile past M.
__device__ __forceinline__ void groupPairTile(const GemmParams& p, const int32_t* prefix, int32_t t,
                                              int32_t rank, int32_t* group, int32_t* m0,
                                              int32_t* nBlk) {
  int32_t g, pm;
  groupTileCoords(p.grpNum, prefix, p.tilesN, max(1, p.groupM / 2), p.grpRaster, t, &g, &pm, nBlk);
  const int32_t blk = 2 * pm + rank;
  const int32_t blocks = (ldGroupInt(p.grpCount + g) + kTileM - 1) / kTileM;
  *group = g;
  *m0 = blk < blocks ? ldGroupInt(p.grpStart + g) + blk * kTileM : p.tilesM * kTileM;
}

}  // namespace gemm
}  // namespace mk
