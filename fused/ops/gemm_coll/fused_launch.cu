// Host side of the fused GEMM + collective kernels (fused_kernels.cuh): eligibility, the SM
// split, parameters and the launch. Instantiated here for bf16/fp16 inputs, both B layouts
// and every output type.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdint>
#include <memory>

#include "base/checks.h"
#include "base/param.h"
#include "base/scratch.h"
#include "comm/comm.h"
#include "fused/core/fused_comm.h"
#include "fused/core/cost_model.h"
#include "fused/core/clique_block.h"
#include "fused/core/framework.h"
#include "fused/gemm/dtype_built.h"
#include "fused/ops/gemm_coll/clique.h"
#include "fused/ops/gemm_coll/fused_launchers.cuh"
#include "fused/ops/gemm_coll/gemm_coll.h"
#include "fused/ops/gemm_coll/gemm_coll_util.h"
#include "fused/core/proc_windows.h"
#include "fused/core/trace.h"
#include "fused/ops/gemm_coll/procs.h"
#include "fused/ops/gemm_coll/xnode.h"

namespace mk {
namespace fused {

namespace {

using gemm::DType;

// Bytes the comm CTAs move per rank (what the split model weighs against the GEMM).
double commBytes(const GemmCollCall& c, int n) {
  const double out = (double)fusedTypeSize(c.cfg.outType);
  if (c.op == GemmColl::kAllGather) return 2.0 * c.M * c.K * 2;  // read + write of A
  // Owned share of the tiles: read n partials (output type), write n (AR) or 1 (RS) outputs.
  const double share = (double)c.M * c.N / n;
  return share * out * (n + (c.op == GemmColl::kAllReduce ? n : 1));
}

// ncclFusedAuto follows the model only once the fused kernels have been measured faster than
// the sequential path (bench/fused_bench); until then auto keeps the sequential path, so an
// auto call is never slower than GEMM then collective. MKERNEL_FUSED_AUTO=1 lets the model
// decide (for measuring it).
bool autoMayFuse() {
  return MK_PARAM_INT(FusedAuto) != 0;
}

// ---- MKERNEL_FUSED_TRACE ---------------------------------------------------------------------
// The kernel stamps each CTA's start and end (%globaltimer) into a trace buffer
// (fused/core/trace.h); a host function queued behind it prints when the compute CTAs and the
// comm CTAs finished.
static_assert(kGcTraceWords <= kTraceMaxWords, "GEMM + collective trace words exceed a buffer");

struct TraceCall {
  uint64_t* stamps;  // [grid][kGcTraceWords] (GcParams::trace)
  SmSplit split;
  int grid, rank, nRanks;
  const char* op;
  size_t M, N, K;
};

// Tiles rank `me` of n owns (positions me, me + n, ...), the helpers' share.
size_t ownedTiles(size_t M, size_t N, int me, int n) {
  const size_t tiles = (size_t)gcTiles((int64_t)M, (int64_t)N);
  return tiles > (size_t)me ? (tiles - 1 - me) / n + 1 : 0;
}

void CUDART_CB tracePrint(void* arg) {
  std::unique_ptr<TraceCall> t(static_cast<TraceCall*>(arg));
  const volatile uint64_t* st = t->stamps;
  const int w = kGcTraceWords;
  uint64_t t0 = ~0ull, cFirst = ~0ull, cLast = 0, mLast = 0, loopLast = 0, tailLast = 0;
  uint64_t helped = 0;
  double cSum = 0;
  int nCompute = 0;
  for (int b = 0; b < t->grid; ++b) t0 = std::min(t0, (uint64_t)st[w * b]);
  for (int b = 0; b < t->grid; ++b) {
    int32_t idx;
    const uint64_t end = st[w * b + 2] - t0;
    if (t->split.roleOf(b, &idx) == Role::kCompute) {
      // Every compute CTA stamps the end of its GEMM tiles; its end stamp comes after its
      // helpers' last tile and its share of the reduce tail.
      const uint64_t gemmEnd = st[w * b + 1] != 0 ? st[w * b + 1] - t0 : end;
      tailLast = std::max(tailLast, end);
      cFirst = std::min(cFirst, gemmEnd);
      cLast = std::max(cLast, gemmEnd);
      cSum += (double)gemmEnd;
      helped += st[w * b + 3];
      ++nCompute;
    } else {
      mLast = std::max(mLast, end);
      if (st[w * b + 1] != 0) loopLast = std::max(loopLast, st[w * b + 1] - t0);
    }
  }
  fprintf(
      stderr,
      "[mkernel fused trace] %s rank %d M=%zu N=%zu K=%zu: %d compute CTAs' GEMM done at %.1f / "
      "%.1f / %.1f us (first/mean/last; the CTAs, helpers and tail, end by %.1f us), %d comm "
      "CTAs done at %.1f us (main loops %.1f us); helpers reduced %llu of the rank's %zu tiles; "
      "started at %.1f us (%%globaltimer mod 1 s: ranks on one GPU compare)\n",
      t->op, t->rank, t->M, t->N, t->K, nCompute, cFirst * 1e-3,
      cSum / std::max(1, nCompute) * 1e-3, cLast * 1e-3, tailLast * 1e-3, t->grid - nCompute,
      mLast * 1e-3, loopLast * 1e-3, (unsigned long long)helped,
      ownedTiles(t->M, t->N, t->rank, t->nRanks), (double)(t0 % 1000000000ull) * 1e-3);
  traceRelease(t->stamps);
}

// Fused kernels launched (or captured) per layout: gemmCollFusedLaunches.
std::atomic<uint64_t> gLaunches[3];
std::atomic<int> gLastBudget{0};

// The xnode layout's plan for this call (a pure function of values every rank shares: the
// comm's agreed window size, n, the shape, the parameters init compares), or !ok.
GxPlan xnodePlan(const GemmCollCall& c, const FusedComm& f) {
  GxPlan none;
  if (c.op != GemmColl::kAllGather || !f.hasNet || MK_PARAM_INT(FusedXnode) == 0) return none;
  return gxPlan(f.net.windowBytes, f.nRanks, (int64_t)c.M / f.nRanks, (int64_t)c.K);
}
// The same for GEMM + ReduceScatter and GEMM + AllReduce (xnode.h GrsPlan; AllReduce needs
// M % n == 0 there: its rows are reduced by their owner rank, M / n each).
GrsPlan xnodeRsPlan(const GemmCollCall& c, const FusedComm& f) {
  GrsPlan none;
  if (c.op == GemmColl::kAllGather || !f.hasNet || MK_PARAM_INT(FusedXnode) == 0) return none;
  return grsPlan(f.net.windowBytes, f.nRanks, (int64_t)c.M, (int64_t)c.N,
                 (int32_t)fusedTypeSize(c.cfg.outType), gemm::kTileM, gemm::kTileN,
                 c.op == GemmColl::kAllReduce);
}

// The engine's rate per SM on the H200 with 4 ranks sharing it (bench/results/session4-*): the
// split's and the tail's models.
constexpr double kEngineFlopsPerSm = 6e12;

// Schedule positions at the end of the GEMM that every CTA of the rank reduces (GcParams::
// tailTiles): MKERNEL_FUSED_TAIL waves of the compute CTAs, or by the model what the comm CTAs
// will not have reduced when the GEMM ends, at least two waves. Tail tiles are claimed as
// CTAs become free, so a tail longer than needed costs only a claim per tile; one too short
// leaves the comm CTAs working after the GEMM. Hence the low rates: a comm CTA ~10 GB/s (the
// H200 showed 9.7 for ReduceScatter, 12.4 for AllReduce, 4 ranks sharing it, 8192^3;
// bench/results/session22-*/call3), the engine ~6 TFLOP/s per SM, and 0.8 of that.
int64_t gcTailTiles(const GemmCollCall& c, int n, const SmSplit& split, int64_t tiles,
                    size_t outBytes) {
  const int64_t waves = MK_PARAM_INT(FusedTail);
  const int nComm = split.of(Role::kIntraComm), nCompute = split.of(Role::kCompute);
  if (waves == 0 || nCompute <= 0) return 0;
  if (waves > 0) return std::min(tiles, waves * nCompute);
  const double tileBytes = (double)gemm::kTileM * gemm::kTileN * outBytes;
  const int stores = c.op == GemmColl::kAllReduce ? n : 1;
  const double tTile = (n + stores) * tileBytes / 10e9;
  const double tGemm = 2.0 * c.M * c.N * c.K / (kEngineFlopsPerSm * nCompute);
  const int64_t before = (int64_t)(0.8 * nComm * tGemm / tTile) * n;
  return std::min(tiles, std::max(tiles - before, 2 * (int64_t)nCompute));
}

}  // namespace

int gemmCollLastBudget() {
  return gLastBudget.load();
}

uint64_t gemmCollFusedLaunches(int layout) {
  return layout >= 0 && layout < 3 ? gLaunches[layout].load() : 0;
}

ncclResult_t gemmCollPreload(const GemmCollCall& c) {
  GcParams p{};  // the variant depends on the operation and the types only
  p.kind = (int)c.op;
  p.outType = (int)gemmType(c.cfg.outType);
  const bool kn = c.cfg.bLayout == ncclFusedLayoutKN;
  NCCLCHECK(gemm::byInType(gemmType(c.inType), "fused GEMM", [&](auto in) {
    return launchAny<decltype(in)::value>(p, kn, nullptr, true);
  }));
  if (c.op == GemmColl::kAllGather) NCCLCHECK(preloadBias(c));
  return ncclSuccess;
}

ncclResult_t gemmCollFused(const GemmCollCall& c, const FusedComm& f, bool* ran) {
  *ran = false;
  ncclComm* comm = c.comm;
  const int n = comm->nRanks;
  const int64_t tilesM = (c.M + gemm::kTileM - 1) / gemm::kTileM;
  const int64_t tilesN = (c.N + gemm::kTileN - 1) / gemm::kTileN;
  const size_t outBytes = fusedTypeSize(c.cfg.outType);
  const GcReducePlan plan(n, (int32_t)outBytes, gemm::kSmemBytes);
  // Layouts (fused_kernels.cuh): the clique (every rank in this process), processes (one
  // rank per process), or xnode (a comm spanning nodes); anything else runs the sequential
  // path.
  const bool xnode = comm->topo.nNodes > 1;
  const GxPlan gx = xnode ? xnodePlan(c, f) : GxPlan{};
  const GrsPlan rs = xnode ? xnodeRsPlan(c, f) : GrsPlan{};
  if (xnode && !gx.ok && !rs.ok) return ncclSuccess;
  // The clique/procs flag arrays hold kGcMaxTiles tiles (xnode's live in call scratch).
  if (!xnode && c.op != GemmColl::kAllGather && tilesM * tilesN > kGcMaxTiles) return ncclSuccess;
  // The reduce roles move 16-byte vectors of the output type (8 or 4 columns).
  if (c.op != GemmColl::kAllGather && (c.N * outBytes) % 16 != 0) return ncclSuccess;
  // The in-node reduce role pipelines its chunks through at least two shared-memory stages.
  if (!xnode && c.op != GemmColl::kAllGather && plan.stages < 2) return ncclSuccess;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  CUDACHECK(cudaStreamIsCapturing(c.stream, &cap));
  GcClique* q = nullptr;
  uint64_t* flags = nullptr;
  const bool procs = !xnode && !cliqueEligible(comm, kGcMaxLocal);
  if (procs && !procWindowsEligible(comm, kGcMaxLocal)) return ncclSuccess;
  // Processes and xnode: every rank must take the same path, and ncclFusedAuto's model reads
  // rates each process measures for itself; so auto does not consult it there: across nodes
  // it follows gxAutoFuses (the call's arguments only), in processes it stays sequential
  // (ncclFusedFused or the call's own forced split fuse). MKERNEL_FUSED_COMM_SMS only sizes the
  // split here: it is read per process and not compared at init, so one rank's setting must not
  // make it fuse while its peers run the sequential path (they would wait for each other until the
  // deadline, and the sequential path's data would land in window areas the fused rank uses).
  const bool autoRule = c.cfg.algo == ncclFusedAuto && c.cfg.commSms < 0;
  const bool xnodeAuto =
      xnode && autoRule && gxAutoFuses(c.op == GemmColl::kAllGather, (int64_t)c.N);
  if ((procs || xnode) && autoRule && !xnodeAuto) return ncclSuccess;
  const bool clique = !procs && !xnode;
  // Read once: the setting goes to the kernel with the split chosen for it (clique AR / RS).
  const bool cliqueReduce = clique && c.op != GemmColl::kAllGather;
  const bool helpers = cliqueReduce && MK_PARAM_INT(FusedHelpers) != 0;
  const bool cliqueAuto = clique && gcCliqueAutoFuses(c, helpers);
  // The clique block is created outside capture only (its zeroing synchronises).
  if (clique && cap != cudaStreamCaptureStatusNone && !cliqueBlockHeld(comm, kCliqueGemmColl))
    return ncclSuccess;
  if (clique && gcCliqueGet(comm, &q, &flags) != ncclSuccess) return ncclSuccess;

  // SM split from the rank's budget: the model (or the override) picks the comm CTAs.
  // Every rank's kernel on this GPU must be resident at once (compute CTAs spin on rows that
  // the comm CTAs of this and other ranks bring): never more than the GPU's share of this
  // rank, whatever MKERNEL_MAX_CTAS or ncclConfig.maxCTAs say (as ncclRingAttention does).
  // In one node the grid's share also counts the sibling comms of this process (fusedGpuShare):
  // the split is the rank's own (each rank reduces or gathers its own tiles with its comm
  // CTAs). Verdicts read `least`, the least share of a GPU among the comm's ranks, which every
  // rank counts alike (a rank's own GPU may hold more or fewer of them, the registry may change
  // between two ranks' calls: a sibling comm created or destroyed, and the CTA caps, maxCTAs and
  // MKERNEL_MAX_CTAS behind f.smBudget, are not compared between ranks). Across nodes the
  // budget decides whether the GEMM keeps an SM beside the xnode roles (below), so a cap may
  // lower a rank's grid there only down to the roles and one GEMM CTA, where `least` allows it.
  const int least = std::max(2, (int)fusedLeastShare(comm));
  const int xMin = rs.ok ? 3 : 2;  // the xnode roles' CTAs
  const int ownBudget = std::max(std::min(f.smBudget, least), std::min(least, xMin + 1));
  const int budget =
      xnode ? ownBudget : std::min(f.smBudget, std::max(2, (int)fusedGpuShare(comm)));
  gLastBudget.store(budget);
  // Too small a share for the xnode roles and a compute CTA: the sequential path, for auto
  // here and for ncclFusedFused below (every rank alike: at or above xMin + 1 every rank's
  // budget is too).
  if (xnodeAuto && least < xMin + 1) return ncclSuccess;
  SplitQuery sq;
  sq.M = (int)c.M;
  sq.N = (int)c.N;
  sq.K = (int)c.K;
  sq.intraBytes = commBytes(c, n);
  DeviceRates rates;
  // Measured rates (a device-wide synchronisation on first use) only where the model's
  // fuse/sequential verdict is wanted: ncclFusedAuto with MKERNEL_FUSED_AUTO=1.
  if (autoRule && !xnodeAuto && !cliqueAuto && MK_PARAM_INT(FusedCommSms) < 0)
    NCCLCHECK(getDeviceRates(comm->cudaDev, &rates));
  sq.nRanks = n;
  SplitChoice choice = resolveSplit(sq, rates, budget, c.cfg.commSms);
  // ncclFusedAuto: the model compares max(GEMM on the rest, comm on its SMs) with GEMM then
  // comm on all SMs; an override of the split (API or env) means "fuse". It judges the comm's
  // own budget (above), the grid then takes the split for `budget`.
  // Across nodes and in the clique where gcAutoFuses holds, the verdict is the rule's, taken
  // above; the split is then ncclFusedFused's.
  const bool modelFuses =
      budget == ownBudget ? choice.fuse : resolveSplit(sq, rates, ownBudget, c.cfg.commSms).fuse;
  if (c.cfg.algo == ncclFusedAuto && !xnodeAuto && !cliqueAuto && !(modelFuses && autoMayFuse()))
    return ncclSuccess;
  SmSplit split = choice.split;
  split.count[(int)Role::kInterSend] = 0;
  split.count[(int)Role::kInterReduce] = 0;
  // Unless the caller forced the split: balance the comm CTAs' bytes against the GEMM's
  // flops, x = budget * r / (1 + r) with r = t_comm(1 CTA) / t_gemm(1 SM), from rates measured
  // on the H200 with 4 ranks sharing the GPU (bench/results/session4-*): one comm CTA moves
  // ~12-17 GB/s (the bulk loads from HBM bound it; the stand-alone collective moves ~11 GB/s
  // per SM), the engine does ~6 TFLOP/s per SM. The gather role gives each shard to one CTA,
  // so more than n CTAs would idle.
  const bool modelSplit = choice.source == nullptr || strcmp(choice.source, "model") == 0;
  if (modelSplit) {
    const double tComm = sq.intraBytes / 15e9, tGemm = 2.0 * c.M * c.N * c.K / kEngineFlopsPerSm;
    const double r = tGemm > 0 ? tComm / tGemm : 1.0;
    int want = (int)(budget * r / (1.0 + r) + 0.5);
    if (c.op == GemmColl::kAllGather) want = std::min(want, n);
    split.count[(int)Role::kIntraComm] = std::min(std::max(1, budget / 2), std::max(1, want));
  }
  // Helpers (GcParams::helpers): the compute CTAs reduce, so the model's split gives the comm
  // role no SM (a forced split still gets its comm CTAs, which claim tiles alike).
  if (helpers && modelSplit) split.count[(int)Role::kIntraComm] = 0;
  if (!helpers && split.of(Role::kIntraComm) <= 0) split.count[(int)Role::kIntraComm] = 1;
  // xnode: send and receive CTAs apart (a CTA doing both could wait for an ack while its
  // peer's CTA waits for it); by default one of each per peer round and one receive CTA for
  // the own shard's copy (xnode.h gxSendCtas), at most half the budget.
  // ReduceScatter / AllReduce (xnode.h grsCtas) add reduce CTAs (at least one) to the sends
  // and receives.
  if (xnode && gx.ok && modelSplit)
    split.count[(int)Role::kIntraComm] = std::min(std::max(2, budget / 2), 2 * (n - 1) + 1);
  if (xnode && rs.ok && modelSplit)
    split.count[(int)Role::kIntraComm] = std::min(std::max(3, budget / 2), 2 * (n - 1) + 4);
  if (xnode && split.of(Role::kIntraComm) < xMin) split.count[(int)Role::kIntraComm] = xMin;
  split.count[(int)Role::kCompute] = budget - split.of(Role::kIntraComm);
  // A forced commSms at or above the budget: one SM still goes to the GEMM (in one node the
  // comm role needs no minimum), so the verdict does not depend on this rank's budget.
  if (split.of(Role::kCompute) <= 0 && !xnode && budget >= 2) {
    split.count[(int)Role::kIntraComm] = budget - 1;
    split.count[(int)Role::kCompute] = 1;
  }
  if (split.of(Role::kCompute) <= 0) {
    // Across nodes the budget (the comm's own share, which every rank counts alike) leaves the
    // GEMM nothing beside the xnode roles; or a budget of one SM: the sequential path. Not a
    // refusal: it depends on the comm's set-up rather than the call's arguments, and this runs
    // after CUDA calls (the preload), where a refused call must have changed nothing.
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      MK_INFO(kFused,
              "%s: no SM left for the GEMM in the fused kernel (budget %d, comm %d); running the "
              "sequential path",
              gemmCollName(c.op), budget, split.of(Role::kIntraComm));
    return ncclSuccess;
  }

  // Processes: this rank's control block and data region (its first half the partials or
  // the AllGather shard, its second half the owned tiles' results F), created or grown
  // collectively.
  const size_t partBytes = (size_t)(tilesM * tilesN) * gemm::kTileM * gemm::kTileN * outBytes;
  ProcView pv{};
  GcCtl* ctl[kGcMaxLocal] = {};
  if (procs) {
    const size_t halfBytes = c.op == GemmColl::kAllGather ? c.M / n * c.K * 2 : partBytes;
    bool ok = false;
    NCCLCHECK(procWindowsGet(comm, kCliqueGemmColl, sizeof(GcCtl), halfBytes, c.stream, &pv, &ok));
    if (!ok) return ncclSuccess;
    for (int r = 0; r < n; ++r) ctl[r] = static_cast<GcCtl*>(pv.ctl[r]);
  }

  GcParams p{};
  p.split = split;
  p.w = f.c.w;
  p.q = q;
  const int me = comm->rank;
  for (int r = 0; r < n && !xnode; ++r) {
    if (procs) {
      p.done[r] = ctl[r]->done;
      p.fin[r] = ctl[r]->fin;
      p.peerData[r] = pv.data[r];
      p.shardReady[r] = &ctl[r]->shardReady;
    } else {
      p.done[r] = flags + (int64_t)r * kGcMaxTiles;
      p.fin[r] = flags + (int64_t)(n + r) * kGcMaxTiles;
    }
  }
  if (xnode) {
    // The rank's private signal words (xnode.h): zero with the comm, never reset.
    p.calls = f.net.sigLocal + kGxSigSeq;
    p.ctaDone = reinterpret_cast<uint32_t*>(f.net.sigLocal + kGxSigCta);
  } else {
    p.calls = procs ? &ctl[me]->calls : &q->calls[me];
    p.ctaDone = procs ? &ctl[me]->ctaDone : &q->ctaDone[me];
  }
  p.procs = procs ? 1 : 0;
  p.fOff = (int64_t)pv.halfBytes;
  p.me = comm->rank;
  p.n = n;
  p.kind = (int)c.op;
  p.outType = (int)gemmType(c.cfg.outType);
  p.bias = c.op == GemmColl::kAllGather ? nullptr : c.cfg.bias;
  p.M = (int)c.M;
  p.N = (int)c.N;
  p.K = (int)c.K;
  p.rowsPerRank = (int)(c.M / n);
  p.debug = (int32_t)MK_PARAM_INT(FusedDebug);
  // Every rank of a clique runs on this GPU: its tile flags need GPU scope only (bit 4 of
  // MKERNEL_FUSED_DEBUG keeps system scope, to measure what that costs).
  p.gpuFlags = cliqueReduce && !(p.debug & 16) ? 1 : 0;
  if (cliqueReduce) {
    p.helpers = helpers ? 1 : 0;
    p.tailTiles = helpers ? (int32_t)(tilesM * tilesN)
                          : (int32_t)gcTailTiles(c, n, split, tilesM * tilesN, outBytes);
    p.tailClaim = &q->tailClaim[me];
    p.tailLog = flags + (int64_t)(2 * n + me) * kGcMaxTiles;
  }

  // AllGather's bias kernel runs after the (waiting) fused kernel: gemmCollPreload (run.cc,
  // before the rendezvous) has loaded it.
  ncclResult_t res = ncclSuccess;
  void* tmp = nullptr;
  int32_t gridUnused = 0;
  gemm::GemmArgs g;
  if (xnode && rs.ok) {
    // Call scratch: the GEMM's tile flags, the staged-chunk flags, the reduce flags and the
    // receive CTAs' count (zeroed on the stream, captured as a memset node), then the partials
    // tile by tile, then the staging buffer [n][chunks] (the own source's part unused).
    const int64_t chunks = grsChunks(me, rs.rowsPerRank, gemm::kTileM, rs.rowChunks);
    const size_t tiles = (size_t)rs.tilesM * rs.tilesN;
    const size_t flagBytes =
        ((tiles + (size_t)(n + 1) * chunks) * sizeof(uint64_t) + 16 + 255) / 256 * 256;
    const size_t pBytes = tiles * (size_t)rs.tileBytes;
    NCCLCHECK(scratchAlloc(&tmp, flagBytes + pBytes + (size_t)n * chunks * rs.chunkBytes,
                           comm->cudaDev, c.stream));
    CUDACHECKGOTO(cudaMemsetAsync(tmp, 0, flagBytes, c.stream), res, out);
    p.xnode = 1;
    p.gxSlots = rs.slots;
    p.gxChunks = (int32_t)chunks;
    p.gxArea = rs.areaBytes;
    p.gxChunkBytes = rs.chunkBytes;
    p.grsChunkTiles = rs.chunkTiles;
    p.grsRowChunks = rs.rowChunks;
    p.grsTileBytes = rs.tileBytes;
    p.grsArRows = rs.arRows;
    p.grsArChunks = rs.arChunks;
    p.tileFlags = static_cast<uint64_t*>(tmp);
    p.rowFlags = p.tileFlags + tiles;
    p.redFlags = p.rowFlags + (size_t)n * chunks;
    p.recvDone = reinterpret_cast<uint32_t*>(p.redFlags + chunks);
    p.net = f.net;
    p.net.w = f.c.w;  // failures land in the operator's domain
    p.P = static_cast<uint8_t*>(tmp) + flagBytes;
    p.G = static_cast<uint8_t*>(tmp) + flagBytes + pBytes;
    p.C = c.C;
    g = gemmArgsOf(c, c.A, p.P, c.M, f.smBudget);  // D of the output type
    g.dTiled = true;
    g.hooks.tileDone = p.tileFlags;
    g.hooks.tileDoneValue = 1;
    g.hooks.tileDoneSys = false;  // read by this rank's comm CTAs only
    // Rows of rank me + 1 first: their sends start while the GEMM goes on; own rows last.
    g.hooks.rowBlockOffset = grsFirstRow((me + 1) % n, rs.rowsPerRank, gemm::kTileM);
  } else if (xnode) {
    // Call scratch: the rows-ready flags and the receive CTAs' count (zeroed on the stream,
    // captured as a memset node), then the gathered A when Agathered is NULL.
    const size_t flagBytes = ((size_t)n * gx.chunks * sizeof(uint64_t) + 16 + 255) / 256 * 256;
    NCCLCHECK(
        scratchAlloc(&tmp, flagBytes + (c.Agathered ? 0 : c.M * c.K * 2), comm->cudaDev, c.stream));
    CUDACHECKGOTO(cudaMemsetAsync(tmp, 0, flagBytes, c.stream), res, out);
    p.xnode = 1;
    p.gxChunkRows = gx.chunkRows;
    p.gxSlots = gx.slots;
    p.gxChunks = gx.chunks;
    p.gxArea = gx.areaBytes;
    p.gxChunkBytes = gx.chunkBytes;
    p.rowFlags = static_cast<uint64_t*>(tmp);
    p.recvDone = reinterpret_cast<uint32_t*>(p.rowFlags + (size_t)n * gx.chunks);
    p.net = f.net;
    p.net.w = f.c.w;  // failures land in the operator's domain: its GEMM waits see them
    p.A = c.A;
    p.G = c.Agathered ? c.Agathered : static_cast<uint8_t*>(tmp) + flagBytes;
    g = gemmArgsOf(c, p.G, c.C, c.M, f.smBudget);
    g.hooks.rowReady = p.rowFlags;  // [shard * chunks + chunk]: one flag per chunk of rows
    g.hooks.rowsPerFlag = gx.chunkRows;
    g.hooks.rowReadyExpected = 1;
    g.hooks.rowBlockOffset = (int32_t)((int64_t)p.me * p.rowsPerRank / gemm::kTileM);
  } else if (c.op == GemmColl::kAllGather) {
    p.A = c.A;
    p.G = c.Agathered;
    if (p.G == nullptr) {
      NCCLCHECK(scratchAlloc(&tmp, c.M * c.K * 2, c.comm->cudaDev, c.stream));
      p.G = tmp;
    }
    g = gemmArgsOf(c, p.G, c.C, c.M, f.smBudget);
    g.hooks.rowReady = p.done[me];  // done[me][shard]
    g.hooks.rowsPerFlag = p.rowsPerRank;
    g.hooks.rowReadyIsPeer = true;  // shard f is rank f's
    g.hooks.rowReadyExpected = 1;
    g.hooks.rowBlockOffset = (int32_t)((int64_t)p.me * p.rowsPerRank / gemm::kTileM);
  } else {
    // Partials tile by tile (one bulk copy per rank moves a row block of a tile): stream-
    // ordered scratch, or for processes the start of this rank's data region.
    if (procs) {
      p.P = pv.data[me];
    } else {
      NCCLCHECK(scratchAlloc(&tmp, partBytes, c.comm->cudaDev, c.stream));
      p.P = tmp;
    }
    p.C = c.C;
    p.chunkRows = plan.rows;
    p.stages = plan.stages;
    NCCLCHECKGOTO(gemm::encodeRows(&p.cmap, gemmType(c.cfg.outType), c.C, c.N,
                                   c.op == GemmColl::kAllReduce ? c.M : c.M / n, c.N, gemm::kTileN,
                                   (uint32_t)p.chunkRows),
                  res, out);
    g = gemmArgsOf(c, c.A, p.P, c.M, f.smBudget);  // D of the output type
    g.dTiled = true;
    // The dynamic schedule's counter: reset by the call's last CTA (gcFinish), as tailClaim.
    if (clique && MK_PARAM_INT(FusedDyn) != 0) g.tileClaim = &q->gemmClaim[me];
    g.hooks.tileDone = p.done[me];  // done[me][tile]
    g.hooks.tileDoneValue = 1;
    g.hooks.tileDoneSys = p.gpuFlags == 0;
  }
  g.hooks.seqBase = p.calls;
  g.hooks.wait = f.c.w;
  // xnode: a missing peer stalls the GEMM's row waits and the comm roles' waits on that peer
  // alike; the GEMM's waits get 2 s more so that the comm role's error, which names the peer,
  // is the one recorded (the sticky failure then stops the GEMM's waits at once). Abort is
  // unaffected: every wait polls the abort flag.
  if (xnode && f.c.w.timeoutNs != 0) g.hooks.wait.timeoutNs = f.c.w.timeoutNs + 2000000000ull;
  g.smBudget = split.of(Role::kCompute);
  g.cluster = 1;  // the fused kernel's compute role runs the unpaired CTA
  // ...with the deep ring (gemmCta<Traits<..., DeepPipe>>): pipeline 3 would also change tmB's
  // box (half-tile units), so the fused kernel never takes another pipeline's parameters.
  g.pipeline = 0;
  NCCLCHECKGOTO(gemm::buildParams(g, &p.g, &gridUnused), res, out);
  // The model's times are those of the fuse/sequential verdict (fused/core/cost_model.h);
  // the split above may have been rebalanced with the measured per-CTA rate.
  MK_INFO(kFused,
          "%s rank %d M=%zu N=%zu K=%zu fused: compute=%d comm=%d (%s); predicted fused %.1f us "
          "sequential %.1f us",
          gemmCollName(c.op), p.me, c.M, c.N, c.K, split.of(Role::kCompute),
          split.of(Role::kIntraComm), choice.source, choice.tFusedUs, choice.tSequentialUs);
  p.trace = traceAcquire(split.total(), cap != cudaStreamCaptureStatusNone);
  {
    const bool kn = c.cfg.bLayout == ncclFusedLayoutKN;
    res = gemm::byInType(gemmType(c.inType), "fused GEMM", [&](auto in) {
      return launchAny<decltype(in)::value>(p, kn, c.stream, false);
    });
  }
  if (p.trace != nullptr) {
    TraceCall* t =
        new TraceCall{p.trace, split, split.total(), p.me, p.n, gemmCollName(c.op), c.M, c.N, c.K};
    if (res != ncclSuccess) {
      traceRelease(p.trace);
      delete t;
    } else if (!traceQueue(c.stream, tracePrint, t, p.trace)) {
      delete t;
    }
  }
  if (res == ncclSuccess && c.op == GemmColl::kAllGather)
    res = addBias(c.C, c.cfg.bias, c.M, c.N, c.cfg.outType, comm->smCount, c.stream);
  if (res == ncclSuccess) {
    *ran = true;
    gLaunches[xnode ? 2 : (procs ? 1 : 0)].fetch_add(1);
  }
out:
  return fusedFreeScratch(tmp, c.stream, res, gemmCollName(c.op));
}

}  // namespace fused
}  // namespace mk
