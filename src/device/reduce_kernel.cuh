// Reduction collectives: AllReduce (one-shot, two-shot, ring, zero-copy), Reduce and
// ReduceScatter (direct, zero-copy).
//
// Execution model (docs/collectives.md): the work of an operation is cut into chunks (or
// ring rounds); chunk i belongs to lane i % lanes. A lane is an in-order instruction
// stream that is identical on every rank, with its own FIFO of slots per rank pair; a CTA
// runs lanes blockIdx.x, blockIdx.x + gridDim.x, ... in ascending order. Every wait of a
// lane step depends only on the same or earlier steps of the same lane on the peers, and
// all ranks process lanes in the same order, so the protocol cannot deadlock whatever the
// grid size of each rank (ranks may have different SM budgets).
//
// Message protocol on (src -> dst, lane): the slot-FIFO channel of device/chan.cuh
// (acquire, publish, receive, release), counted by both ends in DevState.
#pragma once

#include <cstdint>
#include "device/chan.cuh"
#include "device/prims.cuh"
#include "device/redspec.cuh"
#include "device/zc.cuh"

namespace mk {
namespace dev {

struct RedShared {
  void* ws[kMaxLocalRanks];
  uint64_t sendCnt[kMaxLocalRanks];  // this lane's counters, per peer
  uint64_t recvCnt[kMaxLocalRanks];
  const void* srcs[kMaxLocalRanks + 1];
  void* dsts[kMaxLocalRanks + 1];
  int16_t plist[kMaxLocalRanks];  // peers of the current step
  int pn;
  int err;
  uint64_t scalarBits;
  uint64_t zcSeq;  // zero-copy AllReduce: this call's number
  // PreMulSum scalar of each source of a step in rank order (reduceRange): mine for my raw
  // input, 1 for data a peer scaled before sending; the zero-copy path reads every
  // rank's own scalar. ring: {mine, 1}.
  uint64_t pmScal[kMaxLocalRanks + 1];
  uint64_t pmRing[2];
};

// Waits (warp 0 polls, one peer per thread) until every peer of sh.plist has freed the slot
// of our next message (send side) or published its next message to us (receive side).
static __device__ __noinline__ bool waitPeers(RedShared& sh, const CommDev& c, int lane,
                                              bool sendSide, int coll) {
  if (threadIdx.x < 32) {
    for (int j = threadIdx.x; j < sh.pn; j += 32) {
      const int q = sh.plist[j];
      const bool ok = sendSide
                          ? acquire(c, sendLink(c, sh.ws, q, lane), sh.sendCnt[q], coll, q, lane)
                          : receive(c, recvLink(c, sh.ws, q, lane), sh.recvCnt[q], coll, q, lane);
      if (!ok) {
        sh.err = 1;
        break;
      }
    }
  }
  __syncthreads();
  return sh.err == 0;
}

// Publishes our next message to every peer of sh.plist (the caller's __syncthreads made
// the CTA's data writes precede this; fence.acq_rel.sys makes them visible system-wide).
static __device__ __noinline__ void releaseSends(RedShared& sh, const CommDev& c, int lane) {
  for (int j = threadIdx.x; j < sh.pn; j += blockDim.x) {
    const int q = sh.plist[j];
    ptx::fenceAcqRelSys();
    publish(sendLink(c, sh.ws, q, lane), sh.sendCnt[q]);
    sh.sendCnt[q]++;
  }
  __syncthreads();
}

// Hands the slots of the messages just read from every peer of sh.plist back to them.
static __device__ __noinline__ void releaseRecvs(RedShared& sh, const CommDev& c, int lane) {
  for (int j = threadIdx.x; j < sh.pn; j += blockDim.x) {
    const int q = sh.plist[j];
    ptx::fenceAcqRelSys();
    release(recvLink(c, sh.ws, q, lane), sh.recvCnt[q]);
    sh.recvCnt[q]++;
  }
  __syncthreads();
}

__device__ __forceinline__ char* sendSlot(RedShared& sh, const CommDev& c, int lane, int q) {
  return slotData(sendLink(c, sh.ws, q, lane), sh.sendCnt[q]);
}
__device__ __forceinline__ char* recvSlot(RedShared& sh, const CommDev& c, int lane, int q) {
  return slotData(recvLink(c, sh.ws, q, lane), sh.recvCnt[q]);
}

// plist = {q} (one peer) or every peer but me.
__device__ __forceinline__ void setOne(RedShared& sh, int q) {
  __syncthreads();
  if (threadIdx.x == 0) {
    sh.plist[0] = (int16_t)q;
    sh.pn = 1;
  }
  __syncthreads();
}
// Every peer but me for which keep(q) holds (the two-shot passes skip peers whose segment has
// no data in this chunk).
template <class Keep>
__device__ __forceinline__ void setOthersIf(RedShared& sh, const CommDev& c, Keep keep) {
  __syncthreads();
  if (threadIdx.x == 0) {
    int pn = 0;
    for (int q = 0; q < c.nLocal; q++)
      if (q != c.me && keep(q)) sh.plist[pn++] = (int16_t)q;
    sh.pn = pn;
  }
  __syncthreads();
}
__device__ __forceinline__ void setOthers(RedShared& sh, const CommDev& c) {
  setOthersIf(sh, c, [](int) { return true; });
}

// ---- one-shot AllReduce and Reduce -------------------------------------------------------
// One-shot: every rank pushes its chunk to every peer, then reduces all n copies in rank
// order. Reduce: every rank pushes to the root, which reduces.
template <int DT, int RED>
__device__ bool oneShotLane(RedShared& sh, const ReduceArgs& a, int lane, const RedCfg& cfg,
                            bool rooted) {
  const CommDev& c = a.c;
  const int n = c.nLocal, me = c.me, tid = threadIdx.x, nt = blockDim.x;
  const size_t es = sizeof(typename Num<DT>::U);
  const char* send = (const char*)a.send;
  char* recv = (char*)a.recv;
  const bool iReduce = !rooted || me == a.root;
  for (uint64_t ch = lane; ch < a.nChunks; ch += c.ws.lanes) {
    uint64_t off = ch * a.chunkElems;
    uint64_t len = umin64(a.chunkElems, a.count - off);
    if (rooted && me != a.root) {
      setOne(sh, a.root);
    } else if (!rooted) {
      setOthers(sh, c);
    } else {
      __syncthreads();
      if (tid == 0) sh.pn = 0;
      __syncthreads();
    }
    if (!waitPeers(sh, c, lane, true, a.coll)) return false;
    for (int j = tid; j < sh.pn; j += nt) sh.dsts[j] = sendSlot(sh, c, lane, sh.plist[j]);
    __syncthreads();
    if (a.premul)
      scaleMulti<DT>(sh.dsts, sh.pn, send + off * es, len, sh.scalarBits, tid, nt);
    else
      copyMulti(sh.dsts, sh.pn, send + off * es, len * es, tid, nt);
    __syncthreads();
    releaseSends(sh, c, lane);
    if (!iReduce) continue;
    setOthers(sh, c);
    if (!waitPeers(sh, c, lane, false, a.coll)) return false;
    for (int q = tid; q < n; q += nt)
      sh.srcs[q] = q == me ? (const void*)(send + off * es) : recvSlot(sh, c, lane, q);
    if (tid == 0) sh.dsts[0] = recv + off * es;
    __syncthreads();
    reduceRange<DT, RED>(sh.srcs, n, sh.pmScal, sh.dsts, 1, len, cfg, tid, nt);
    __syncthreads();
    releaseRecvs(sh, c, lane);
  }
  return true;
}

// ---- two-shot AllReduce and ReduceScatter --------------------------------------------------
// Segment q (segElems elements) is reduced by rank q: every rank pushes its part of the
// chunk to q, q reduces in rank order and (two-shot) pushes the result to every peer in the
// same pass. ReduceScatter is the first half with segment q written to rank q's output.
template <int DT, int RED>
__device__ bool twoShotLane(RedShared& sh, const ReduceArgs& a, int lane, const RedCfg& cfg,
                            bool scatterOnly) {
  const CommDev& c = a.c;
  const int n = c.nLocal, me = c.me, tid = threadIdx.x, nt = blockDim.x;
  const size_t es = sizeof(typename Num<DT>::U);
  const char* send = (const char*)a.send;
  char* recv = (char*)a.recv;
  const uint64_t S = a.segElems, CE = a.chunkElems, N = a.count;
  auto lenOf = [&](int q, uint64_t cOff) -> uint64_t {
    uint64_t segLen = scatterOnly ? S : (S * q >= N ? 0 : umin64(S, N - S * q));
    return segLen > cOff ? umin64(CE, segLen - cOff) : 0;
  };
  // ReduceScatter writes its segment at the start of recvbuff; AllReduce in place of it.
  const uint64_t myOut = scatterOnly ? 0 : (uint64_t)me * S;
  for (uint64_t ch = lane; ch < a.nChunks; ch += c.ws.lanes) {
    const uint64_t cOff = ch * CE;
    // 1. My part of every other segment's chunk to its owner.
    setOthersIf(sh, c, [&](int q) { return lenOf(q, cOff) > 0; });
    if (!waitPeers(sh, c, lane, true, a.coll)) return false;
    for (int j = tid; j < sh.pn; j += nt) sh.dsts[j] = sendSlot(sh, c, lane, sh.plist[j]);
    __syncthreads();
    for (int j = 0; j < sh.pn; j++) {
      int q = sh.plist[j];
      const char* src = send + ((uint64_t)q * S + cOff) * es;
      if (a.premul)
        scaleMulti<DT>(&sh.dsts[j], 1, src, lenOf(q, cOff), sh.scalarBits, tid, nt);
      else
        copyBytes(sh.dsts[j], src, lenOf(q, cOff) * es, tid, nt);
    }
    __syncthreads();
    releaseSends(sh, c, lane);
    // 2. Reduce my segment's chunk; two-shot pushes the result to every peer at once.
    const uint64_t myLen = lenOf(me, cOff);
    if (myLen > 0) {
      setOthers(sh, c);
      if (!waitPeers(sh, c, lane, false, a.coll)) return false;
      if (!scatterOnly && !waitPeers(sh, c, lane, true, a.coll)) return false;
      for (int q = tid; q < n; q += nt)
        sh.srcs[q] = q == me ? (const void*)(send + ((uint64_t)me * S + cOff) * es)
                             : recvSlot(sh, c, lane, q);
      int nd = 1;
      if (!scatterOnly) {
        for (int j = tid; j < sh.pn; j += nt) sh.dsts[1 + j] = sendSlot(sh, c, lane, sh.plist[j]);
        nd += sh.pn;
      }
      if (tid == 0) sh.dsts[0] = recv + (myOut + cOff) * es;
      __syncthreads();
      reduceRange<DT, RED>(sh.srcs, n, sh.pmScal, sh.dsts, nd, myLen, cfg, tid, nt);
      __syncthreads();
      releaseRecvs(sh, c, lane);
      if (!scatterOnly) releaseSends(sh, c, lane);
    }
    if (scatterOnly) continue;
    // 3. Every other segment's reduced chunk from its owner.
    setOthersIf(sh, c, [&](int q) { return lenOf(q, cOff) > 0; });
    if (!waitPeers(sh, c, lane, false, a.coll)) return false;
    for (int j = tid; j < sh.pn; j += nt) sh.srcs[j] = recvSlot(sh, c, lane, sh.plist[j]);
    __syncthreads();
    for (int j = 0; j < sh.pn; j++) {
      int q = sh.plist[j];
      copyBytes(recv + ((uint64_t)q * S + cOff) * es, sh.srcs[j], lenOf(q, cOff) * es, tid, nt);
    }
    __syncthreads();
    releaseRecvs(sh, c, lane);
  }
  return true;
}

// ---- ring AllReduce ---------------------------------------------------------------------
// Single-peer flag helpers for the ring, run by thread 0 alone: a ring hop is on the
// critical path n-1 times per round, so each step costs one barrier before and one after
// the data pass and a single fence for both of its releases.
__device__ __forceinline__ bool waitSendFree1(RedShared& sh, const CommDev& c, int lane, int q,
                                              int coll) {
  return acquire(c, sendLink(c, sh.ws, q, lane), sh.sendCnt[q], coll, q, lane);
}
__device__ __forceinline__ bool waitRecv1(RedShared& sh, const CommDev& c, int lane, int q,
                                          int coll) {
  return receive(c, recvLink(c, sh.ws, q, lane), sh.recvCnt[q], coll, q, lane);
}
// Caller: thread 0, after the barrier that ends the step's data pass, after one fence.
__device__ __forceinline__ void postSend1(RedShared& sh, const CommDev& c, int lane, int q) {
  publish(sendLink(c, sh.ws, q, lane), sh.sendCnt[q]);
  sh.sendCnt[q]++;
}
__device__ __forceinline__ void postRecv1(RedShared& sh, const CommDev& c, int lane, int q) {
  release(recvLink(c, sh.ws, q, lane), sh.recvCnt[q]);
  sh.recvCnt[q]++;
}

// Round g covers n segments of chunkElems; segment s is reduced along the ring starting
// at rank s (reduce-scatter, n-1 hops, the last one writes the final value), then the final
// value travels the ring once more (all-gather), so every rank holds the same bits.
template <int DT, int RED>
__device__ bool ringLane(RedShared& sh, const ReduceArgs& a, int lane, const RedCfg& cfg) {
  const CommDev& c = a.c;
  const int n = c.nLocal, me = c.me, tid = threadIdx.x, nt = blockDim.x;
  const int prev = (me + n - 1) % n, next = (me + 1) % n;
  const size_t es = sizeof(typename Num<DT>::U);
  const char* send = (const char*)a.send;
  char* recv = (char*)a.recv;
  const uint64_t CE = a.chunkElems, N = a.count;
  RedCfg mid = cfg;
  mid.postDiv = 0;
  for (uint64_t g = lane; g < a.nChunks; g += c.ws.lanes) {
    auto segOff = [&](int s) { return (g * n + s) * CE; };
    auto segLen = [&](int s) -> uint64_t {
      uint64_t o = segOff(s);
      return o >= N ? 0 : umin64(CE, N - o);
    };
    // Step 0: my own segment, raw, to the next rank.
    if (tid == 0) {
      if (!waitSendFree1(sh, c, lane, next, a.coll)) sh.err = 1;
      sh.dsts[0] = sendSlot(sh, c, lane, next);
    }
    __syncthreads();
    if (sh.err) return false;
    if (a.premul)
      scaleMulti<DT>(sh.dsts, 1, send + segOff(me) * es, segLen(me), sh.scalarBits, tid, nt);
    else
      copyBytes(sh.dsts[0], send + segOff(me) * es, segLen(me) * es, tid, nt);
    __syncthreads();
    if (tid == 0) {
      ptx::fenceAcqRelSys();
      postSend1(sh, c, lane, next);
    }
    // Steps 1..n-1: add my input to the partial from prev; the last step is final.
    for (int m = 1; m < n; m++) {
      const int s = (me - m + n) % n;
      const bool last = m == n - 1;
      if (tid == 0) {
        if (!waitRecv1(sh, c, lane, prev, a.coll) || !waitSendFree1(sh, c, lane, next, a.coll))
          sh.err = 1;
        sh.srcs[0] = send + segOff(s) * es;
        sh.srcs[1] = recvSlot(sh, c, lane, prev);
        if (last) {
          sh.dsts[0] = recv + segOff(s) * es;
          sh.dsts[1] = sendSlot(sh, c, lane, next);
        } else {
          sh.dsts[0] = sendSlot(sh, c, lane, next);
        }
      }
      __syncthreads();
      if (sh.err) return false;
      // srcs[0] is my raw input (my scalar), srcs[1] prev's partial (scaled by its senders).
      reduceRange<DT, RED>(sh.srcs, 2, sh.pmRing, sh.dsts, last ? 2 : 1, segLen(s),
                           last ? cfg : mid, tid, nt);
      __syncthreads();
      if (tid == 0) {
        ptx::fenceAcqRelSys();
        postRecv1(sh, c, lane, prev);
        postSend1(sh, c, lane, next);
      }
    }
    // All-gather: receive final segments me, me-1, ..., me+2; forward all but the last.
    for (int k = 1; k < n; k++) {
      const int s = (me + 1 - k + n) % n;
      const bool fwd = k < n - 1;
      if (tid == 0) {
        if (!waitRecv1(sh, c, lane, prev, a.coll) ||
            (fwd && !waitSendFree1(sh, c, lane, next, a.coll)))
          sh.err = 1;
        sh.srcs[0] = recvSlot(sh, c, lane, prev);
        sh.dsts[0] = recv + segOff(s) * es;
        if (fwd) sh.dsts[1] = sendSlot(sh, c, lane, next);
      }
      __syncthreads();
      if (sh.err) return false;
      copyMulti(sh.dsts, fwd ? 2 : 1, sh.srcs[0], segLen(s) * es, tid, nt);
      __syncthreads();
      if (tid == 0) {
        ptx::fenceAcqRelSys();
        postRecv1(sh, c, lane, prev);
        if (fwd) postSend1(sh, c, lane, next);
      }
    }
  }
  __syncthreads();
  return true;
}

// ---- zero-copy reductions (registered buffers, windows, or one process on one GPU) -------
// AllReduce: rank q reduces segment q of every rank's input (in rank order: one owner per
// element, so all ranks get the same bits) and writes it into every rank's output.
// ReduceScatter: rank q reduces block q of every input into its own output. Reduce: the
// root reduces every input into its output (only the send buffers are significant on every
// rank, so only the root knows where the result goes). Handshake: device/zc.cuh.

// dsts[0..nd)[i] = reduction of srcs[0..n)[i], all n <= MAXS sources loaded before any is
// used (n 16-byte loads in flight per thread: this loop is bound by HBM latency, not
// compute). Needs every pointer 16-byte aligned; handles whole packs only and returns how
// many elements it did.
template <int DT, int RED, int MAXS>
__device__ __forceinline__ uint64_t zcPacks(const void* const* srcs, void* const* dsts,
                                            const uint64_t* pmScal, int n, int nd, uint64_t cnt,
                                            const RedCfg& cfg, int tid, int nt) {
  using N = Num<DT>;
  using U = typename N::U;
  using Acc = typename N::Acc;
  constexpr int P = 16 / sizeof(U);
  union Pack {
    uint4 v;
    U e[P];
  };
  const bool pm = RED == kRedSum && cfg.premul;
  Acc sc[MAXS];
  const uint4* sp[MAXS];
  uint4* dp[MAXS];
#pragma unroll
  for (int k = 0; k < MAXS; k++) {
    sp[k] = k < n ? (const uint4*)srcs[k] : nullptr;
    sc[k] = pm && k < n ? N::toAcc((U)pmScal[k]) : Acc(1);
    dp[k] = k < nd ? (uint4*)dsts[k] : nullptr;
  }
  const uint64_t np = cnt / P;
  for (uint64_t i = tid; i < np; i += nt) {
    Pack v[MAXS];
#pragma unroll
    for (int k = 0; k < MAXS; k++)
      if (k < n) v[k].v = __ldcg(sp[k] + i);
    Pack o;
#pragma unroll
    for (int e = 0; e < P; e++) {
      Acc acc = N::toAcc(v[0].e[e]);
      if (pm) acc = premul1<DT>(acc, sc[0]);
#pragma unroll
      for (int k = 1; k < MAXS; k++) {
        if (k < n) {
          Acc x = N::toAcc(v[k].e[e]);
          acc = combine<RED>(acc, pm ? premul1<DT>(x, sc[k]) : x);
        }
      }
      o.e[e] = cfg.postDiv > 0 ? N::divide(acc, cfg.postDiv) : N::fromAcc(acc);
    }
#pragma unroll
    for (int k = 0; k < MAXS; k++)
      if (k < nd) dp[k][i] = o.v;
  }
  return np * P;
}

template <int DT, int RED>
__device__ bool zeroCopyReduce(RedShared& sh, const ReduceArgs& a, const RedCfg& cfg) {
  const CommDev& c = a.c;
  const int n = c.nLocal, me = c.me, tid = threadIdx.x, nt = blockDim.x;
  const uint64_t es = sizeof(typename Num<DT>::U);
  const CollType coll = static_cast<CollType>(a.coll);
  if (tid == 0) sh.zcSeq = zcArrive(c, a.zc, a.send, a.recv, sh.scalarBits);
  __syncthreads();
  const uint64_t s = sh.zcSeq;
  if (tid < 32) {
    for (int q = tid; q < n; q += 32) {
      if (q == me) {
        sh.srcs[q] = a.send;
        sh.dsts[q] = a.recv;
        continue;
      }
      const void* ps = nullptr;
      void* pr = nullptr;
      if (!zcWaitArrived(c, q, s, a.coll) || !zcPeerBufs(c, a.zc, q, a.coll, &ps, &pr)) {
        sh.err = 1;
        break;
      }
      sh.srcs[q] = ps;
      sh.dsts[q] = pr;
      sh.pmScal[q] = *(const volatile uint64_t*)&zcSlot(sh.ws[q], c.ws)->scalar;
    }
  }
  __syncthreads();
  if (sh.err) return false;
  // My share: source offset, length and destinations.
  const uint64_t S = a.segElems, N = a.count;
  uint64_t srcOff = 0, len = 0;
  int nd = 1;
  if (coll == CollType::kAllReduce) {
    srcOff = umin64(S * me, N);
    len = umin64(S, N - srcOff);
    nd = n;
  } else if (coll == CollType::kReduceScatter) {
    srcOff = N * me;  // N: elements per rank
    len = N;
  } else if (me == a.root) {  // Reduce
    len = N;
  }
  if (tid == 0 && nd == 1) sh.dsts[0] = a.recv;  // ReduceScatter, Reduce: my own output
  __syncthreads();
  // Per-CTA ranges of whole 16-byte packs.
  const uint64_t P = es < 16 ? 16 / es : 1;
  uint64_t per = (len + gridDim.x - 1) / gridDim.x;
  per = (per + P - 1) / P * P;
  const uint64_t b0 = umin64(per * blockIdx.x, len), cnt = umin64(per, len - b0);
  const uint64_t dstOff = coll == CollType::kAllReduce ? srcOff : 0;
  if (cnt > 0) {
    for (int q = tid; q < n; q += nt) sh.srcs[q] = (const char*)sh.srcs[q] + (srcOff + b0) * es;
    for (int q = tid; q < nd; q += nt) sh.dsts[q] = (char*)sh.dsts[q] + (dstOff + b0) * es;
    __syncthreads();
    bool vec = n <= 8;
    for (int q = 0; q < n && vec; q++) vec = aligned16(sh.srcs[q]);
    for (int q = 0; q < nd && vec; q++) vec = aligned16(sh.dsts[q]);
    uint64_t done = 0;
    if (vec) done = zcPacks<DT, RED, 8>(sh.srcs, sh.dsts, sh.pmScal, n, nd, cnt, cfg, tid, nt);
    if (done < cnt) {
      __syncthreads();
      for (int q = tid; q < n; q += nt) sh.srcs[q] = (const char*)sh.srcs[q] + done * es;
      for (int q = tid; q < nd; q += nt) sh.dsts[q] = (char*)sh.dsts[q] + done * es;
      __syncthreads();
      reduceRange<DT, RED>(sh.srcs, n, sh.pmScal, sh.dsts, nd, cnt - done, cfg, tid, nt);
    }
  }
  __syncthreads();
  if (tid == 0) return zcFinish(c, s, a.coll);
  return true;
}

template <int DT, int RED>
__global__ void __launch_bounds__(kCollThreads, 1)
    reduceKernel(const __grid_constant__ ReduceArgs a) {
  __shared__ RedShared sh;
  const CommDev& c = a.c;
  const int tid = threadIdx.x;
  if (rt::ctaFailed(c.w)) return;  // an earlier operation failed: peers are out of step
  using U = typename Num<DT>::U;
  for (int q = tid; q < c.nLocal; q += blockDim.x) sh.ws[q] = c.peers[q];
  if (tid == 0) {
    sh.err = 0;
    sh.pn = 0;
    sh.scalarBits =
        a.premul ? (a.scalarOnDevice ? (uint64_t) * (const U*)a.scalarPtr : a.scalarBits) : 0;
  }
  __syncthreads();
  for (int q = tid; q < c.nLocal; q += blockDim.x)
    sh.pmScal[q] = q == c.me ? sh.scalarBits : oneBits<DT>();
  if (tid == 0) {
    sh.pmRing[0] = sh.scalarBits;
    sh.pmRing[1] = oneBits<DT>();
  }
  __syncthreads();
  RedCfg cfg{sh.scalarBits, a.premul, a.postDiv};
  const CollType coll = static_cast<CollType>(a.coll);
  if (a.algo == (int)Algo::kZeroCopy) {  // counts its CTAs itself (the last one waits)
    zeroCopyReduce<DT, RED>(sh, a, cfg);
    return;
  }
  for (int lane = blockIdx.x; lane < a.lanes; lane += gridDim.x) {
    for (int q = tid; q < c.nLocal; q += blockDim.x) {
      sh.sendCnt[q] = c.sendCnt[q * kMaxLanes + lane];
      sh.recvCnt[q] = c.recvCnt[q * kMaxLanes + lane];
    }
    __syncthreads();
    bool ok;
    if (coll == CollType::kReduce)
      ok = oneShotLane<DT, RED>(sh, a, lane, cfg, true);
    else if (coll == CollType::kReduceScatter)
      ok = twoShotLane<DT, RED>(sh, a, lane, cfg, true);
    else if (a.algo == (int)Algo::kTwoShot)
      ok = twoShotLane<DT, RED>(sh, a, lane, cfg, false);
    else if (a.algo == (int)Algo::kRing)
      ok = ringLane<DT, RED>(sh, a, lane, cfg);
    else
      ok = oneShotLane<DT, RED>(sh, a, lane, cfg, false);
    if (!ok) return;  // the error is recorded; this comm is dead
    __syncthreads();
    for (int q = tid; q < c.nLocal; q += blockDim.x) {
      c.sendCnt[q * kMaxLanes + lane] = sh.sendCnt[q];
      c.recvCnt[q * kMaxLanes + lane] = sh.recvCnt[q];
    }
    __syncthreads();
  }
  if (tid == 0) rt::finishCta(c.w);
}

// Host-side dispatch over dtype x reduction kind for the dtypes of family FAM (dtFamily);
// the other families are instantiated in their own translation units.
template <int FAM>
cudaError_t launchReduceFamily(const ReduceArgs& a, int grid, cudaStream_t s) {
  if (a.red < kRedSum || a.red > kRedMin || dtFamily(a.dtype) != FAM) return cudaErrorInvalidValue;
  return dispatchDtype(
      a.dtype,
      [&](auto dt) {
        constexpr int DT = decltype(dt)::kDt;
        if constexpr (dtFamily(DT) == FAM)
          dispatchRed(a.red, [&](auto r) {
            reduceKernel<DT, decltype(r)::kRed><<<grid, kCollThreads, 0, s>>>(a);
          });
        return cudaGetLastError();
      },
      [] { return cudaErrorInvalidValue; });
}

}  // namespace dev
}  // namespace mk
