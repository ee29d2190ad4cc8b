// Hopper (sm_90a) GEMM engine: D = alpha * A·B + beta * C, the compute core that every
// fused operator shares. Internal API (namespace mk::gemm); the public fused entry points
// live in include/mkernel/fused.h.
//
//   A: [M, K] row-major (lda >= K), bf16 or fp16.
//   B: [K, N] row-major (BLayout::kKN, ldb >= N) or [N, K] row-major (BLayout::kNK, the
//      PyTorch Linear weight layout, ldb >= K); same type as A.
//   D: [M, N] row-major (ldd >= N), bf16, fp16 or fp32. C (optional, beta != 0): D's type
//      and shape, leading dimension ldc; C may alias D (in-place C = A·B + beta·C).
// Accumulation is fp32. See docs/gemm-notes.md for the design and measured speed.
#pragma once
#include <cstdint>
#include <string>
#include <cuda.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "device/rt/err.h"

namespace mk {
namespace gemm {

enum class DType : int32_t { kBF16 = 0, kF16 = 1, kF32 = 2 };
enum class BLayout : int32_t { kKN = 0, kNK = 1 };

const char* dtypeName(DType t);
size_t dtypeSize(DType t);

// Hooks for fused operators. All default to off; the plain GEMM pays one predictable
// branch per tile for each.
struct GemmHooks {
  // (1) Producer waits, before loading any A rows of a tile, until
  //     rowReady[r / rowsPerFlag] >= rowReadyExpected for every row r of the tile, then
  //     issues fence.proxy.async (flags come through the generic proxy, A through TMA).
  const uint64_t* rowReady = nullptr;
  uint64_t rowReadyExpected = 0;
  int32_t rowsPerFlag = 128;
  bool rowReadySys = false;     // system-scope acquire (flags written by a peer GPU/host)
  bool rowReadyIsPeer = false;  // flag f is written for rank f (a timeout then names it)

  // (2) Epilogue publishes each finished tile (once the next tile's main loop is done, or at
  //     the end; rowReady flags must therefore not depend on tileDone flags), so the
  //     consumers do not stall on their stores: the tile's stores complete
  //     (cp.async.bulk.wait_group 0), then tileDone[mBlk * tilesN + nBlk] = tileDoneValue
  //     with st.release.gpu (or .sys).
  uint64_t* tileDone = nullptr;
  uint64_t tileDoneValue = 0;
  bool tileDoneSys = false;
  //     Row-count mode: tileDone[mBlk] += 1 per finished tile (red.release) instead of the
  //     per-tile store, so that one counter per row block reaches tilesN once the whole row
  //     block is stored: what a consumer of whole rows (a second GEMM reading D as its A
  //     through rowReady, a combine) waits for with one flag. tileDoneValue is unused; the
  //     counters start from zero (no seqBase).
  bool tileDoneRows = false;

  // (3) Tile order. tileOrder (device array of tilesM*tilesN ints, a permutation of tile
  //     ids mBlk*tilesN+nBlk) replaces the grouped raster. Otherwise the raster's row
  //     block is rotated: mBlk' = (mBlk + rowBlockOffset) mod tilesM (e.g. local rows first).
  const int32_t* tileOrder = nullptr;
  int32_t rowBlockOffset = 0;

  // (4) Device-resident call sequence. When set, every flag value above is relative:
  //     the producer waits for rowReady >= *seqBase + rowReadyExpected and the epilogue
  //     publishes *seqBase + tileDoneValue. *seqBase is read once per tile and must not
  //     change while the kernel runs (the fused operators advance it in their last CTA),
  //     so a launch captured in a CUDA graph publishes a new value at every replay.
  const uint64_t* seqBase = nullptr;

  // Bounds every flag wait (abort flag, deadline, error record): the comm's
  // (fused/core/fused_comm.h) or a stand-alone domain's (rt::domainCtx).
  rt::WaitCtx wait{};
};

// Grouped GEMM (MoE experts): group g multiplies rows [rowStart[g], rowStart[g] + rowCount[g])
// of A by its own B_g into the same rows of D. Starts and counts live in device memory and are
// read by the kernel (no host synchronisation: a dispatch kernel may have written them just
// before, in stream order). Every group's rows start on a tile boundary (rowStart[g] %
// kTileM == 0), and a group's last tile is computed and stored whole: rows from rowStart[g] +
// rowCount[g] up to the next multiple of kTileM are written with unspecified values, so the
// caller's packed layout leaves them as padding (no other group may start before it).
// B is [groups][N][K] (kNK) or [groups][K][N] (kKN), each group ldb-pitched, groups strideB
// elements apart (0 = N * ldb or K * ldb). Of the hooks a grouped GEMM takes rowReady (and
// seqBase, wait): flags over A's packed rows, so that rows may land while the GEMM runs (a
// fused dispatch releases a tile's flags once its rows from every source are in place).
struct GemmGroups {
  int32_t num = 0;                    // groups; 0 = an ordinary GEMM
  const int32_t* rowStart = nullptr;  // [num], device
  const int32_t* rowCount = nullptr;  // [num], device; negative counts count as 0
  int64_t strideB = 0;
};

struct GemmArgs {
  int32_t M = 0, N = 0, K = 0;
  const void* A = nullptr;
  int64_t lda = 0;  // 0 = K
  const void* B = nullptr;
  int64_t ldb = 0;  // 0 = N (kKN) or K (kNK)
  BLayout bLayout = BLayout::kNK;
  DType abType = DType::kBF16;
  void* D = nullptr;
  int64_t ldd = 0;  // 0 = D's width (N, or N / 2 with swiglu)
  DType dType = DType::kBF16;
  const void* C = nullptr;  // nullptr with beta != 0 means C = D
  int64_t ldc = 0;          // 0 = ldd
  float alpha = 1.0f;
  float beta = 0.0f;
  // SMs the GEMM may use (persistent CTAs, one per SM): 0 = all of the device's SMs.
  int32_t smBudget = 0;
  // Row blocks per raster band (L2 reuse): 0 = automatic (autoGroupM: 32 for plain GEMMs with K in
  // MKERNEL_GEMM_BAND_MINK..MAXK, MKERNEL_GEMM_GROUP_BAND for grouped ones (_PING_BAND on pipeline
  // 3, _UNIT_BAND on 4), else 8).
  int32_t groupM = 0;
  // Shared-memory split of the stand-alone kernel (primitives.cuh): 0 = automatic (plain unpaired
  // GEMMs with B [N,K] and a 16-bit D run pipeline 4 where autoPipeline's unit rule holds
  // (MKERNEL_GEMM_UNITS_MAXK), else pipeline 6 at every K (5 with beta != 0 at K <= kWideMaxK),
  // claiming their tiles from a counter of the engine's outside stream capture when there is more
  // than one wave of them: MKERNEL_GEMM_AUTO_LEND; grouped GEMMs pipeline 4 or 6 by
  // MKERNEL_GEMM_GROUP_UNITS / _CARRY's rules; elsewhere the wide epilogue for 16-bit outputs
  // with K <= kWideMaxK, grouped too, and the deep ring above), 1 = deep load ring, 2 = wide
  // epilogue staging (16-bit outputs only), 3 = ping-pong consumers (opt-in: each consumer
  // warpgroup owns half of a tile, one's epilogue runs under the other's main loop, and a half
  // wholly past N is skipped; grouped too; 16-bit D, no SwiGLU, tile-by-tile D or tileDone hook; as
  // CTA pairs too, with cluster), 4 = ping-pong over whole 128x192 units (session 56,
  // gemm_pingunit.cuh: D cut into 128x192 units, each consumer warpgroup every other unit of its
  // CTA, two m64n192k16 a k16 step, 5 stages of 40 KB, D through one 8 KB box a warpgroup and TMA
  // stores (from registers with beta != 0 or regStores 1), as cuBLAS's fastest kernel for small K;
  // plain or grouped (session 57) GEMMs: 16-bit D with 16-byte rows, no hooks, CTA pairs, SwiGLU,
  // tile-by-tile D, tileClaim or stream-K), 5 = the deep ring lending its last stage of each tile
  // to the epilogue (what pipeline 0 ran before session 48: 4 load stages as pipeline 1, and the
  // whole half-tile staged at once as pipeline 2, in the tile's last stage once both consumer
  // warpgroups are done with it and in the 2 own boxes; the producer reloads that stage once the
  // store threads' stores read it; plain unpaired GEMMs with B [N,K] and 16-bit D, no hooks,
  // groups, SwiGLU, tile-by-tile D or stream-K; tileClaim too; storeWarps -1 or 1, regStores 0), 6
  // = the deep ring whose epilogue stages the first half of a warpgroup's half-tile and carries the
  // second half in registers, packed, into the next tile's main loop, where it is staged under the
  // second k-step's wgmmas (after the first where a tile has one); the GEMMs and settings of 5, and
  // CTA pairs too (cluster 2: the static walk, untraced), and grouped GEMMs unpaired (session 58;
  // pipeline 0 by MKERNEL_GEMM_GROUP_CARRY's rule); with beta != 0 or a D the TMA cannot
  // store, its kernel runs the deep ring's epilogue. (Session 46's half-depth stages, once pipeline
  // 5, measured slower everywhere and are gone.) Fused operators' compute roles always run the deep
  // ring.
  int32_t pipeline = 0;
  // CTAs per thread-block cluster: 0 = MKERNEL_GEMM_CLUSTER where the call allows pairs (else
  // 1), 1 = none, 2 = CTA pairs along M: each CTA of a pair loads half of the pair's common B
  // tile and multicasts it to both, so each reads half its B bytes from L2 (with pipeline 3:
  // half of each ping-pong unit's B). Pairs need a 16-bit D, no hooks, SwiGLU or tiled D, smBudget
  // 0 or >= 2, grouped GEMMs off pipelines 3 and 6 (pairs within a group); traced on pipelines 1,
  // 3 only.
  int32_t cluster = 0;
  // D stored tile by tile, [tilesM][tilesN][kTileM][kTileN] (ldd ignored; D holds
  // tilesM * tilesN * kTileM * kTileN elements; rows past M and columns past N of edge tiles
  // hold unspecified values): a fused operator then moves any row block of a tile with one
  // bulk copy. Needs beta == 0 and a 16-byte aligned D.
  bool dTiled = false;
  // SwiGLU epilogue (the MoE experts' first GEMM, B [N, K] with N = 2 * I: gate rows, then up
  // rows): D is [M, N / 2] with D[m, j] = silu(alpha * P[m, j]) * (alpha * P[m, N/2 + j]) for
  // the product P = A·B, computed from the fp32 accumulators and rounded once (ldd >= N / 2,
  // 0 = N / 2). Each tile pairs 128 gate columns with the 128 up columns they gate, so the
  // 2I-wide product never reaches memory. Grouped GEMMs with B in the kNK layout, N % 16 == 0,
  // 16-bit D, beta == 0, no tile hooks.
  bool swiglu = false;
  // Dynamic tile schedule: a device int32, zeroed before the launch in stream order (the
  // kernel leaves it past the tile count). Each CTA claims its next tile with atomicAdd
  // instead of walking tiles cta, cta + grid, ...: CTAs that start (or join) late take what is
  // left. The grid is then the SM budget, not capped at the tile count. nullptr = the static
  // schedule. Not with CTA pairs (cluster 2) or the ping-pong consumers (pipelines 3, 4).
  int32_t* tileClaim = nullptr;
  // Stream-K tail (fused/gemm/streamk.h): 0 = MKERNEL_GEMM_STREAMK (default 0: off) where the
  // call allows it, 1 = on, -1 = off. On, a GEMM whose tiles are not a whole number of waves
  // of the persistent grid runs all but its last one to two waves tile by tile and splits the
  // k-steps of those into equal ranges, one per CTA; a tile split over two CTAs is summed
  // through a workspace in fp32 (results can differ from the data-parallel run in the last
  // bits). The workspace (128 KB per SM, one per device and stream, allocated at the first
  // such launch) belongs to the engine; launches on one stream are ordered, so no two
  // stream-K GEMMs share it at once. Under stream capture the GEMM runs data-parallel (the
  // workspace's per-launch epoch is a host counter, which a replayed graph would not advance).
  // Plain GEMMs only: no groups, SwiGLU, tile-by-tile D, hooks (rowReady, tileDone,
  // tileOrder, rowBlockOffset, seqBase), CTA pairs, pipelines 3-6 or tileClaim.
  int32_t streamK = 0;
  // Timeline stamps (fused/gemm/trace.h; benchmarks): when set, thread 0 of each role of CTAs
  // 0 .. traceCtas - 1 writes globaltimer stamps of its first traceTiles tiles to
  // trace[traceWords(traceCtas, traceTiles)], zeroed by the caller (CTAs past traceCtas stamp
  // nothing). A traced call runs its own kernel instantiation; untraced calls run the plain
  // one. Plain walks and the ping-pong consumers (pipeline 3, whose records are units), CTA
  // pairs with pipeline 1 or 3; not stream-K, groups or SwiGLU.
  uint64_t* trace = nullptr;
  int32_t traceTiles = 0;
  int32_t traceCtas = 0;
  // 1: the epilogue's TMA stores are issued by store threads of the producer warpgroup, not
  // by a consumer thread (whose warpgroup then starts its next tile without waiting for the
  // issue: 0.7 us a tile at 8192 x 8192 x 1024 on the H100, session 42), wherever D goes
  // through the TMA staging and no tileDone hook waits for the stores; 0: by the consumers.
  // -1 (default): 1 when K <= kStoreWarpsMaxK, where it measured 1.3-2% faster (K 512-2048),
  // else 0 (0.5-1.8% slower at K >= 4096, session 42's calls Y and Z). Stand-alone launches
  // only, not the stream-K variant (fused operators' compute roles issue their own).
  int32_t storeWarps = -1;
  // 1: the cooperative kernels' epilogue stores D straight from the accumulators (a 4x4
  // exchange inside each quad of lanes gives every lane 8 consecutive columns of a row, one
  // 16-byte st.global each), with no shared-memory staging and no TMA store, where D allows it
  // (16-bit D, beta 0, D 16-byte aligned, ldd and D's width multiples of 8 elements, not
  // tile-by-tile; otherwise the TMA epilogue runs); store threads then idle. Built to test
  // whether the deep ring's TMA stores wait behind the next tile's loads (1.5-1.7 us of its
  // 2.1 us epilogue at 8192 x 8192 x 1024): they do not, the epilogue took as long from
  // registers (session 46, call AR), so it stays opt-in; kept for a tile that leaves no shared
  // memory for staging. 0 (default): the TMA epilogue. Not the ping-pong consumers (pipeline
  // 3); the 192-column units (pipeline 4) store from registers as with beta != 0.
  int32_t regStores = 0;
  // Benchmark diagnostic, never for results: 1 = the store threads issue no TMA stores, so D is
  // left unwritten while every other step of the epilogue (conversions, staging, the store
  // threads' handshakes) runs as usual. Whether the D stores' share of the traffic between L2
  // and the SMs (8% at K = 1024, 1% at 8192) is what slows the small-K k-step (issue 12's
  // 8192 x 8192 x 1024). Only where the store threads issue the stores (otherwise ignored).
  int32_t skipStores = 0;
  // L2 policy of D's TMA stores (2-D maps, the cooperative kernels): 1 = evict-first, so that D
  // streaming through L2 (128 MB at 8192 x 8192) leaves the A and B bands the next tiles re-read;
  // 2 = no policy; 0 (default) = automatic (autoStoreHint: evict-first for plain GEMMs with K <=
  // MKERNEL_GEMM_HINT_MAXK whose D is larger than the L2, where the D stores cost the k-step ~4%:
  // skipStores, session 50; grouped GEMMs under MKERNEL_GEMM_GROUP_HINT).
  int32_t storeHint = 0;
  GemmHooks hooks;
  GemmGroups groups;
};

// Tile shape of the engine (see docs/gemm-notes.md for why 128x256x64).
constexpr int kTileM = 128;
constexpr int kTileN = 256;
constexpr int kTileK = 64;
// Unit width of the ping-pong over whole units (GemmArgs::pipeline 4, gemm_pingunit.cuh): its
// walk is over 128 x kPingUnitN units of D, or 128 x kPingUnitNarrowN where unitWidth says.
constexpr int kPingUnitN = 192;
constexpr int kPingUnitNarrowN = 176;
// Largest K for which pipeline 0 picks the wide epilogue staging (or, for plain GEMMs with B
// [N,K] and beta != 0, the lent stage: MKERNEL_GEMM_AUTO_LEND).
constexpr int kWideMaxK = 4096;
// Largest K at which GemmArgs::storeWarps -1 hands the epilogue's stores to store threads.
constexpr int kStoreWarpsMaxK = 2048;
// Most groups of a grouped GEMM (their tile prefix sums live in shared memory).
constexpr int kMaxGroups = 256;

inline int32_t tilesM(const GemmArgs& a) {
  return (a.M + kTileM - 1) / kTileM;
}
// Columns of D: N, or N / 2 with the SwiGLU epilogue (a tile then stores kTileN / 2 of them).
inline int32_t outCols(const GemmArgs& a) {
  return a.swiglu ? a.N / 2 : a.N;
}
// The unit width pipeline 4 would run `a` with (host only; reads MKERNEL_GEMM_UNIT_NARROW):
// kPingUnitNarrowN with B [N,K] where the setting allows it (setting 2: where 176 columns tile
// D's columns exactly and 192 do not), else kPingUnitN.
int32_t unitWidth(const GemmArgs& a);
// Column tiles of the walk: with pipeline 4 named its units (unitWidth; a pipeline 0 call that
// buildParams resolves to 4 counts units in GemmParams::tilesN, not here).
inline int32_t tilesN(const GemmArgs& a) {
  const int32_t w = a.swiglu ? kTileN / 2 : (a.pipeline == 4 ? unitWidth(a) : kTileN);
  return (outCols(a) + w - 1) / w;
}

// Host-only check (no CUDA call): false with a reason when the engine cannot run `args`.
bool canImplement(const GemmArgs& args, std::string* why);

// What GemmArgs::pipeline 0 resolves to for `args` on `sms` persistent CTAs (host only, no CUDA
// call; reads MKERNEL_GEMM_AUTO_LEND, MKERNEL_GEMM_UNITS_MAXK, MKERNEL_GEMM_GROUP_UNITS and
// MKERNEL_GEMM_GROUP_CARRY): 4 = the ping-pong over whole
// 128x192 units (beta 0, D with 16-byte rows, no tileClaim, K <= MKERNEL_GEMM_UNITS_MAXK, and
// units that load the `sms` CTAs at least as evenly as 128x256 tiles; never with sms 0), 6 = the
// carried epilogue, 5 = the lent stage, 0 = none of them (the wide split for 16-bit outputs at
// K <= kWideMaxK, else the deep ring). Plain unpaired GEMMs with B [N,K] and a 16-bit D; grouped
// ones under MKERNEL_GEMM_GROUP_UNITS (4: by default at K <= 2048 and N >= 2048, two units a CTA)
// or MKERNEL_GEMM_GROUP_CARRY (6: by default at K > kWideMaxK or N >= 4096, D stored through
// TMA); any other args, or a pipeline other than 0, give 0.
int autoPipeline(const GemmArgs& args, int32_t sms = 0);

// Whether pipeline 0 claims tiles for `args` on `sms` persistent CTAs (host only, no CUDA call;
// reads what autoPipeline reads and MKERNEL_GEMM_GROUP_CLAIM): plain GEMMs where it resolves to the
// lent stage or the carried epilogue, and grouped GEMMs without hooks under
// MKERNEL_GEMM_GROUP_CLAIM 1 (but not on the unit walk); never with a pipeline named, a caller's
// tileClaim or a trace. The launch still walks the static schedule with one wave of tiles or under
// stream capture.
bool autoClaims(const GemmArgs& args, int32_t sms = 0);

// What GemmArgs::groupM 0 and storeHint 0 resolve to (host only, no CUDA call; read
// MKERNEL_GEMM_BAND_MINK / _MAXK and MKERNEL_GEMM_HINT_MAXK). Plain GEMMs without hooks (a fused
// operator's tile order is its communication's order): bands of 32 row blocks at small K, and
// evict-first D stores at small K where D outgrows the L2 (`l2Bytes`: a D that fits stays for
// whoever reads it next, e.g. the sequential GEMM + collective). Grouped GEMMs without hooks take
// MKERNEL_GEMM_GROUP_BAND (MKERNEL_GEMM_GROUP_PING_BAND / _UNIT_BAND where args.pipeline is 3 /
// 4: pass the resolved pipeline) and MKERNEL_GEMM_GROUP_HINT (D outgrowing the L2); calls with
// hooks get 8 and no policy (0).
int32_t autoGroupM(const GemmArgs& args);
int32_t autoStoreHint(const GemmArgs& args, int64_t l2Bytes);

// Checks (canImplement + device limits), then launches on `stream`.
// ncclInvalidArgument with a logged reason when the arguments are not supported.
ncclResult_t launch(const GemmArgs& args, cudaStream_t stream);

// Loads the kernel variant `args` selects (abType, dType, bLayout) without launching it. With lazy
// module loading a kernel is loaded at its first launch, which can block behind a running kernel; a
// caller whose earlier launches may spin waiting for a peer this thread has yet to launch (ranks
// sharing a GPU) preloads everything first.
ncclResult_t preload(const GemmArgs& args);

// A row-major [rows, cols] tensor map (no swizzle; a box of boxCols x boxRows stored densely
// in shared memory): fused operators' stores into user buffers. TMA clips boxes at the bounds.
ncclResult_t encodeRows(CUtensorMap* map, DType t, void* base, uint64_t cols, uint64_t rows,
                        uint64_t pitchElems, uint32_t boxCols, uint32_t boxRows);

// What the engines check before a launch, read once per device and cached (GEMM, attention).
struct DeviceLimits {
  int sms = 0, major = 0, minor = 0, smemOptin = 0;
  int64_t l2Bytes = 0;  // L2 cache size
};
ncclResult_t deviceLimits(DeviceLimits* out);

// Dynamic shared memory one GEMM CTA needs (fused kernels size their CTAs with it).
size_t smemBytes();

}  // namespace gemm
}  // namespace mk
