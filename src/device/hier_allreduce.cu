// Device side of the hierarchical AllReduce (scheme: coll/hier.h). One CTA per rank; every
// transfer and wait goes through devcomm.cuh (bounded, abortable waits; errors recorded in
// the net layer's record). Chunks alternate between kHierBanks window banks, and the CTA
// works one chunk ahead: it reduces chunk k+1 inside the node and puts it on the rail before
// it waits for chunk k's rail partials, so the wire carries chunk k+1 while chunk k is
// reduced and gathered (one CTA does both in turn; in order, the wire idled meanwhile).
#include <cstdint>
#include <cuda_runtime.h>

#include "coll/hier.h"
#include "device/net/netchan.cuh"
#include "device/prims.cuh"
#include "device/redspec.cuh"

namespace mk {
namespace dev {
namespace {

namespace dn = ::mk::dev::net;

constexpr int kHierThreads = 512;
constexpr int kHierSmallThreads = 128;  // hierAllReduceSmallKernel: a few elements (>= 2 warps)
// Largest AllReduce (bytes) of the small kernel.
constexpr uint64_t kHierSmallMax = 4096;

// Waits name the slot's one writer (netchan.cuh: one word polled) except in the 8-bit
// kernels, which ptxas (CUDA 12) then makes spill a few bytes.
template <int DT>
constexpr bool kOneWriter = sizeof(typename Num<DT>::U) > 1;

// Chunk k of the call: its sequence number, elements, my segment and window bank.
struct HierChunk {
  uint64_t s;      // sequence number (device-resident base + k + 1)
  uint64_t cb, n;  // first element, elements
  uint64_t myOff, myLen;
  uint64_t bank;  // window offset of its bank
  int nl;
  uint64_t es;
  // Segment of local index j (the planner's rule).
  __device__ void seg(int j, uint64_t* off, uint64_t* len) const {
    hierSegment(n, nl, es, j, off, len);
  }
};

__device__ HierChunk hierChunk(const HierArgs& a, uint64_t seq0, uint64_t k, uint64_t es) {
  HierChunk c;
  c.s = seq0 + k + 1;
  c.cb = k * a.chunkElems;
  c.n = a.count - c.cb < a.chunkElems ? a.count - c.cb : a.chunkElems;
  c.nl = a.nLocal;
  c.es = es;
  c.seg(a.local, &c.myOff, &c.myLen);
  c.bank = hierBankOff(a.stride, a.nLocal, a.nNodes, c.s);
  return c;
}

// Steps 1 and the first half of 2 for chunk c: reduce-scatter inside the node into my
// segment of recvbuff (the node partial), then put the partial on the rail.
template <int DT>
__device__ bool hierFront(const HierArgs& a, const HierChunk& c, typename Num<DT>::U scal) {
  const NetDev& d = a.d;
  const int l = a.local, nl = a.nLocal, me = a.node, nn = a.nNodes;
  const int tid = threadIdx.x, nt = blockDim.x;
  const uint64_t es = c.es;
  const char* send = static_cast<const char*>(a.send);
  char* recv = static_cast<char*>(a.recv);
  // PreMulSum: every rank has its own scalar, so a segment leaves pre-scaled by its owner
  // (round(x * mine), as premul1), staged in my recvbuff's segment j of this chunk (free
  // until step 3 fills it; in place it is the input segment itself, which is sent only
  // here); the reducer then takes it as is.
  for (int j = 0; j < nl; j++) {
    if (j == l) continue;
    const int peer = a.localPeer[j];
    uint64_t o, len;
    c.seg(j, &o, &len);
    const char* src = send + (c.cb + o) * es;
    if (a.premul) {
      void* stage = recv + (c.cb + o) * es;
      scaleMulti<DT>(&stage, 1, src, len, (uint64_t)scal, tid, nt);
      __syncthreads();
      src = static_cast<const char*>(stage);
    }
    if (!netAcquire<dn::Block, kOneWriter<DT>>(d, kHierSigAckL + j, c.s - 1, kHierBanks, peer))
      return false;
    if (!netPublish(d, src, peer, c.bank + hierRsOff(a.stride, nl, l), len * es, kHierSigRS + l,
                    c.s - 1))
      return false;
  }
  for (int j = 0; j < nl; j++) {
    if (j == l) continue;
    if (!netReceive<dn::Block, kOneWriter<DT>>(d, kHierSigRS + j, c.s - 1, a.localPeer[j]))
      return false;
  }
  // Alone in my node and no scalar: my node partial is my input as it is; it leaves from
  // sendbuff (no copy into recvbuff and read back on the way to the wire). The same bits as
  // the one-input reduce, except fp8 e5m2 infinities, which that reduce saturated to the
  // largest finite value (every rank takes this path, so the ranks still agree).
  const bool alone = nl == 1 && !a.premul;
  if (!alone) {
    // Only my own input is raw: it takes my scalar, rounded as the senders' (premul1);
    // the others arrive pre-scaled and take 1 (exact).
    const void* srcs[kHierMaxLocal];
    uint64_t pm[kHierMaxLocal];
    for (int j = 0; j < nl; j++) {
      srcs[j] = j == l ? send + (c.cb + c.myOff) * es
                       : dn::recv_ptr(d, a.localPeer[j], c.bank + hierRsOff(a.stride, nl, j));
      pm[j] = j == l ? (uint64_t)scal : oneBits<DT>();
    }
    void* out[1] = {recv + (c.cb + c.myOff) * es};
    reduceRangeAny<DT>(a.red, srcs, nl, pm, out, 1, c.myLen, RedCfg{0, a.premul, 0}, tid, nt);
  }
  __syncthreads();
  // The partial leaves through staging (it is not in the zero-copy area), so recvbuff may be
  // rewritten once the put returns.
  const char* part = (alone ? send : recv) + (c.cb + c.myOff) * es;
  for (int b = 0; b < nn; b++) {
    if (b == me) continue;
    const int peer = a.railPeer[b];
    if (!netAcquire<dn::Block, kOneWriter<DT>>(d, kHierSigAckN + b, c.s - 1, kHierBanks, peer))
      return false;
    if (!netPublish(d, part, peer, c.bank + hierRailOff(a.stride, nl, me), c.myLen * es,
                    kHierSigRail + me, c.s - 1))
      return false;
  }
  return true;
}

// The rest of chunk c: combine the rail partials in node order, all-gather inside the node,
// acknowledge the chunk to every rank that wrote into my window.
template <int DT>
__device__ bool hierBack(const HierArgs& a, const HierChunk& c) {
  const NetDev& d = a.d;
  const int l = a.local, nl = a.nLocal, me = a.node, nn = a.nNodes;
  const int tid = threadIdx.x, nt = blockDim.x;
  const uint64_t es = c.es;
  char* recv = static_cast<char*>(a.recv);
  char* part = recv + (c.cb + c.myOff) * es;
  // hierFront's rule: alone in my node without a scalar, my partial is my input.
  const char* mine =
      nl == 1 && !a.premul ? static_cast<const char*>(a.send) + (c.cb + c.myOff) * es : part;
  for (int b = 0; b < nn; b++) {
    if (b == me) continue;
    if (!netReceive<dn::Block, kOneWriter<DT>>(d, kHierSigRail + b, c.s - 1, a.railPeer[b]))
      return false;
  }
  {
    // Every rail member combines the same partials in the same order: the same bits.
    const void* srcs[kHierMaxNodes];
    for (int b = 0; b < nn; b++)
      srcs[b] =
          b == me ? mine : dn::recv_ptr(d, a.railPeer[b], c.bank + hierRailOff(a.stride, nl, b));
    void* out[1] = {part};
    reduceRangeAny<DT>(a.red, srcs, nn, nullptr, out, 1, c.myLen, RedCfg{0, 0, a.postDiv}, tid, nt);
  }
  __syncthreads();
  // 3. All-gather inside the node (the acks that free this bank of the peers' AG areas were
  // awaited in hierFront).
  for (int j = 0; j < nl; j++) {
    if (j == l) continue;
    if (!netPublish(d, part, a.localPeer[j], c.bank + hierAgOff(a.stride, nl, l), c.myLen * es,
                    kHierSigAG + l, c.s - 1))
      return false;
  }
  for (int j = 0; j < nl; j++) {
    if (j == l) continue;
    const int peer = a.localPeer[j];
    if (!netReceive<dn::Block, kOneWriter<DT>>(d, kHierSigAG + j, c.s - 1, peer)) return false;
    uint64_t o, len;
    c.seg(j, &o, &len);
    copyBytes(recv + (c.cb + o) * es, dn::recv_ptr(d, peer, c.bank + hierAgOff(a.stride, nl, j)),
              len * es, tid, nt);
  }
  __syncthreads();
  // 4. My window areas of this bank are free again: acknowledge chunk s to their writers.
  for (int j = 0; j < nl; j++) {
    if (j == l) continue;
    if (!netRelease(d, a.localPeer[j], kHierSigAckL + l, c.s - 1)) return false;
  }
  for (int b = 0; b < nn; b++) {
    if (b == me) continue;
    if (!netRelease(d, a.railPeer[b], kHierSigAckN + me, c.s - 1)) return false;
  }
  return true;
}

// Order of one rank: front(0), then front(k+1) before back(k). Every wait is for a stage
// that each peer reaches earlier in the same order: front(k) waits for the acks of back(k-2)
// and for the peers' front(k); back(k) for the rail peers' front(k) and the local peers'
// AG publish of back(k), which follows their front(k+1), which needs only my front(k+1)
// and back(k-1): both done before my back(k).
template <int DT>
__global__ void __launch_bounds__(kHierThreads) hierAllReduceKernel(HierArgs a) {
  using U = typename Num<DT>::U;
  const uint64_t es = sizeof(U);
  __shared__ uint64_t seq0s;
  __shared__ U scals;
  if (threadIdx.x == 0) {
    seq0s = *(volatile uint64_t*)(a.d.sigLocal + kHierSigSeq);
    U v = 0;
    if (a.premul) v = a.scalarOnDevice ? *(const U*)a.scalarPtr : (U)a.scalarBits;
    scals = v;
  }
  // The barrier that publishes seq0s and scals; an earlier operation failed: the peers are out
  // of step and the sequence word may be too.
  if (rt::ctaFailed(a.d.w)) return;
  const uint64_t seq0 = seq0s;
  const U scal = scals;
  if (a.nChunks > 0 && !hierFront<DT>(a, hierChunk(a, seq0, 0, es), scal)) return;
  for (uint64_t k = 0; k < a.nChunks; k++) {
    if (k + 1 < a.nChunks && !hierFront<DT>(a, hierChunk(a, seq0, k + 1, es), scal)) return;
    if (!hierBack<DT>(a, hierChunk(a, seq0, k, es))) return;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    *(volatile uint64_t*)(a.d.sigLocal + kHierSigPrevChunks) = a.nChunks;
    *(volatile uint64_t*)(a.d.sigLocal + kHierSigSeq) = seq0 + a.nChunks;
  }
}

// No PreMulSum, at most kHierSmallMax bytes (one chunk): the same protocol as hierFront +
// hierBack for chunk 0 (the same sequence word, banks, signals and acks, so calls of either
// kernel follow each other freely), in a 128-thread kernel whose rail put carries data of at
// most kProxyInlineMax bytes in the proxy command (no staging slot, no system fence; larger
// ones are staged; MKERNEL_PROXY_INLINE_CMD=2: up to kProxyInlineExtMax bytes, the command
// plus a continuation slot). The general kernel, at its register limit, spills with that path. With
// several ranks per node every rank takes every local input whole (area RS) and reduces them
// in local order, so each rank has the node partial itself: one rail trip, no all-gather
// behind it, and per element the general kernel's arithmetic (its owner's reduce in local
// order, then node order): the same bits. The general kernel cut a few bytes 16-byte-wise:
// one rank held the whole partial and the others made rail trips the all-gather waited for.
// Every rank sends the whole message on the rail instead of its 1/nLocal: nothing at these
// sizes, against a step of the dependency chain.
template <int DT>
__global__ void __launch_bounds__(kHierSmallThreads) hierAllReduceSmallKernel(HierArgs a) {
  using U = typename Num<DT>::U;
  const NetDev& d = a.d;
  const int l = a.local, nl = a.nLocal, me = a.node, nn = a.nNodes;
  const int tid = threadIdx.x, nt = blockDim.x, warp = tid / 32;
  __shared__ uint64_t seq0s, prevs;
  if (tid == 0) {
    seq0s = *(volatile uint64_t*)(d.sigLocal + kHierSigSeq);
    prevs = *(volatile uint64_t*)(d.sigLocal + kHierSigPrevChunks);
  }
  // The barrier that publishes seq0s and prevs (thread 0's failure-word read, independent of
  // the two above, adds no latency of its own); an earlier operation failed: leave.
  if (rt::ctaFailed(d.w)) return;
  const uint64_t s = seq0s + 1;
  // The slots of bank s held chunk s - 2. When my previous call had one chunk (s - 1), every
  // peer that writes into my window also put chunk s - 1 to me, and I waited for that put:
  // its kernel for chunk s - 1 had started, so its kernel holding chunk s - 2 (an earlier
  // call: ranks run a comm's kernels in order) had ended, having read my chunk s - 2 from
  // its window. So the acks (a host-mapped read across PCIe per rail peer, on the critical
  // path of 2 x 1) are implied. After a call of several chunks they are not: the general
  // kernel puts chunk k + 1 before it reads chunk k. The acks are still sent (step 3): the
  // general kernel waits for them.
  const bool acked = prevs == 1;
  const uint64_t bank = hierBankOff(a.stride, nl, nn, s);
  const uint64_t bytes = a.count * sizeof(U);
  // 1. Warp 0: my input to every local peer. Thread 32 (warp 1) meanwhile: the rail slots of this
  // bank are free (the rail peers' acks of call s - 2, host-mapped words: a read across PCIe that
  // costs as much as the local exchange, so it runs under it; it waits for nothing of call
  // s, so no peer can wait for it in turn). Fixed costs, not bytes, make up the small
  // AllReduce's time (a per-phase trace of 2 x 2 processes on the H200: ~2 us per fence or
  // PCIe read, each on the critical path when one thread ran them in a row).
  bool ok = true;
  if (warp == 0) {
    for (int j = 0; j < nl && ok; j++) {
      if (j == l) continue;
      const int peer = a.localPeer[j];
      ok = (acked ||
            netAcquire<dn::Warp, kOneWriter<DT>>(d, kHierSigAckL + j, s - 1, kHierBanks, peer)) &&
           netPublish<dn::Warp>(d, a.send, peer, bank + hierRsOff(a.stride, nl, l), bytes,
                                kHierSigRS + l, s - 1);
    }
  } else if (tid == 32 && !acked) {
    for (int b = 0; b < nn && ok; b++) {
      if (b == me) continue;
      ok = netAcquire<dn::Thread, kOneWriter<DT>>(d, kHierSigAckN + b, s - 1, kHierBanks,
                                                  a.railPeer[b]);
    }
  }
  if (__syncthreads_or(!ok)) return;
  // Their inputs to me, reduced in local order.
  if (nl > 1) {
    for (int j = 0; j < nl; j++) {
      if (j == l) continue;
      if (!netReceive<dn::Block, kOneWriter<DT>>(d, kHierSigRS + j, s - 1, a.localPeer[j])) return;
    }
    const void* srcs[kHierMaxLocal];
    for (int j = 0; j < nl; j++)
      srcs[j] =
          j == l ? a.send : dn::recv_ptr(d, a.localPeer[j], bank + hierRsOff(a.stride, nl, j));
    void* out[1] = {a.recv};
    reduceRangeAny<DT>(a.red, srcs, nl, nullptr, out, 1, a.count, RedCfg{0, 0, 0}, tid, nt);
    __syncthreads();
  }
  // Alone in my node, my input is the node partial (hierFront's rule).
  const void* part = nl > 1 ? a.recv : a.send;
  // 2. The rail (its slots acquired in step 1).
  for (int b = 0; b < nn; b++) {
    if (b == me) continue;
    if (!netPublish<dn::Block, true>(d, part, a.railPeer[b], bank + hierRailOff(a.stride, nl, me),
                                     bytes, kHierSigRail + me, s - 1))
      return;
  }
  for (int b = 0; b < nn; b++) {
    if (b == me) continue;
    if (!netReceive<dn::Block, kOneWriter<DT>>(d, kHierSigRail + b, s - 1, a.railPeer[b])) return;
  }
  {
    // Node order, as hierBack: the same bits on every rank and as the general kernel.
    const void* srcs[kHierMaxNodes];
    for (int b = 0; b < nn; b++)
      srcs[b] =
          b == me ? part : dn::recv_ptr(d, a.railPeer[b], bank + hierRailOff(a.stride, nl, b));
    void* out[1] = {a.recv};
    reduceRangeAny<DT>(a.red, srcs, nn, nullptr, out, 1, a.count, RedCfg{0, 0, a.postDiv}, tid, nt);
  }
  __syncthreads();
  // 3. My window areas of this bank are free again (RS read in step 1, RAIL just now): the
  // local acks from thread 0, the rail acks (ring pushes) from thread 32, side by side.
  if (tid == 0) {
    for (int j = 0; j < nl && ok; j++) {
      if (j == l) continue;
      ok = netRelease<dn::Thread>(d, a.localPeer[j], kHierSigAckL + l, s - 1);
    }
  } else if (tid == 32) {
    for (int b = 0; b < nn && ok; b++) {
      if (b == me) continue;
      ok = netRelease<dn::Thread>(d, a.railPeer[b], kHierSigAckN + me, s - 1);
    }
  }
  if (__syncthreads_or(!ok)) return;
  if (tid == 0) {
    *(volatile uint64_t*)(d.sigLocal + kHierSigPrevChunks) = 1;
    *(volatile uint64_t*)(d.sigLocal + kHierSigSeq) = s;
  }
}

}  // namespace
}  // namespace dev

cudaError_t launchHierAllReduce(const HierArgs& a, cudaStream_t s) {
  using namespace dev;
  return dispatchDtype(
      a.dtype,
      [&](auto dt) {
        constexpr int DT = decltype(dt)::kDt;
        const uint64_t bytes = a.count * sizeof(typename Num<DT>::U);
        // The whole input goes into one area (RS, RAIL) of every peer: the stride must hold it.
        if (!a.premul && a.nChunks == 1 && bytes <= kHierSmallMax && bytes <= a.stride)
          hierAllReduceSmallKernel<DT><<<1, kHierSmallThreads, 0, s>>>(a);
        else
          hierAllReduceKernel<DT><<<1, kHierThreads, 0, s>>>(a);
        return cudaGetLastError();
      },
      [] { return cudaErrorInvalidValue; });
}

}  // namespace mk
