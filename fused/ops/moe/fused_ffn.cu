// Host side of the fused ncclMoeDispatchFfnCombine kernel (fused_ffn.cuh): eligibility, the
// two GEMMs' parameters with their row hooks, the per-call scratch and the launch through the
// comm's enqueue path, on the clique layout and (session 31) the processes layout, where rows
// land in and experts' outputs are read from the ranks' windows (buf->xRecv and buf->out are
// then not written).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "base/debug.h"
#include "base/param.h"
#include "base/scratch.h"
#include "comm/comm.h"
#include "fused/core/clique_block.h"
#include "fused/core/fused_comm.h"
#include "fused/core/proc_windows.h"
#include "fused/gemm/dtype_built.h"
#include "fused/gemm/gemm.h"
#include "fused/ops/gemm_coll/gemm_coll_util.h"
#include "fused/ops/moe/fused_ffn_launch.cuh"
#include "fused/ops/moe/moe.h"

namespace mk {
namespace fused {

namespace {

std::atomic<uint64_t> gFfnLaunches{0};

void sayOnce(std::atomic<bool>* said, const char* api, const char* why) {
  if (!said->exchange(true))
    MK_INFO(kFused,
            "%s: the fused layer kernel does not run here (%s); running the sequential path", api,
            why);
}

// The processes layout's data window of a rank for the fused layer (the window the fused
// dispatch + GEMM uses too, proc_windows.h): the rows its peers land (xRecv [maxRows][H]
// inType) with their tile counters, and what its peers' combines read: the experts' outputs
// (out [maxRows][H] fp32) with GEMM2's row-block counters. Every rank passes the same maxRows
// on this layout (fused.h), so every rank computes the same sizes.
struct FfnWinLayout {
  size_t xRecv = 0, out = 0, tileReady = 0, rowDone = 0, bytes = 0;
};

FfnWinLayout ffnWinLayout(const MoeCall& c, int64_t tiles) {
  MoeCarve k;
  FfnWinLayout w;
  w.xRecv = k.take(c.buf.maxRows * c.H * fusedTypeSize(c.inType));
  w.out = k.take(c.buf.maxRows * c.H * sizeof(float));
  w.tileReady = k.take((size_t)tiles * sizeof(uint64_t));
  w.rowDone = k.take((size_t)tiles * sizeof(uint64_t));
  w.bytes = k.at;
  return w;
}

}  // namespace

void moeRowHooks(gemm::GemmArgs* g, const FusedComm& f, uint64_t expected, bool readySys,
                 bool doneSys) {
  g->pipeline = 1;  // the grouped deep ring (GroupPipe), which the fused kernels run
  g->cluster = 1;
  g->hooks.rowsPerFlag = gemm::kTileM;
  g->hooks.rowReadyExpected = expected;
  g->hooks.rowReadySys = readySys;
  g->hooks.tileDoneRows = true;
  g->hooks.tileDoneSys = doneSys;
  g->hooks.wait = f.c.w;
}

uint64_t moeFfnFusedLaunches() {
  return gFfnLaunches.load();
}

ncclResult_t moeFfnFusedRun(const MoeCall& c, bool* ran) {
  *ran = false;
  ncclComm* comm = c.comm;
  const char* api = moeApi(c);
  if (!moeSwigluInGemm(c)) {
    static std::atomic<bool> said{false};
    sayOnce(&said, api,
            "it applies SwiGLU in GEMM1's epilogue, which needs the weights in the [N,K] layout "
            "and MKERNEL_MOE_SWIGLU_EPILOGUE=1");
    return ncclSuccess;
  }
  FusedComm f;
  NCCLCHECK(fusedCommView(comm, rt::kOpMoe, &f));
  const char* why = nullptr;
  const int budget = moeFusedBudget(c, f.smBudget, &why);
  if (budget == 0) {
    static std::atomic<bool> said{false};
    sayOnce(&said, api, why);
    return ncclSuccess;
  }
  const int nDisp = moeFusedDispatchCtas(c, budget);
  const int64_t tiles =
      std::max<int64_t>(1, ((int64_t)c.buf.maxRows + gemm::kTileM - 1) / gemm::kTileM);

  // Processes layout (the caller checked procWindowsEligible): the rows land in, and the
  // peers' combines read from, every rank's window (the same verdict on every rank; false:
  // the sequential path). The window holds both halves of proc_windows' region.
  const FfnWinLayout wl = ffnWinLayout(c, tiles);
  MoeFfnFusedParams p{};
  bool ok = false;
  NCCLCHECK(moeFusedParamsOf(c, f, wl.bytes, &p.d, &ok));
  if (!ok) {
    static std::atomic<bool> said{false};
    sayOnce(&said, api, "the processes' windows could not be made or grown (stream capture?)");
    return ncclSuccess;
  }
  uint8_t* win = p.d.dataBase;
  const bool procs = win != nullptr;
  void* xRecv = procs ? static_cast<void*>(win + wl.xRecv) : c.buf.xRecv;
  float* out = procs ? reinterpret_cast<float*>(win + wl.out) : c.buf.out;

  // The sequential path's GEMMs (canImplement, kernels preloaded), with the row hooks.
  gemm::GemmArgs g1, g2;
  NCCLCHECK(moeGemm(c, xRecv, c.w1, 2 * c.I, c.H, c.buf.act, c.inType, &g1, true));
  NCCLCHECK(moeGemm(c, c.buf.act, c.w2, c.H, c.I, out, ncclFloat32, &g2));
  const int32_t tilesN1 = gemm::tilesN(g1), tilesN2 = gemm::tilesN(g2);
  // GEMM1 waits for rows the peers count; GEMM2's counters are read by the peers' combines.
  moeRowHooks(&g1, f, gemm::kTileM, procs, false);       // every row of the tile landed, or padding
  moeRowHooks(&g2, f, (uint64_t)tilesN1, false, procs);  // every act column of the row block stored

  if (procs) p.d.recv.xRecv = xRecv;
  p.d.ffnOut = out;
  p.d.deferErrors = true;
  p.y = c.yOut;
  p.hidden = (int64_t)c.H;
  p.tilesN2 = tilesN2;
  p.outType = (int32_t)gemmType(c.cfg.outType);
  p.nDisp = nDisp;
  p.testDelayUs = (uint32_t)MK_PARAM_INT(MoeFfnTestDelayUs);
  auto launchIn = [&](int ctas, cudaStream_t s) {
    return gemm::byInType(gemmType(c.inType), api, [&](auto t) {
      return moeFfnFusedLaunchIn<decltype(t)::value>(p, ctas, s);
    });
  };
  // Loaded before the first launch (see moeGemm).
  NCCLCHECK(launchIn(0, nullptr));

  const int64_t slots = (int64_t)c.T * c.k;
  const size_t slotBytes =
      ((size_t)std::max<int64_t>(slots, 1) * sizeof(int32_t) + 255) / 256 * 256;
  // Zeroed per call: three counters per row tile (rows landed, GEMM1 and GEMM2 tiles stored),
  // then the two GEMMs' tile claims, the combine's token claim and its CTA count.
  const size_t zeroWords = 3 * (size_t)tiles + 4;
  ncclResult_t res = fusedEnqueue(comm, c.stream, api, [&](cudaStream_t s) -> ncclResult_t {
    // Stream-ordered scratch on the kernel's stream, the counters zeroed just before it (a
    // memset node under capture, so every replay starts from zero). Peers touch these
    // counters only during this call, and the kernel ends only once every rank's combine is
    // done (combDone): the scratch may be freed behind it.
    void* tmp = nullptr;
    NCCLCHECK(scratchAlloc(&tmp, 2 * slotBytes + zeroWords * sizeof(uint64_t), comm->cudaDev, s));
    uint8_t* base = static_cast<uint8_t*>(tmp);
    uint64_t* words = reinterpret_cast<uint64_t*>(base + 2 * slotBytes);
    ncclResult_t r = ncclSuccess;
    CUDACHECKGOTO(cudaMemsetAsync(words, 0, zeroWords * sizeof(uint64_t), s), r, done);
    // Processes: the counters the peers touch live in the window, zeroed the same way.
    if (procs)
      CUDACHECKGOTO(cudaMemsetAsync(win + wl.tileReady, 0, wl.bytes - wl.tileReady, s), r, done);
    {
      uint64_t* tileReady = procs ? reinterpret_cast<uint64_t*>(win + wl.tileReady) : words;
      uint64_t* rowDone1 = words + tiles;
      uint64_t* rowDone2 =
          procs ? reinterpret_cast<uint64_t*>(win + wl.rowDone) : words + 2 * tiles;
      uint64_t* tail = words + 3 * tiles;
      p.d.slotRow = slots > 0 ? reinterpret_cast<int32_t*>(base) : nullptr;
      p.d.order = slots > 0 ? reinterpret_cast<int32_t*>(base + slotBytes) : nullptr;
      p.d.tileReady = tileReady;
      p.d.rowDone = rowDone2;
      p.combClaim = reinterpret_cast<int32_t*>(tail + 2);
      p.ctaDone = reinterpret_cast<uint32_t*>(tail + 3);
      gemm::GemmArgs a1 = g1, a2 = g2;
      a1.hooks.rowReady = tileReady;
      a1.hooks.tileDone = rowDone1;
      a1.tileClaim = reinterpret_cast<int32_t*>(tail);
      a2.hooks.rowReady = rowDone1;
      a2.hooks.tileDone = rowDone2;
      a2.tileClaim = reinterpret_cast<int32_t*>(tail + 1);
      int32_t gridUnused = 0;
      NCCLCHECKGOTO(gemm::buildParams(a1, &p.g1, &gridUnused), r, done);
      NCCLCHECKGOTO(gemm::buildParams(a2, &p.g2, &gridUnused), r, done);
      MK_INFO(kFused, "%s rank %d T=%zu k=%d E=%d H=%zu I=%zu fused layer%s: %d CTAs, %d dispatch",
              api, f.rank, c.T, c.k, c.E, c.H, c.I, procs ? " (processes)" : "", budget, nDisp);
      r = launchIn(budget, s);
      if (r == ncclSuccess) *ran = true;
    }
  done:
    return fusedFreeScratch(tmp, s, r, api);
  });
  if (res == ncclSuccess && *ran) gFfnLaunches.fetch_add(1);
  return res;
}

}  // namespace fused
}  // namespace mk
