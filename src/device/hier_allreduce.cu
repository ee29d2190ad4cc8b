// Device side of the hierarchical AllReduce (scheme: coll/hier.h). One CTA per rank; every
// transfer and wait goes through devcomm.cuh (bounded, abortable waits; errors recorded in
// the net layer's record). Chunks alternate between kHierBanks window banks, so a chunk
// leaves while its predecessor is still being acknowledged.
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

template <int DT>
__global__ void __launch_bounds__(kHierThreads) hierAllReduceKernel(HierArgs a) {
  using N = Num<DT>;
  using U = typename N::U;
  const NetDev& d = a.d;
  const uint64_t es = sizeof(U);
  const int l = a.local, nl = a.nLocal, me = a.node, nn = a.nNodes;
  const int tid = threadIdx.x, nt = blockDim.x;
  __shared__ uint64_t seq0s;
  __shared__ U scal;
  if (tid == 0) {
    seq0s = *(volatile uint64_t*)(d.sigLocal + kHierSigSeq);
    U s = 0;
    if (a.premul) s = a.scalarOnDevice ? *(const U*)a.scalarPtr : (U)a.scalarBits;
    scal = s;
  }
  __syncthreads();
  const uint64_t seq0 = seq0s;
  const U scalU = scal;
  const char* send = static_cast<const char*>(a.send);
  char* recv = static_cast<char*>(a.recv);

  for (uint64_t k = 0; k < a.nChunks; k++) {
    const uint64_t s = seq0 + k + 1;
    const uint64_t cb = k * a.chunkElems;
    const uint64_t n = a.count - cb < a.chunkElems ? a.count - cb : a.chunkElems;
    uint64_t myOff, myLen;
    // Segment of local index j (same arithmetic as hierSegment on the host).
    auto segOf = [&](int j, uint64_t* off, uint64_t* len) {
      uint64_t seg = (n + (uint64_t)nl - 1) / (uint64_t)nl;
      const uint64_t q = es < 16 ? 16 / es : 1;
      seg = (seg + q - 1) / q * q;
      uint64_t o = seg * (uint64_t)j < n ? seg * (uint64_t)j : n;
      uint64_t e = o + seg < n ? o + seg : n;
      *off = o;
      *len = e - o;
    };
    segOf(l, &myOff, &myLen);
    const uint64_t bank = hierBankOff(a.stride, nl, nn, s);

    // 1. Reduce-scatter inside the node. PreMulSum: every rank has its own scalar, so a
    // segment leaves pre-scaled by its owner (round(x * mine), as premul1), staged in my
    // recvbuff's segment j of this chunk (free until step 3 fills it; in place it is the
    // input segment itself, which is sent only here); the reducer then takes it as is.
    for (int j = 0; j < nl; j++) {
      if (j == l) continue;
      const int peer = a.localPeer[j];
      uint64_t o, len;
      segOf(j, &o, &len);
      const char* src = send + (cb + o) * es;
      if (a.premul) {
        void* stage = recv + (cb + o) * es;
        scaleMulti<DT>(&stage, 1, src, len, (uint64_t)scalU, tid, nt);
        __syncthreads();
        src = static_cast<const char*>(stage);
      }
      if (!netAcquire(d, kHierSigAckL + j, s - 1, kHierBanks, peer)) return;
      if (!netPublish(d, src, peer, bank + hierRsOff(a.stride, nl, l), len * es, kHierSigRS + l,
                      s - 1))
        return;
    }
    for (int j = 0; j < nl; j++) {
      if (j == l) continue;
      if (!netReceive(d, kHierSigRS + j, s - 1, a.localPeer[j])) return;
    }
    {
      // Only my own input is raw: it takes my scalar, rounded as the senders' (premul1);
      // the others arrive pre-scaled and take 1 (exact).
      const void* srcs[kHierMaxLocal];
      uint64_t pm[kHierMaxLocal];
      for (int j = 0; j < nl; j++) {
        srcs[j] = j == l ? send + (cb + myOff) * es
                         : dn::recv_ptr(d, a.localPeer[j], bank + hierRsOff(a.stride, nl, j));
        pm[j] = j == l ? (uint64_t)scalU : oneBits<DT>();
      }
      void* out[1] = {recv + (cb + myOff) * es};
      reduceRangeAny<DT>(a.red, srcs, nl, pm, out, 1, myLen, RedCfg{0, a.premul, 0}, tid, nt);
    }
    __syncthreads();

    // 2. Rail exchange of the node partials; combine them in node order.
    const char* part = recv + (cb + myOff) * es;
    for (int b = 0; b < nn; b++) {
      if (b == me) continue;
      const int peer = a.railPeer[b];
      if (!netAcquire(d, kHierSigAckN + b, s - 1, kHierBanks, peer)) return;
      if (!netPublish(d, part, peer, bank + hierRailOff(a.stride, nl, me), myLen * es,
                      kHierSigRail + me, s - 1))
        return;
    }
    for (int b = 0; b < nn; b++) {
      if (b == me) continue;
      if (!netReceive(d, kHierSigRail + b, s - 1, a.railPeer[b])) return;
    }
    {
      const void* srcs[kHierMaxNodes];
      for (int b = 0; b < nn; b++)
        srcs[b] =
            b == me ? part : dn::recv_ptr(d, a.railPeer[b], bank + hierRailOff(a.stride, nl, b));
      void* out[1] = {recv + (cb + myOff) * es};
      reduceRangeAny<DT>(a.red, srcs, nn, nullptr, out, 1, myLen, RedCfg{0, 0, a.postDiv}, tid, nt);
    }
    __syncthreads();

    // 3. All-gather inside the node (the acks that free this bank of the peers' AG areas
    // were awaited in step 1).
    for (int j = 0; j < nl; j++) {
      if (j == l) continue;
      if (!netPublish(d, part, a.localPeer[j], bank + hierAgOff(a.stride, nl, l), myLen * es,
                      kHierSigAG + l, s - 1))
        return;
    }
    for (int j = 0; j < nl; j++) {
      if (j == l) continue;
      const int peer = a.localPeer[j];
      if (!netReceive(d, kHierSigAG + j, s - 1, peer)) return;
      uint64_t o, len;
      segOf(j, &o, &len);
      copyBytes(recv + (cb + o) * es, dn::recv_ptr(d, peer, bank + hierAgOff(a.stride, nl, j)),
                len * es, tid, nt);
    }
    __syncthreads();

    // 4. My window areas are free again: acknowledge chunk s to their writers.
    for (int j = 0; j < nl; j++) {
      if (j == l) continue;
      if (!netRelease(d, a.localPeer[j], kHierSigAckL + l, s - 1)) return;
    }
    for (int b = 0; b < nn; b++) {
      if (b == me) continue;
      if (!netRelease(d, a.railPeer[b], kHierSigAckN + me, s - 1)) return;
    }
  }
  __syncthreads();
  if (tid == 0) *(volatile uint64_t*)(d.sigLocal + kHierSigSeq) = seq0 + a.nChunks;
}

}  // namespace
}  // namespace dev

cudaError_t launchHierAllReduce(const HierArgs& a, cudaStream_t s) {
  using namespace dev;
  return dispatchDtype(
      a.dtype,
      [&](auto dt) {
        hierAllReduceKernel<decltype(dt)::kDt><<<1, kHierThreads, 0, s>>>(a);
        return cudaGetLastError();
      },
      [] { return cudaErrorInvalidValue; });
}

}  // namespace mk
