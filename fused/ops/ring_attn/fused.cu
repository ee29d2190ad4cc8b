// ncclRingAttention's fused path (config->algo = ncclFusedFused) for the ranks of one node,
// all in this process on one GPU (the clique) or each in its own process: one persistent
// kernel per rank (fused_kernel.cuh) whose communication CTAs copy the peers' k/v slices into
// a stream-ordered gather buffer in ring order while its attention CTAs run on the sources
// already in place; ranks each in its own process on one GPU read the peers' copies in place
// instead (direct reads, below). On a comm spanning (virtual) nodes (the xnode layout,
// xnode.h) the copy CTAs send and receive the slices through the device communication API.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/checks.h"
#include "base/param.h"
#include "base/scratch.h"
#include "comm/comm.h"
#include "fused/core/clique_block.h"
#include "fused/core/fused_comm.h"
#include "fused/core/proc_windows.h"
#include "fused/ops/ring_attn/fused_kernel.cuh"
#include "fused/ops/ring_attn/ring_attn.h"
#include "fused/ops/ring_attn/ring_attn_util.h"

namespace mk {
namespace fused {

MK_RING_ATTN_INSTANTIATE(extern, 64)
MK_RING_ATTN_INSTANTIATE(extern, 128)
MK_RING_ATTN_INSTANTIATE(extern, 256)

namespace {

constexpr const char* kApi = "ncclRingAttention";

ncclResult_t launchFor(int D, bool f16, const RingParams& p, bool ov, int32_t grid, size_t smem,
                       cudaStream_t s) {
  switch (D) {
    case 64:
      return f16 ? ringAttnLaunch<64, true>(p, ov, grid, smem, s)
                 : ringAttnLaunch<64, false>(p, ov, grid, smem, s);
    case 128:
      return f16 ? ringAttnLaunch<128, true>(p, ov, grid, smem, s)
                 : ringAttnLaunch<128, false>(p, ov, grid, smem, s);
    default:
      return f16 ? ringAttnLaunch<256, true>(p, ov, grid, smem, s)
                 : ringAttnLaunch<256, false>(p, ov, grid, smem, s);
  }
}

// Direct reads, after the attention kernel in stream order (one thread): the call completes
// only once every peer has read this rank's region (the caller may then overwrite k and v,
// and the next call's copy the region). A kernel of its own: in the attention CTAs this wait
// would run with the producer warpgroup's few registers (ptxas spilled), and a CTA waiting
// there before its own count could wait for a peer's CTA waiting the same way.
// trace: the extra row of RingParams::trace, or null.
__global__ void ringDirectEndKernel(const FusedComm f, const RingCtl* mine, uint64_t* trace,
                                    int32_t row) {
  ringTraceStamp(trace, row, kRtEndKernelStart);
  const uint64_t seq = ptx::ldVolatile64(fusedCallCounter(f));  // the attention's, counted
  ringWaitReaders(f.c.w, mine, f.nRanks, f.rank, seq, 0);
  ringTraceStamp(trace, row, kRtEndKernelEnd);
}

// Staged direct reads (ringAttnFused's `staged`), before the attention kernel in stream order
// (one thread): the relay the fused kernel otherwise runs in its first CTA (release `staged`,
// wait for every peer's in the attention's order, open each source's ready flag), run ahead of
// it, so that the attention kernel waits for nobody and may take the whole GPU beside the
// peers' kernels: no rank's kernel needs another's resident. seq is the attention kernel's
// (it counts the call at its end).
__global__ void ringStageKernel(const __grid_constant__ RingParams p) {
  ringTraceStamp(p.trace, p.split.total(), kRtStageStart);
  ringDirectRelay(p, callSeq(p.f));
  ringTraceStamp(p.trace, p.split.total(), kRtStageEnd);
}

// MKERNEL_FUSED_TRACE's summary of one launch (a host function behind the kernels; it owns
// the stamps and returns them to the pool). Times in us after the first CTA's start; the
// absolute start (mod 1 s, one clock for every process on the GPU) lines the ranks up.
struct RingTrace {
  uint64_t* stamps;
  int32_t rank, grid, nComm;
  const char* mode;
};

void CUDART_CB ringTracePrint(void* arg) {
  std::unique_ptr<RingTrace> t(static_cast<RingTrace*>(arg));
  const volatile uint64_t* st = t->stamps;
  const int w = kTraceMaxWords;
  std::vector<uint64_t> starts, ends;
  for (int b = 0; b < t->grid; ++b) {
    const uint64_t a = st[w * b + kRtStart], e = st[w * b + kRtEnd];
    if (a != 0) starts.push_back(a);
    if (e != 0) ends.push_back(e);
  }
  if (starts.empty() || ends.empty()) {
    traceRelease(t->stamps);
    return;
  }
  std::sort(starts.begin(), starts.end());
  std::sort(ends.begin(), ends.end());
  const int64_t t0 = (int64_t)starts.front();
  auto rel = [&](uint64_t v) { return (double)((int64_t)v - t0) * 1e-3; };
  // The kernels around the attention, where the mode runs them ("-" where it does not).
  const uint64_t* x = const_cast<const uint64_t*>(st + (size_t)w * t->grid);
  auto span = [&](int a, int b) {
    char buf[64];
    if (x[a] == 0)
      snprintf(buf, sizeof(buf), "-");
    else if (x[b] == 0)  // began, never ended (a failed wait)
      snprintf(buf, sizeof(buf), "%.1f .. -", rel(x[a]));
    else
      snprintf(buf, sizeof(buf), "%.1f .. %.1f", rel(x[a]), rel(x[b]));
    return std::string(buf);
  };
  fprintf(stderr,
          "[mkernel fused trace] ncclRingAttention rank %d (%s, %d CTAs, %d comm; us after the "
          "first CTA's start, %.1f us mod 1 s): stage kernel %s; CTAs start .. %.1f (%zu), end "
          "%.1f / %.1f / %.1f (first / median / last); end kernel %s\n",
          t->rank, t->mode, t->grid, t->nComm, (double)(t0 % 1000000000ll) * 1e-3,
          span(kRtStageStart, kRtStageEnd).c_str(), rel(starts.back()), starts.size(),
          rel(ends.front()), rel(ends[ends.size() / 2]), rel(ends.back()),
          span(kRtEndKernelStart, kRtEndKernelEnd).c_str());
  traceRelease(t->stamps);
}

// Fused kernels launched (or captured) per layout: ringAttnFusedLaunches.
std::atomic<uint64_t> gLaunches[kRingLayouts];
std::atomic<int32_t> gLastStagedGrid{0};
std::atomic<int32_t> gLastStagedBudget{0};

// The xnode layout's plan (a pure function of values every rank shares: the agreed window
// size and MKERNEL_FUSED_XNODE, n, the shape), or !ok.
RxPlan xnodePlan(const RingAttnCall& c, const FusedComm& f) {
  if (!f.hasNet || MK_PARAM_INT(FusedXnode) == 0) return RxPlan{};
  return rxPlan(f.net.windowBytes, f.nRanks, (int64_t)(c.B * c.S), (int64_t)c.Hkv * c.D * 2);
}

}  // namespace

uint64_t ringAttnFusedLaunches(int layout) {
  return layout >= 0 && layout < kRingLayouts ? gLaunches[layout].load() : 0;
}

int32_t ringAttnLastStagedGrid() {
  return gLastStagedGrid.load();
}

int32_t ringAttnLastStagedBudget() {
  return gLastStagedBudget.load();
}

bool ringAttnStagedEligible(const RingAttnCall& c) {
  const ncclComm* comm = c.comm;
  const int n = comm->nRanks;
  return MK_PARAM_INT(RingSeqDirect) != 0 && n >= 2 && n <= kRingDirectMax &&
         comm->topo.nNodes == 1 && comm->topo.ranksOnMyDevice == n &&
         !cliqueEligible(comm, kRingMaxLocal) && procWindowsEligible(comm, kRingMaxLocal);
}

// The same verdict on every rank: the layout, the least share of the comm's GPUs
// (fusedLeastShare; every rank's kernel needs 2 SMs at least, one CTA per SM; 3 across nodes: a
// send, a receive and an attention CTA),
// and whether the clique block exists when the call is being captured (creating it would
// allocate).
// The processes layout's capture rule is procWindowsGet's (ringAttnFused: *ran false); the
// xnode layout's plan is made in ringAttnFused (it needs the comm's net view).
bool ringAttnFusedEligible(const RingAttnCall& c) {
  const int n = c.comm->nRanks;
  if (n < 2 || n > attn::kMaxSrc) return false;
  if (c.comm->topo.nNodes > 1)
    return n <= kGxMaxRanks && MK_PARAM_INT(FusedXnode) != 0 && fusedLeastShare(c.comm) >= 3;
  const bool clique = cliqueEligible(c.comm, kRingMaxLocal);
  if (!clique && !procWindowsEligible(c.comm, kRingMaxLocal)) return false;
  if (fusedLeastShare(c.comm) < 2) return false;
  if (!clique) return true;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(c.stream, &st) != cudaSuccess) return false;
  return st == cudaStreamCaptureStatusNone || cliqueBlockHeld(c.comm, kCliqueRingAttn);
}

ncclResult_t ringAttnFused(const RingAttnCall& c, bool* ran, bool staged) {
  *ran = false;
  if (staged && !ringAttnStagedEligible(c)) return ncclSuccess;
  ncclComm* comm = c.comm;
  const int n = comm->nRanks, me = comm->rank;
  FusedComm f;
  NCCLCHECK(fusedCommView(comm, rt::kOpRingAttention, &f));
  const size_t slice = c.B * c.S * (size_t)c.Hkv * c.D;
  const int64_t sliceBytes = (int64_t)slice * 2;
  const bool xnode = comm->topo.nNodes > 1;
  const RxPlan rx = xnode ? xnodePlan(c, f) : RxPlan{};
  if (xnode && !rx.ok) return ncclSuccess;  // the sequential path, on every rank
  const bool procs = !xnode && !cliqueEligible(comm, kRingMaxLocal);
  void* block = nullptr;
  ProcView pv{};
  if (xnode) {
    // Nothing to set up: the window and the signal words are the comm's (xnode_proto.h).
  } else if (procs) {
    // Every rank's control block and data region (halves: [k slice][v slice]), mapped here.
    bool ok = false;
    NCCLCHECK(procWindowsGet(comm, kCliqueRingAttn, sizeof(RingCtl), (size_t)sliceBytes, c.stream,
                             &pv, &ok));
    if (!ok) return ncclSuccess;  // the sequential path, on every rank
  } else {
    NCCLCHECK(
        cliqueBlockForCall(comm, kCliqueRingAttn, sizeof(RingClique), c.stream, kApi, &block));
  }

  // SM split inside the rank's budget: a few copy CTAs (HBM-bound; none with direct reads),
  // the rest attention. Every CTA takes a whole SM, and every rank's kernel must be resident at
  // once (each waits for its peers'): never more than the GPU's share of this rank, whatever budget
  // overrides (maxCTAs, MKERNEL_MAX_CTAS) say. The GPU's share of this rank: every rank's kernel in
  // the clique shares this GPU; in the processes layout only the ranks on this GPU do. In one node
  // the share also counts the sibling comms of this process (fusedGpuShare; the comm role's units
  // are the rank's own). xnode: ranks on this GPU only (ringAttnFusedEligible's verdict reads
  // the least share of the comm's GPUs, fusedLeastShare, which every rank counts alike).
  // Staged: no kernel waits for a peer's, so the sequential path's budget (MKERNEL_SEQ_GEMM_SMS;
  // 0, the default, is the whole GPU).
  const int32_t share = xnode ? fusedOwnShare(comm) : fusedGpuShare(comm);
  const int32_t seqSms = seqGemmBudget(comm);
  const int32_t budget = staged ? (seqSms > 0 ? std::min(seqSms, comm->smCount) : comm->smCount)
                                : std::max(xnode ? 3 : 2, std::min(std::max(1, f.smBudget), share));
  // Direct reads (RingParams::direct): the processes layout's attention reads the peers' data
  // regions in place, so only this rank's slices are copied (by the copy engine, before the
  // kernel), and no CTA is set aside for copies. Ranks of either mode interoperate: both
  // stage their own slices, release `staged`, read the peers' regions and count themselves
  // out once per peer, so MKERNEL_RING_DIRECT need not agree between ranks.
  // Only where every rank is on this GPU: across GPUs the reads would cross NVLink for every
  // query tile, neither tested nor measured (each rank decides alone: the modes interoperate).
  const bool oneGpu = comm->topo.ranksOnMyDevice == n;
  // Staged reads in place too (ring order unless MKERNEL_RING_DIRECT asks for rank order).
  const int64_t directMode = staged ? (MK_PARAM_INT(RingDirect) == 1 ? 1 : 2)
                             : procs && oneGpu && n <= kRingDirectMax ? MK_PARAM_INT(RingDirect)
                                                                      : 0;
  const bool direct = directMode != 0;
  int32_t comm0 = c.cfg.commSms > 0 ? c.cfg.commSms : std::min(8, std::max(1, budget / 8));
  // xnode: sends and receives in separate CTAs (a CTA doing both could wait for an ack while
  // its peer's CTA waits for it); by default one of each per peer round and one receive CTA
  // for the own slices' copy, within a quarter of the budget.
  if (xnode && c.cfg.commSms <= 0) comm0 = std::min(2 * (n - 1) + 1, std::max(2, budget / 4));
  if (xnode) comm0 = std::max(2, comm0);
  comm0 = std::min(comm0, budget - 1);
  if (direct) comm0 = 0;

  attn::AttnArgs a = ringAttnArgs(c, n, me);
  a.nSrc = n;
  a.srcStride = (int64_t)slice;
  // Ring order (this rank's slices first: they need no copy), except for direct reads in
  // rank order (MKERNEL_RING_DIRECT=1), meant to let the ranks' attention CTAs, walking the
  // same heads at once, read the same source's blocks together from L2; measured no faster
  // (2-7 % slower at 64K on the H200), so ring order is the default.
  for (int i = 0; i < n; ++i) a.srcRank[i] = directMode == 1 ? i : (me - i + n) % n;
  a.smBudget = budget - comm0;
  a.hooks.wait = f.c.w;
  if (xnode) {
    a.hooks.rowsPerUnit = rx.chunkRows;
    // A missing peer stalls the attention's ready waits and the comm role's waits on that
    // peer alike; the attention's get 2 s more so that the comm role's error, which names
    // the peer and the signal, is the one recorded (the sticky failure then ends the
    // attention's waits at once). Abort is unaffected: every wait polls the abort flag.
    if (f.c.w.timeoutNs != 0) a.hooks.wait.timeoutNs = f.c.w.timeoutNs + 2000000000ull;
  }

  // ready[n], chunkDone[n], then the attention's tile claim counter (MKERNEL_RING_TILE_CLAIM).
  const size_t counters = (size_t)n * (sizeof(uint64_t) + sizeof(uint32_t)) + sizeof(int32_t);
  const size_t gatherBytes = direct ? 0 : 2 * (size_t)n * sliceBytes;
  const size_t bytes = gatherBytes + counters;
  void* scratch = nullptr;
  NCCLCHECK(scratchAlloc(&scratch, bytes, c.comm->cudaDev, c.stream));
  ncclResult_t res = ncclSuccess;
  RingParams rp{};
  int32_t computeGrid = 0;
  if (!direct) {
    rp.kAll = static_cast<char*>(scratch);
    rp.vAll = rp.kAll + n * sliceBytes;
    a.k = rp.kAll;
    a.v = rp.vAll;
  }  // direct: p.a's k/v maps (over the caller's k and v) are unused, kvMap serves
  rp.ready = reinterpret_cast<uint64_t*>(static_cast<char*>(scratch) + gatherBytes);
  rp.chunkDone = reinterpret_cast<uint32_t*>(rp.ready + n);
  a.hooks.ready = rp.ready;
  // The ranks' kernels share the SMs (one after another, or side by side under MPS), so a
  // kernel's CTAs become resident at different times; claimed tiles keep its last ones from
  // waiting on a CTA that started late with a fixed share.
  if (MK_PARAM_INT(RingTileClaim) != 0) a.tileClaim = reinterpret_cast<int32_t*>(rp.chunkDone + n);
  NCCLCHECKGOTO(attn::buildParams(a, &rp.a, &computeGrid), res, done);
  if (direct) {
    rp.direct = 1;
    rp.relay = staged ? 0 : 1;
    for (int i = 0; i < n && res == ncclSuccess; ++i) {
      // Ring order reads this rank's slices from the caller's k and v, rank order from the
      // region, as the peers do.
      const int s = a.srcRank[i];
      const bool caller = s == me && directMode != 1;
      const char* k = caller ? static_cast<const char*>(c.k) : reinterpret_cast<char*>(pv.data[s]);
      const char* v = caller ? static_cast<const char*>(c.v) : k + sliceBytes;
      res = attn::encodeKvSource(a, rp.a.variant, k, v, &rp.kvMap[2 * i], &rp.kvMap[2 * i + 1]);
    }
    if (res != ncclSuccess) goto done;
  }
  rp.f = f;
  rp.q = static_cast<RingClique*>(block);
  rp.procs = procs ? 1 : 0;
  for (int r = 0; procs && r < n; ++r) {
    rp.ctl[r] = static_cast<RingCtl*>(pv.ctl[r]);
    rp.stage[r] = reinterpret_cast<char*>(pv.data[r]);
  }
  rp.k = c.k;
  rp.v = c.v;
  rp.sliceBytes = sliceBytes;
  rp.chunks = (int32_t)((sliceBytes + kRingChunkBytes - 1) / kRingChunkBytes);
  if (xnode) {
    rp.xnode = 1;
    rp.rxSlots = rx.slots;
    rp.rxUnits = rx.units;
    rp.rxArea = rx.areaBytes;
    rp.rxChunkBytes = rx.chunkBytes;
    // The rank's private signal word (xnode_proto.h): zero with the comm, never reset.
    rp.xcalls = f.net.sigLocal + kGxSigSeq;
    rp.recvDone = rp.chunkDone;  // zeroed with the counters below
    rp.net = f.net;
    rp.net.w = f.c.w;  // failures land in the operator's domain: its attention waits see them
  }
  rp.split.count[static_cast<int>(Role::kCompute)] = computeGrid;
  rp.split.count[static_cast<int>(Role::kIntraComm)] = comm0;
  {
    const bool ov = attn::overlapOf(a);
    const bool f16 = c.inType == ncclFloat16;
    const size_t smem = attn::smemBytes(c.D, rp.a.variant);
    // Loaded before the launch (a lazy load could wait behind peers' kernels that wait for
    // this rank).
    NCCLCHECKGOTO(launchFor(c.D, f16, rp, ov, 0, smem, c.stream), res, done);
    if (direct) {
      cudaFuncAttributes attr;
      CUDACHECKGOTO(cudaFuncGetAttributes(&attr, ringDirectEndKernel), res, done);
      if (staged) CUDACHECKGOTO(cudaFuncGetAttributes(&attr, ringStageKernel), res, done);
    }
    CUDACHECKGOTO(cudaMemsetAsync(rp.ready, 0, counters, c.stream), res, done);
    if (MK_PARAM_INT(FusedTrace) != 0) {
      cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
      CUDACHECKGOTO(cudaStreamIsCapturing(c.stream, &cap), res, done);
      // One row per CTA and one for the kernels around the attention.
      rp.trace = traceAcquire(rp.split.total() + 1, cap != cudaStreamCaptureStatusNone);
    }
    NCCLCHECKGOTO(
        fusedEnqueue(
            comm, c.stream, kApi,
            [&](cudaStream_t s) {
              if (direct) {
                // The peers read these copies once the kernel says so.
                char* mine = rp.stage[me];
                CUDACHECK(cudaMemcpyAsync(mine, c.k, sliceBytes, cudaMemcpyDeviceToDevice, s));
                CUDACHECK(cudaMemcpyAsync(mine + sliceBytes, c.v, sliceBytes,
                                          cudaMemcpyDeviceToDevice, s));
              }
              if (staged) {
                ringStageKernel<<<1, 1, 0, s>>>(rp);
                CUDACHECK(cudaGetLastError());
              }
              NCCLCHECK(launchFor(c.D, f16, rp, ov, rp.split.total(), smem, s));
              if (direct) {
                ringDirectEndKernel<<<1, 1, 0, s>>>(rp.f, rp.ctl[me], rp.trace, rp.split.total());
                CUDACHECK(cudaGetLastError());
              }
              if (rp.trace != nullptr) {
                auto* t = new RingTrace{rp.trace, me, rp.split.total(), comm0,
                                        staged   ? "staged"
                                        : xnode  ? "xnode"
                                        : direct ? "direct"
                                                 : (procs ? "processes" : "clique")};
                if (!traceQueue(s, ringTracePrint, t, rp.trace)) delete t;
                rp.trace = nullptr;  // the print function owns it
              }
              return ncclSuccess;
            }),
        res, done);
  }
done:
  // Acquired but not handed to a print function (a launch failed): kernels queued before may
  // still write it.
  if (rp.trace != nullptr) traceReleaseAfter(c.stream, rp.trace);
  if (res == ncclSuccess) {
    *ran = true;
    if (a.tileClaim != nullptr) gLaunches[kRingLayoutClaim].fetch_add(1);
    if (staged) {
      gLaunches[kRingLayoutStaged].fetch_add(1);
      gLastStagedGrid.store(rp.split.total());
      gLastStagedBudget.store(budget);
    } else {
      gLaunches[xnode ? kRingLayoutXnode : (procs ? kRingLayoutProcs : kRingLayoutClique)]
          .fetch_add(1);
      if (direct) gLaunches[kRingLayoutDirect].fetch_add(1);
    }
  }
  return fusedFreeScratch(scratch, c.stream, res, kApi);
}

}  // namespace fused
}  // namespace mk
