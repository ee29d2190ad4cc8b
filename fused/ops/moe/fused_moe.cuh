// The fused ncclMoeDispatchGemm kernel (clique layout: every rank in this process on one GPU):
// one persistent cooperative kernel per rank, CTAs [dispatch | grouped GEMM].
//
//  - Dispatch CTAs (0 .. nDisp-1) run the dispatch kernel's body (dispatch_dev.cuh): count,
//    exchange counts through the MoE clique block, derive the layout, copy token rows into the
//    owners' xRecv. Each landed row adds 1 to its receiver's counter of that 128-row tile
//    (MoeSlot::tileReady, zeroed on the stream before the kernel), and each receiver adds its
//    own padding rows, so a tile's counter reaches kTileM exactly when every row of it from
//    every source is in place (a uniform target, whatever the tile's mix of sources). Rows
//    are copied local expert by local expert (moeCopyOrder), so first experts' tiles fill
//    first on every receiver.
//  - GEMM CTAs wait (bounded) for this rank's layout (MoeRankCtl::rowsReady = call seq, set
//    once counts and offsets are written), then run the engine's grouped GEMM over it; the
//    producer waits for a tile's counter (GemmHooks::rowReady, expected kTileM) before its
//    loads, so tiles are multiplied as their rows arrive, in the grouped raster's order.
//  - Dispatch CTAs, once their copies are done, become GEMM CTAs too (the copy is a small part
//    of the call: idle after it, they would keep their SMs from the GEMM for the whole call).
//    The GEMM therefore runs the engine's dynamic schedule (GemmParams::tileClaim, a per-call
//    counter zeroed before the kernel): every CTA claims its next tile when its producer is
//    free, so the late joiners take the tiles that are left instead of a fixed share.
// The GEMM arithmetic is the sequential path's (the same engine, tile for tile; only which CTA
// computes a tile differs), so y is bit for bit the sequential path's.
// Every rank's kernel must be resident beside its peers' (GEMM CTAs wait for rows that the
// dispatch CTAs of every rank bring): the grid is at most the rank's share of the GPU.
#pragma once
#include <cstdint>

#include "device/rt/wait.cuh"
#include "fused/core/fused_dev.cuh"
#include "fused/gemm/gemm_kernel.cuh"
#include "fused/ops/moe/dispatch_dev.cuh"

namespace mk {
namespace fused {

struct MoeFusedParams {
  gemm::GemmParams g;  // first: holds the 64-byte aligned tensor maps
  moedev::MoeParams d;
  int32_t nDisp;  // CTAs [0, nDisp) dispatch, the rest run the grouped GEMM
};

// The dispatch parameters of a fused MoE call (both fused kernels) on its layout's shared
// state: the clique block, or (processes layout: every rank its own process) every rank's
// control block and data window of at least `winBytes` (both halves of proc_windows' region
// as one), with the peers' windows as mapped here, system-scope counters and
// p->dataBase = this rank's window. *ok false (ncclSuccess): the windows could not be made or
// grown (e.g. during stream capture), on every rank alike; the caller runs its sequential
// path. p->dataBase is null exactly on the clique layout. fused_moe.cu.
ncclResult_t moeFusedParamsOf(const MoeCall& c, const FusedComm& f, size_t winBytes,
                              moedev::MoeParams* p, bool* ok);

// Dynamic shared memory of a dispatch CTA: its MoeShared, then tot/dstRow/seen/base [E] each.
constexpr size_t kMoeFusedShOff = (sizeof(moedev::MoeShared) + 15) / 16 * 16;
inline size_t moeFusedDispatchSmem(int experts) {
  return kMoeFusedShOff + 4 * (size_t)experts * sizeof(int32_t);
}

template <class Tr>
__global__ void __launch_bounds__(gemm::kThreads, 1)
    moeFusedKernel(const __grid_constant__ MoeFusedParams p) {
  extern __shared__ uint8_t smem[];
  if ((int32_t)blockIdx.x < p.nDisp) {
    // Dispatch CTAs keep their state in the (otherwise GEMM) dynamic shared memory: static
    // shared memory would add to every GEMM CTA's, which the grouped ring nearly fills.
    moedev::MoeShared& sh = *reinterpret_cast<moedev::MoeShared*>(smem);
    moedev::moeDispatchBody(p.d, reinterpret_cast<int32_t*>(smem + kMoeFusedShOff), sh,
                            (int)blockIdx.x, p.nDisp, /*finish=*/false);
    // Then the GEMM below (finishCall once, at the end). Its barriers and ring reuse the
    // shared memory the dispatch state lived in: every thread (thread 0 last, in the body's
    // step 5) is done with it first.
    __syncthreads();
  }
  __shared__ uint64_t seqSh;
  __shared__ int okSh;
  if (threadIdx.x == 0) {
    const uint64_t seq = callSeq(p.d.f);
    seqSh = seq;
    // The layout (counts, offsets: the groups) is this rank's dispatch CTA 0's, published
    // with rowsReady[me] = seq; a failure (abort, a peer's timeout) ends the wait and the
    // GEMM is skipped (its groups may never be written).
    okSh = !rt::failed(p.d.f.c.w) &&
           rt::waitGe(p.d.f.c.w, &p.d.ctl[p.d.f.rank]->rowsReady, seq,
                      moedev::moeSite(p.d, -1, -1, rt::kWaitFlag), rt::kScopeGpu);
  }
  __syncthreads();
  // Every CTA runs the dynamic schedule (p.g.tileClaim): `cta` and `nCtas` are not used.
  if (okSh) gemm::gemmCta<Tr>(p.g, smem, (int32_t)blockIdx.x, (int32_t)gridDim.x);
  __syncthreads();
  if (threadIdx.x == 0) finishCall(p.d.f, seqSh);
}

}  // namespace fused
}  // namespace mk
