// ncclMoeDispatchGemm: the dispatch kernel and the call's host side.
//
// One dispatch kernel per rank (grid sized from the rank's SM budget), every rank of the comm
// in this process on one GPU, so a kernel reads and writes its peers' buffers directly
// (fused/core/clique_block.h). Per call (number `seq`, the op's device-resident counter):
//   1. CTA 0 counts this rank's routed slots per expert and publishes the counts with its
//      receive buffers in its clique slot (release of slot.seq = seq);
//   2. every CTA waits for every rank's slot, then derives the packed layout of every rank
//      from the counts (moe_layout.h): where its rows start at each destination, and whether
//      a destination would overflow its bound (then nothing is sent there);
//   3. warp 0 of CTA 0 gives every routed slot its row at the destination, in slot order
//      (stable: the layout is deterministic), and CTA 0 writes this rank's counts, offsets
//      and padding entries;
//   4. all CTAs copy token rows into the destinations' xRecv (with source and weight);
//   5. the last CTA to finish releases done[dst][me] for every destination, then waits for
//      done[me][src] of every source: when the kernel ends, every row of this rank's layout
//      has arrived, and the grouped GEMM that follows on the stream reads them.
// A destination publishes its slot for call seq only from its kernel of call seq, which is
// stream-ordered after its previous GEMM, so no row of call seq overwrites rows still read.
// Counts of call seq are read before a rank releases its done flags, and a source writes its
// next counts only after every rank released done for it: no count is overwritten early.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "base/cudawrap.h"
#include "base/debug.h"
#include "base/param.h"
#include "base/scratch.h"
#include "comm/comm.h"
#include "device/rt/wait.cuh"
#include "fused/core/clique_block.h"
#include "fused/core/fused_comm.h"
#include "fused/core/fused_dev.cuh"
#include "fused/core/proc_windows.h"
#include "fused/gemm/gemm.h"
#include "fused/ops/gemm_coll/gemm_coll.h"
#include "fused/ops/gemm_coll/gemm_coll_util.h"
#include "fused/ops/moe/moe.h"
#include "fused/ops/moe/moe_layout.h"
#include "fused/ops/moe/moe_rank.cuh"
#include "fused/ops/moe/dispatch_dev.cuh"

namespace mk {
namespace fused {

namespace {

using namespace moedev;

__global__ void __launch_bounds__(kMoeThreads, 1)
    moeDispatchKernel(const __grid_constant__ MoeParams p) {
  extern __shared__ int32_t dyn[];  // tot[E], dstRow[E], seen[E]
  __shared__ MoeShared sh;
  moeDispatchBody(p, dyn, sh, (int)blockIdx.x, (int)gridDim.x);
}

}  // namespace

int moeCommGrid(const MoeCall& c, int smBudget, int64_t units, int unitsPerCta) {
  const int64_t want = c.cfg.commSms > 0 ? c.cfg.commSms : smBudget;
  const int64_t work = (units + unitsPerCta - 1) / unitsPerCta;
  return (int)std::min<int64_t>(std::max<int64_t>(1, std::min(want, work)), std::max(1, smBudget));
}

bool moeSwigluInGemm(const MoeCall& c) {
  return c.ffn && c.cfg.wLayout == ncclFusedLayoutNK && MK_PARAM_INT(MoeSwigluEpilogue) != 0;
}

ncclResult_t moeGemm(const MoeCall& c, const void* a, const void* w, size_t N, size_t K, void* d,
                     ncclDataType_t dType, gemm::GemmArgs* out, bool swiglu) {
  FusedComm f;  // for the sequential GEMMs' SM budget
  NCCLCHECK(fusedCommView(c.comm, rt::kOpMoe, &f));
  gemm::GemmArgs g;
  g.M = (int32_t)c.recv.maxRows;
  g.N = (int32_t)N;
  g.K = (int32_t)K;
  g.A = a;
  g.B = w;
  g.bLayout = c.cfg.wLayout == ncclFusedLayoutKN ? gemm::BLayout::kKN : gemm::BLayout::kNK;
  g.abType = gemmType(c.inType);
  g.D = d;
  g.dType = gemmType(dType);
  g.smBudget = seqGemmBudget(f);
  g.groups.num = c.E / c.comm->nRanks;
  g.groups.rowStart = c.recv.expertOffset;
  g.groups.rowCount = c.recv.expertCount;
  g.groups.strideB = (int64_t)N * (int64_t)K;
  g.swiglu = swiglu;
  std::string why;
  if (!gemm::canImplement(g, &why)) {
    MK_WARN("%s: the experts' GEMM (N=%zu, K=%zu) cannot run: %s", moeApi(c), N, K, why.c_str());
    return ncclInvalidArgument;
  }
  // Loaded before the first launch: a lazy load can wait for the device, where a peer's
  // dispatch kernel may wait for this thread.
  NCCLCHECK(gemm::preload(g));
  *out = g;
  return ncclSuccess;
}

ncclResult_t moeDispatch(const MoeCall& c, int32_t** slotRow) {
  ncclComm* comm = c.comm;
  *slotRow = nullptr;
  FusedComm f;
  NCCLCHECK(fusedCommView(comm, rt::kOpMoe, &f));
  void* block = nullptr;
  NCCLCHECK(cliqueBlockForCall(comm, kCliqueMoe, sizeof(MoeClique), c.stream, moeApi(c), &block));

  MoeParams p = moeDispatchParamsOf(c, f, block);
  const int64_t slots = (int64_t)c.T * c.k;
  const int grid = moeCommGrid(c, f.smBudget, slots, kMoeWarps);
  const size_t smem = 3 * (size_t)c.E * sizeof(int32_t);
  cudaFuncAttributes attr;
  CUDACHECK(cudaFuncGetAttributes(&attr, moeDispatchKernel));  // loads it now (see moeGemm)
  // The slot rows of this call: stream-ordered scratch (a memory node under capture).
  if (slots > 0)
    NCCLCHECK(
        scratchAlloc((void**)slotRow, (size_t)slots * sizeof(int32_t), c.comm->cudaDev, c.stream));
  p.slotRow = *slotRow;
  return fusedEnqueue(comm, c.stream, moeApi(c), [&](cudaStream_t s) -> ncclResult_t {
    moeDispatchKernel<<<grid, kMoeThreads, smem, s>>>(p);
    CUDACHECK(cudaGetLastError());
    return ncclSuccess;
  });
}

ncclResult_t moeRun(const MoeCall& c) {
  DeviceGuard guard;
  NCCLCHECK(guard.set(c.comm->cudaDev));
  if (!cliqueEligible(c.comm, kMoeMaxLocal)) {
    const bool procs = procWindowsEligible(c.comm, kMoeMaxLocal);
    // ncclFusedAuto takes the fused layer here: on 4 processes sharing the H200 it ran 1.02-1.41x
    // the AllToAll path at every shape measured (H 2048 to 7168, 512 to 16384 tokens a rank;
    // session 31, bench/results/session31-2026-12-04/callD, callE). Every rank takes the same
    // verdict (the layout, the config, the weights' layout; moeFfnFusedRun's are shared too).
    const bool fusedLayerAuto = c.cfg.algo == ncclFusedAuto && c.ffn && moeSwigluInGemm(c);
    if (procs && (c.cfg.algo == ncclFusedFused || fusedLayerAuto)) {
      // Ranks as processes of one node: the fused kernels with the rows landing in windows
      // (every rank takes the same verdict; false: e.g. the windows could not be made).
      bool ran = false;
      NCCLCHECK(c.ffn ? moeFfnFusedRun(c, &ran) : moeFusedRun(c, &ran));
      if (ran) return ncclSuccess;
      if (!c.ffn) {  // (the layer logs its own reason)
        static std::atomic<bool> said{false};
        if (!said.exchange(true))
          MK_INFO(kFused,
                  "ncclMoeDispatchGemm: no fused kernel for this call (fewer than 2 SMs a rank, "
                  "too many experts for the dispatch state, or the windows could not be made); "
                  "running the AllToAll path");
      }
    }
    if (c.comm->topo.nNodes > 1 && (c.cfg.algo == ncclFusedFused || fusedLayerAuto)) {
      // Across (virtual) nodes: the fused kernel on the xnode protocol (xnode.cu; it logs its
      // reason once where it does not apply). ncclFusedAuto takes it for the layer: 2
      // processes as 2 virtual nodes on the H200 ran it 1.18-1.44x the AllToAll path (session
      // 36, bench/results/session36-2026-12-05/callB_logs); the dispatch call keeps the
      // AllToAll path (0.93-1.12x).
      bool ran = false;
      NCCLCHECK(moeXnodeRun(c, &ran));
      if (ran) return ncclSuccess;
    } else if (c.cfg.algo == ncclFusedFused && !procs) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true))
        MK_INFO(kFused,
                "%s: the fused kernels cover ranks of one node (of one process sharing a GPU, or "
                "processes) and comms spanning nodes; running the AllToAll path",
                moeApi(c));
    }
    return moeA2aRun(c);
  }
  if (c.ffn) return moeFfnRun(c);
  if (c.cfg.algo == ncclFusedFused) {
    // ncclFusedAuto keeps the sequential path until the fused kernel has been measured faster
    // (bench/moe_bench.py --fused).
    bool ran = false;
    NCCLCHECK(moeFusedRun(c, &ran));
    if (ran) return ncclSuccess;
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      MK_INFO(kFused,
              "ncclMoeDispatchGemm: no fused kernel for this call (fewer than 2 SMs for the "
              "rank); running the dispatch kernel, then the grouped GEMM");
  }
  gemm::GemmArgs g;
  NCCLCHECK(moeGemm(c, c.recv.xRecv, c.w1, c.N, c.H, c.recv.y, c.cfg.outType, &g));
  int32_t* slotRow = nullptr;
  ncclResult_t res = moeDispatch(c, &slotRow);
  // The GEMM waits for this rank's dispatch kernel, which spins until its peers' run: it is
  // queued only now, after the enqueue has seen every in-process peer's dispatch launched
  // (coll/rendezvous.h, rdvLaunched), so it cannot hold a hardware queue a peer's dispatch
  // kernel still has to pass.
  if (res == ncclSuccess) res = gemm::launch(g, c.stream);
  return fusedFreeScratch(slotRow, c.stream, res, moeApi(c));
}

}  // namespace fused
}  // namespace mk
