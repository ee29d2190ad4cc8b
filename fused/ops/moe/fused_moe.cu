// Host side of the fused ncclMoeDispatchGemm kernel (fused_moe.cuh): eligibility, the SM
// split, parameters and the launch through the comm's enqueue path, on the clique layout and
// (session 31) the processes layout, where the rows land in the ranks' windows.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "base/debug.h"
#include "base/scratch.h"
#include "comm/comm.h"
#include "fused/core/clique_block.h"
#include "fused/core/fused_comm.h"
#include "fused/core/proc_windows.h"
#include "fused/gemm/dtype_built.h"
#include "fused/gemm/gemm.h"
#include "fused/ops/gemm_coll/gemm_coll_util.h"
#include "fused/ops/moe/fused_moe_launch.cuh"
#include "fused/ops/moe/moe.h"

namespace mk {
namespace fused {

namespace {

std::atomic<uint64_t> gLaunches{0};

}  // namespace

// Dispatch CTAs of a fused call on `budget` CTAs: the config's commSms when set, else a
// balance of the copy against the GEMM (x = budget * r / (1 + r), r = t_copy(1 CTA) /
// t_gemm(1 SM)) with the rates gemm_coll's split uses (a CTA moves ~15 GB/s of rows read +
// written, an SM does ~6 TFLOP/s), for the average rank (T * k rows out and in): unmeasured
// for MoE, a starting point for bench/moe_bench.py's --comm-sms sweep. At least one CTA of
// each role; no more dispatch CTAs than warps' worth of slots. Since session 19 the dispatch
// CTAs join the GEMM after their copies (dynamic tile claim), so a dispatch CTA costs the GEMM
// only its copy time: the balance above is conservative; re-tune from the --comm-sms sweep.
int moeFusedDispatchCtas(const MoeCall& c, int budget) {
  const int64_t slots = (int64_t)c.T * c.k;
  const int warps = gemm::kThreads / 32;
  const int64_t work = std::max<int64_t>(1, (slots + warps - 1) / warps);
  int64_t want;
  if (c.cfg.commSms > 0) {
    want = c.cfg.commSms;
  } else {
    const double rows = (double)std::max<int64_t>(1, slots);
    const double tCopy = 2.0 * rows * c.H * fusedTypeSize(c.inType) / 15e9;
    const double tGemm = 2.0 * rows * c.N * c.H / 6e12;
    const double r = tGemm > 0 ? tCopy / tGemm : 1.0;
    want = std::min<int64_t>(budget / 2, (int64_t)(budget * r / (1.0 + r) + 0.5));
    want = std::min(want, work);
  }
  return (int)std::max<int64_t>(1, std::min<int64_t>(want, budget - 1));
}

int moeFusedBudget(const MoeCall& c, int smBudget, const char** why) {
  // Every rank's kernel on this GPU must be resident at once (its CTAs wait for rows the
  // dispatch CTAs of every rank bring): never more than the GPU's share of this rank.
  const int share = std::min(smBudget, (int)fusedOwnShare(c.comm));
  // The verdict (fused or not) from what the comm's ranks share only (the least share of any
  // of their GPUs; not smBudget, which the CTA caps lower per rank and no rank compares): in
  // the processes layout a rank that left here while its peers went on would leave them in the
  // windows' collective set-up. A cap below 2 still gets the 2 CTAs the kernel needs (below).
  if (fusedLeastShare(c.comm) < 2) {
    *why = "fewer than 2 SMs a rank on one of the comm's GPUs (one CTA of each role)";
    return 0;
  }
  if (moeFusedDispatchSmem(c.E) > (size_t)gemm::GroupPipe::kSmemBytes) {
    *why = "the dispatch state of this many experts exceeds the shared memory";
    return 0;
  }
  // The grid also counts the ranks of every live comm of this process on the GPU
  // (fusedGpuShare), at least 2 CTAs: with a 4-process comm split into pairs, each pair's
  // kernels sized for 2 ranks took the whole GPU (4 x 66 CTAs on 132 SMs), and the PyTorch MoE
  // test's subgroup pairs failed once auto ran the fused layer on processes (session 31, most
  // likely a rank waiting for a peer whose kernel could not start). Only the grid is private to
  // the rank; the peers do not depend on it.
  return std::max(2, std::min(share, (int)fusedGpuShare(c.comm)));
}

uint64_t moeFusedLaunches() {
  return gLaunches.load();
}

namespace {

// The processes layout's data window of a rank (both halves of its region, proc_windows.h), where
// its peers land the rows of a fused call: xRecv [maxRows][rowBytes], rowSource [maxRows][3],
// rowWeight [maxRows], the tile counters [tiles] (every rank passes the same maxRows on this
// layout, fused.h, so every rank computes the same sizes).
struct MoeWinLayout {
  size_t xRecv = 0, rowSource = 0, rowWeight = 0, tileReady = 0, bytes = 0;
};

MoeWinLayout moeWinLayout(const MoeCall& c, int64_t tiles) {
  const size_t rows = c.recv.maxRows;
  MoeCarve k;
  MoeWinLayout w;
  w.xRecv = k.take(rows * c.H * fusedTypeSize(c.inType));
  w.rowSource = k.take(rows * 3 * sizeof(int32_t));
  w.rowWeight = k.take(rows * sizeof(float));
  w.tileReady = k.take((size_t)std::max<int64_t>(tiles, 1) * sizeof(uint64_t));
  w.bytes = k.at;
  return w;
}

// Processes layout: the rows landed in this rank's window; the caller's xRecv, rowSource and
// rowWeight get the rows its layout spans (expertOffset[E/n], written by the fused kernel).
// Clamped to [0, maxRows]: the span sits in the caller's memory, and a stray write there (a
// caller's unordered memset) must not turn into a copy past the window.
__global__ void moeWinCopyOut(const int4* xWin, int4* x, const int32_t* srcWin, int32_t* src,
                              const float* wWin, float* w, const int32_t* span, int64_t maxRows,
                              int64_t rowVecs) {
  const int64_t rows = min(max((int64_t)*span, (int64_t)0), maxRows);
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  for (int64_t i = first; i < rows * rowVecs; i += stride) x[i] = xWin[i];
  for (int64_t i = first; src != nullptr && i < rows * 3; i += stride) src[i] = srcWin[i];
  for (int64_t i = first; w != nullptr && i < rows; i += stride) w[i] = wWin[i];
}

}  // namespace

ncclResult_t moeFusedParamsOf(const MoeCall& c, const FusedComm& f, size_t winBytes,
                              moedev::MoeParams* p, bool* ok) {
  ncclComm* comm = c.comm;
  *ok = false;
  if (cliqueEligible(comm, moedev::kMoeMaxLocal)) {
    void* block = nullptr;
    NCCLCHECK(cliqueBlockForCall(comm, kCliqueMoe, sizeof(moedev::MoeClique), c.stream, moeApi(c),
                                 &block));
    *p = moedev::moeDispatchParamsOf(c, f, block);
    *ok = true;
    return ncclSuccess;
  }
  ProcView pv{};
  NCCLCHECK(procWindowsGet(comm, kCliqueMoe, sizeof(moedev::MoeRankCtl), (winBytes + 1) / 2,
                           c.stream, &pv, ok));
  if (!*ok) return ncclSuccess;
  *p = moedev::moeDispatchParamsOf(c, f, nullptr);
  for (int r = 0; r < f.nRanks; ++r) {
    p->ctl[r] = static_cast<moedev::MoeRankCtl*>(pv.ctl[r]);
    p->peerData[r] = pv.data[r];
  }
  p->dataBase = pv.data[f.rank];
  p->sysScope = true;
  return ncclSuccess;
}

ncclResult_t moeFusedRun(const MoeCall& c, bool* ran) {
  *ran = false;
  ncclComm* comm = c.comm;
  FusedComm f;
  NCCLCHECK(fusedCommView(comm, rt::kOpMoe, &f));
  const char* why = nullptr;
  const int budget = moeFusedBudget(c, f.smBudget, &why);
  if (budget == 0) return ncclSuccess;  // the sequential path
  const int nDisp = moeFusedDispatchCtas(c, budget);
  const int64_t tiles = ((int64_t)c.recv.maxRows + gemm::kTileM - 1) / gemm::kTileM;
  const int64_t slots = (int64_t)c.T * c.k;

  // Processes layout (the caller checked procWindowsEligible): every rank's control block and
  // data window, mapped here (the same verdict on every rank; false: the sequential path).
  const MoeWinLayout wl = moeWinLayout(c, tiles);
  MoeFusedParams p{};
  bool ok = false;
  NCCLCHECK(moeFusedParamsOf(c, f, wl.bytes, &p.d, &ok));
  if (!ok) return ncclSuccess;
  uint8_t* win = p.d.dataBase;
  const bool procs = win != nullptr;
  void* xRecv = procs ? static_cast<void*>(win + wl.xRecv) : c.recv.xRecv;

  // The experts' GEMM as the sequential path builds it (canImplement, and the sequential
  // kernel preloaded), on the GEMM CTAs, waiting per 128-row tile for its rows; its A is where
  // the rows land (the caller's xRecv, or this rank's window).
  gemm::GemmArgs g;
  NCCLCHECK(moeGemm(c, xRecv, c.w1, c.N, c.H, c.recv.y, c.cfg.outType, &g));
  const size_t slotBytes =
      ((size_t)std::max<int64_t>(slots, 1) * sizeof(int32_t) + 255) / 256 * 256;
  // The tile counters (in the window in the processes layout), then the GEMM's tile claim
  // counter (one more 8-byte word), zeroed before the kernel.
  const size_t ctrWords = procs ? 1 : (size_t)std::max<int64_t>(tiles, 1) + 1;
  const size_t ctrBytes = ctrWords * sizeof(uint64_t);
  g.smBudget = budget - nDisp;
  g.pipeline = 1;  // the deep grouped ring (GroupPipe), which the kernel runs
  g.cluster = 1;
  g.hooks.rowReady = nullptr;  // set below, once the scratch exists
  g.hooks.rowsPerFlag = gemm::kTileM;
  g.hooks.rowReadyExpected = gemm::kTileM;  // every row of the tile landed or padding
  // Same GPU: the counters are added at GPU scope; processes may be on other GPUs of the node.
  g.hooks.rowReadySys = procs;
  g.hooks.wait = f.c.w;

  if (procs) {
    p.d.recv.xRecv = xRecv;
    p.d.recv.rowSource =
        c.recv.rowSource != nullptr ? reinterpret_cast<int*>(win + wl.rowSource) : nullptr;
    p.d.recv.rowWeight =
        c.recv.rowWeight != nullptr ? reinterpret_cast<float*>(win + wl.rowWeight) : nullptr;
  }
  p.nDisp = nDisp;
  const bool kn = c.cfg.wLayout == ncclFusedLayoutKN;
  const gemm::DType in = gemmType(c.inType), out = gemmType(c.cfg.outType);
  // Loaded before the first launch (see moeGemm).
  auto launchIn = [&](int ctas, cudaStream_t s) {
    return gemm::byInType(in, moeApi(c), [&](auto t) {
      return moeFusedLaunchIn<decltype(t)::value>(p, out, kn, ctas, s);
    });
  };
  NCCLCHECK(launchIn(0, nullptr));
  if (procs) {
    cudaFuncAttributes attr;
    CUDACHECK(cudaFuncGetAttributes(&attr, moeWinCopyOut));
  }
  ncclResult_t res = fusedEnqueue(comm, c.stream, moeApi(c), [&](cudaStream_t s) -> ncclResult_t {
    // The slot rows, the copy order and this rank's counters: stream-ordered scratch on the
    // stream the kernel runs on (tile counters in the window for processes), zeroed before
    // the kernel (memset nodes under capture, so every replay starts from zero). A peer adds
    // to them only after reading this call's slot, which this kernel publishes.
    void* tmp = nullptr;
    NCCLCHECK(scratchAlloc(&tmp, 2 * slotBytes + ctrBytes, comm->cudaDev, s));
    uint8_t* base = static_cast<uint8_t*>(tmp);
    ncclResult_t r = ncclSuccess;
    uint64_t* ctr = reinterpret_cast<uint64_t*>(base + 2 * slotBytes);
    CUDACHECKGOTO(cudaMemsetAsync(ctr, 0, ctrBytes, s), r, done);
    if (procs)
      CUDACHECKGOTO(cudaMemsetAsync(win + wl.tileReady, 0, wl.bytes - wl.tileReady, s), r, done);
    {
      p.d.slotRow = slots > 0 ? reinterpret_cast<int32_t*>(base) : nullptr;
      p.d.order = slots > 0 ? reinterpret_cast<int32_t*>(base + slotBytes) : nullptr;
      p.d.tileReady = procs ? reinterpret_cast<uint64_t*>(win + wl.tileReady) : ctr;
      gemm::GemmArgs ga = g;
      ga.hooks.rowReady = p.d.tileReady;
      // Dispatch CTAs join the GEMM once their copies are done: the dynamic schedule.
      ga.tileClaim = reinterpret_cast<int32_t*>(procs ? ctr : ctr + std::max<int64_t>(tiles, 1));
      int32_t gridUnused = 0;
      NCCLCHECKGOTO(gemm::buildParams(ga, &p.g, &gridUnused), r, done);
      MK_INFO(kFused, "%s rank %d T=%zu k=%d E=%d H=%zu N=%zu fused%s: dispatch=%d gemm=%d",
              moeApi(c), f.rank, c.T, c.k, c.E, c.H, c.N, procs ? " (processes)" : "", nDisp,
              budget - nDisp);
      r = launchIn(budget, s);
      if (r == ncclSuccess && procs) {
        const int64_t rowVecs = (int64_t)c.H * fusedTypeSize(c.inType) / 16;
        moeWinCopyOut<<<std::max(1, budget), 512, 0, s>>>(
            reinterpret_cast<const int4*>(xRecv), static_cast<int4*>(c.recv.xRecv),
            reinterpret_cast<const int32_t*>(p.d.recv.rowSource), c.recv.rowSource,
            p.d.recv.rowWeight, c.recv.rowWeight, c.recv.expertOffset + c.E / f.nRanks,
            (int64_t)c.recv.maxRows, rowVecs);
        CUDACHECKGOTO(cudaGetLastError(), r, done);
      }
      if (r == ncclSuccess) *ran = true;
    }
  done:
    return fusedFreeScratch(tmp, s, r, moeApi(c));
  });
  if (res == ncclSuccess && *ran) gLaunches.fetch_add(1);
  return res;
}

}  // namespace fused
}  // namespace mk
