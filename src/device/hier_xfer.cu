// Device side of the channel engine (scheme: coll/hier_xfer.h). One CTA per lane; every
// transfer and wait goes through devcomm.cuh (bounded, abortable, errors recorded); on a
// failure the lane returns.
#include <algorithm>
#include <cstdint>
#include <cuda_runtime.h>

#include "coll/hier.h"
#include "coll/hier_xfer.h"
#include "device/net/netchan.cuh"
#include "device/prims.cuh"
#include "device/redspec.cuh"

namespace mk {
namespace dev {
namespace {

namespace dn = ::mk::dev::net;

constexpr int kXThreads = 512;
constexpr uint64_t kXSlots = 2;  // slots per channel in the receiver's window (hier_xfer.h)

__device__ __forceinline__ uint64_t umax64(uint64_t a, uint64_t b) {
  return a > b ? a : b;
}

// Waits name the slot's one writer (netchan.cuh: one word polled) except in the kernels of
// 64-bit types: at 128 registers already, ptxas (CUDA 12) then drops them to 64 registers
// with ~500 bytes of spills (any form tried: inline, one loop per route, out of line).
template <int DT>
constexpr bool kOneWriter = sizeof(typename Num<DT>::U) < 8;

template <class A>
__device__ __forceinline__ uint64_t slotOff(const A& a, int sender, uint64_t q) {
  return a.areaBase + (uint64_t)sender * a.areaBytes + (q & 1) * a.slotBytes;
}
// The rank's private chunk counters: written only by the lane owning the channel, read
// after a barrier (or in a later kernel).
template <class A>
__device__ __forceinline__ uint64_t counter(const A& a, uint32_t slot) {
  return *(volatile uint64_t*)(a.d.sigLocal + slot);
}
template <class A>
__device__ __forceinline__ void setCounter(const A& a, uint32_t slot, uint64_t v) {
  __syncthreads();
  if (threadIdx.x == 0) *(volatile uint64_t*)(a.d.sigLocal + slot) = v;
  __syncthreads();
}

// Chunk q of channel me -> peer: wait until its slot is free, then put it with its signal.
// PreMulSum raw input (scale): the chunk is first scaled by my scalar (scaleMulti, rounded as
// premul1) into the channel's zero-copy scratch slot, at the send_ptr offset of the window
// slot it lands in (past the reduce-to-peer scratch at [0, 2 * slotBytes)). That scratch was
// last used by chunk q - 2, which the peer has consumed (so it has left) once ACK >= q - 2.
template <int DT, class A>
__device__ bool sendChunk(const A& a, int peer, const void* src, uint64_t len, uint64_t q,
                          bool scale, uint64_t scalarBits) {
  if (!netAcquire<dn::Block, kOneWriter<DT>>(a.d, kXSigAck + peer, q - 1, kXSlots, peer))
    return false;
  if (scale) {
    void* z = dn::send_ptr(a.d, slotOff(a, peer, q));
    scaleMulti<DT>(&z, 1, src, len / sizeof(typename Num<DT>::U), scalarBits, threadIdx.x,
                   blockDim.x);
    __syncthreads();
    src = z;
  }
  return netPublish<dn::Block, A::kSmallPuts>(a.d, src, peer, slotOff(a, a.me, q), len,
                                              kXSigData + a.me, q - 1);
}

// Bytes step s moves: its n, or for a step of a device-sized AlltoAll (kXSized) what its
// units say now (at most n); both ends of a channel read equal units.
// Only byte-typed launches carry sized steps (collectives without a reduction run as
// ncclUint8, hier_launch.cc), so the reduction kernels, some of them at their register limit,
// do not carry the code.
template <int DT, class A>
__device__ __forceinline__ uint64_t stepBytes(const A& a, const XStep& s) {
  if (DT != ncclUint8 || !(s.flags & kXSized)) return s.n;
  return a.sized.bytes(s.kind == kXRecv, s.kind == kXCopy ? a.me : s.peer, s.n);
}

template <class A>
__device__ __forceinline__ bool scales(const A& a, const XStep& s) {
  return a.premul && (s.flags & kXRawInput);
}

template <int DT, class A>
__device__ bool sendStep(const A& a, const XStep& s, uint64_t scalarBits) {
  const uint64_t base = counter(a, kXSigSent + s.peer);
  const uint64_t bytes = stepBytes<DT>(a, s);
  const uint64_t nch = hierChunks(bytes, a.slotBytes);
  const char* src = reinterpret_cast<const char*>(s.p0);
  for (uint64_t k = 0; k < nch; k++) {
    const uint64_t len = umin64(a.slotBytes, bytes - k * a.slotBytes);
    if (!sendChunk<DT>(a, s.peer, src + k * a.slotBytes, len, base + k + 1, scales(a, s),
                       scalarBits))
      return false;
  }
  setCounter(a, kXSigSent + s.peer, base + nch);
  return true;
}

template <int DT, class A>
__device__ bool recvStep(const A& a, const XStep& s) {
  const uint64_t base = counter(a, kXSigRcvd + s.peer);
  const uint64_t bytes = stepBytes<DT>(a, s);
  const uint64_t nch = hierChunks(bytes, a.slotBytes);
  char* dst = reinterpret_cast<char*>(s.p0);
  for (uint64_t k = 0; k < nch; k++) {
    const uint64_t q = base + k + 1;
    const uint64_t len = umin64(a.slotBytes, bytes - k * a.slotBytes);
    if (!netReceive<dn::Block, kOneWriter<DT>>(a.d, kXSigData + s.peer, q - 1, s.peer))
      return false;
    copyBytes(dst + k * a.slotBytes, dn::recv_ptr(a.d, s.peer, slotOff(a, s.peer, q)), len,
              threadIdx.x, blockDim.x);
    __syncthreads();  // every read of the slot is done before the ack frees it
    if (!netRelease(a.d, s.peer, kXSigAck + a.me, q - 1)) return false;
  }
  setCounter(a, kXSigRcvd + s.peer, base + nch);
  return true;
}

// Interleaved sends: position p of every stream before position p + 1 (see hier_xfer.h).
template <int DT, class A>
__device__ bool sendInterleaved(const A& a, const XLane& ln, uint64_t scalarBits) {
  uint64_t maxPos = 0;
  for (int i = ln.first; i < ln.first + ln.count; i++)
    maxPos = umax64(maxPos, a.steps[i].pos0 + hierChunks(a.steps[i].n, a.slotBytes));
  for (uint64_t p = 0; p < maxPos; p++) {
    for (int i = ln.first; i < ln.first + ln.count; i++) {
      const XStep& s = a.steps[i];
      const uint64_t nch = hierChunks(s.n, a.slotBytes);
      if (p < s.pos0 || p >= s.pos0 + nch) continue;
      const uint64_t k = p - s.pos0;
      const uint64_t len = umin64(a.slotBytes, s.n - k * a.slotBytes);
      const uint64_t q = counter(a, kXSigSent + s.peer) + p + 1;
      if (!sendChunk<DT>(a, s.peer, reinterpret_cast<const char*>(s.p0) + k * a.slotBytes, len, q,
                         scales(a, s), scalarBits))
        return false;
    }
  }
  for (int i = ln.first; i < ln.first + ln.count; i++) {
    const XStep& s = a.steps[i];
    if (!(s.flags & kXLastOfStream)) continue;
    const uint64_t end = s.pos0 + hierChunks(s.n, a.slotBytes);
    setCounter(a, kXSigSent + s.peer, counter(a, kXSigSent + s.peer) + end);
  }
  return true;
}

// pmScal[k]: PreMulSum scalar bits of source k (used only when cfg.premul).
template <int DT, class A>
__device__ void reduceN(const A& a, const void* const* srcs, int n, const uint64_t* pmScal,
                        void* dst, uint64_t len, const RedCfg& cfg) {
  void* dsts[1] = {dst};
  reduceRangeAny<DT>(a.red, srcs, n, pmScal, dsts, 1, len, cfg, threadIdx.x, blockDim.x);
}

// Waits for chunk k of every channel input of list `li` and points srcs at it (my own entry:
// `mine`). Thread 0 fills the table; the API's waits end with a barrier.
template <int DT, class A>
__device__ bool gatherInputs(const A& a, int li, uint64_t k, const void* mine, const void** srcs) {
  for (int j = 0; j < a.listLen[li]; j++) {
    const int p = a.list[li][j];
    if (p == a.me) {
      if (threadIdx.x == 0) srcs[j] = mine;
      continue;
    }
    const uint64_t q = counter(a, kXSigRcvd + p) + k + 1;
    if (!netReceive<dn::Block, kOneWriter<DT>>(a.d, kXSigData + p, q - 1, p)) return false;
    if (threadIdx.x == 0) srcs[j] = dn::recv_ptr(a.d, p, slotOff(a, p, q));
  }
  __syncthreads();
  return true;
}

template <class A>
__device__ bool ackInputs(const A& a, int li, uint64_t k) {
  for (int j = 0; j < a.listLen[li]; j++) {
    const int p = a.list[li][j];
    if (p == a.me) continue;
    if (!netRelease(a.d, p, kXSigAck + a.me, counter(a, kXSigRcvd + p) + k)) return false;
  }
  return true;
}

template <class A>
__device__ void advanceInputs(const A& a, int li, uint64_t nch) {
  for (int j = 0; j < a.listLen[li]; j++) {
    const int p = a.list[li][j];
    if (p != a.me) setCounter(a, kXSigRcvd + p, counter(a, kXSigRcvd + p) + nch);
  }
}

template <int DT, class A>
__device__ bool reduceStep(const A& a, const XStep& s, uint64_t scalarBits) {
  __shared__ const void* srcs[kXMaxRanks];
  // PreMulSum: list 0 holds raw inputs; the peers' arrive pre-scaled (sendChunk), so only
  // my own entry takes my scalar (same rounding). List 1 (partials) is never scaled.
  __shared__ uint64_t pmScal[kXMaxRanks];
  if (a.premul) {
    for (int j = threadIdx.x; j < a.listLen[0]; j += blockDim.x)
      pmScal[j] = a.list[0][j] == a.me ? scalarBits : oneBits<DT>();
    __syncthreads();
  }
  const uint64_t es = sizeof(typename Num<DT>::U);
  const uint64_t ce = a.slotBytes / es;  // elements per chunk
  const uint64_t nch = hierChunks(s.n * es, a.slotBytes);
  const bool l2 = s.flags & kXHasL2, toPeer = s.peer >= 0;
  // kXListOne: list 1 alone (partials: never scaled), as the first and only combine.
  const int l0 = (s.flags & kXListOne) ? 1 : 0;
  const uint64_t obase = toPeer ? counter(a, kXSigSent + s.peer) : 0;
  const RedCfg c1{scalarBits, l0 ? 0 : a.premul, l2 || toPeer ? 0 : a.postDiv};
  const RedCfg c2{scalarBits, 0, a.postDiv};
  for (uint64_t k = 0; k < nch; k++) {
    const uint64_t len = umin64(ce, s.n - k * ce);
    const char* mine = reinterpret_cast<const char*>(s.p1) + k * ce * es;
    char* out = reinterpret_cast<char*>(s.p0) + k * ce * es;
    const uint64_t qo = obase + k + 1;
    if (toPeer) {
      // Scratch in the zero-copy source area; its slot was last used by chunk qo - 2,
      // which the peer has consumed (so the proxy has sent it) once ACK >= qo - 2.
      if (!netAcquire<dn::Block, kOneWriter<DT>>(a.d, kXSigAck + s.peer, qo - 1, kXSlots, s.peer))
        return false;
      out = dn::send_ptr(a.d, (qo & 1) * a.slotBytes);
    }
    if (!gatherInputs<DT>(a, l0, k, mine, srcs)) return false;
    reduceN<DT>(a, srcs, a.listLen[l0], pmScal, out, len, c1);
    __syncthreads();
    if (l2) {
      if (!gatherInputs<DT>(a, 1, k, out, srcs)) return false;
      reduceN<DT>(a, srcs, a.listLen[1], pmScal, out, len, c2);
      __syncthreads();
    }
    if (toPeer &&
        !netPublish(a.d, out, s.peer, slotOff(a, a.me, qo), len * es, kXSigData + a.me, qo - 1))
      return false;
    if (!ackInputs(a, l0, k) || (l2 && !ackInputs(a, 1, k))) return false;
  }
  advanceInputs(a, l0, nch);
  if (l2) advanceInputs(a, 1, nch);
  if (toPeer) {
    setCounter(a, kXSigSent + s.peer, obase + nch);
    // The next launch reuses the scratch: its data must have left.
    if (!dn::quiet(a.d)) return false;
  }
  return true;
}

template <int DT, class A>
__global__ void __launch_bounds__(kXThreads) hierXKernel(const __grid_constant__ A a) {
  const XLane& ln = a.lanes[blockIdx.x];
  __shared__ uint64_t scal;
  if (threadIdx.x == 0) {
    uint64_t bits = a.scalarBits;
    if (a.premul && a.scalarOnDevice) {
      using U = typename Num<DT>::U;
      bits = (uint64_t) * (const U*)a.scalarPtr;
    }
    scal = bits;
  }
  // The barrier that publishes scal; an earlier operation failed: the peers are out of step.
  if (rt::ctaFailed(a.d.w)) return;
  if (ln.interleave) {
    sendInterleaved<DT>(a, ln, scal);
    return;
  }
  for (int i = ln.first; i < ln.first + ln.count; i++) {
    const XStep& s = a.steps[i];
    bool ok = true;
    switch (s.kind) {
      case kXSend:
        ok = sendStep<DT>(a, s, scal);
        break;
      case kXRecv:
        ok = recvStep<DT>(a, s);
        break;
      case kXCopy:
        copyBytes(reinterpret_cast<void*>(s.p1), reinterpret_cast<const void*>(s.p0),
                  stepBytes<DT>(a, s), threadIdx.x, blockDim.x);
        break;
      default:
        ok = reduceStep<DT>(a, s, scal);
    }
    if (!ok) return;
  }
}

}  // namespace
}  // namespace dev

cudaError_t launchHierX(const HierXArgs& a, cudaStream_t s) {
  using namespace dev;
  if (a.nLanes <= 0) return cudaSuccess;
  return dispatchDtype(
      a.dtype,
      [&](auto dt) {
        constexpr int DT = decltype(dt)::kDt;
        if constexpr (DT == ncclUint8) {
          if (a.nSteps <= kXSmallSteps) {
            HierXArgsSmall sm;
            static_cast<HierXHead&>(sm) = a;
            std::copy(a.steps, a.steps + a.nSteps, sm.steps);
            hierXKernel<DT, HierXArgsSmall><<<a.nLanes, kXThreads, 0, s>>>(sm);
            return cudaGetLastError();
          }
        }
        hierXKernel<DT, HierXArgs><<<a.nLanes, kXThreads, 0, s>>>(a);
        return cudaGetLastError();
      },
      [] { return cudaErrorInvalidValue; });
}

}  // namespace mk
