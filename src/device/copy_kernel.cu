// The copy engine: Broadcast, AllGather, AlltoAll, Gather, Scatter and grouped Send/Recv,
// all expressed as lists of point-to-point transfers plus local copies.
//
// A transfer of `bytes` to or from peer q is cut into chunks of chunkBytes (a function of
// bytes and the workspace layout, so both ends agree); chunk j travels on lane j % p2pLanes.
// Each (peer, direction, lane) is a stream: an in-order sequence of chunks of the ops with
// that peer and direction, in issue order. Unlike the reduction kernels, the streams of a
// CTA are polled without blocking (warp 0 checks 32 streams at once, the CTA copies the
// chunks that are ready), so sends and receives between any ranks in any issue order
// progress as long as their peers' matching streams do: no deadlock for matching pairs.
#include <cstdint>

#include "device/chan.cuh"
#include "device/prims.cuh"

namespace mk {
namespace dev {

struct StreamState {
  uint32_t op;     // current op (nOps: finished)
  uint32_t chunk;  // current chunk of that op
  uint64_t cnt;    // channel message counter
};

struct CopyShared {
  void* ws[kMaxLocalRanks];
  uint32_t mask;
  int base;
  int remaining;
  int rr;
  int err;
};

// Bytes and chunks op moves: as planned, or, for a device-sized AlltoAll (CopyUnits), the
// units its block holds now (at most the planned bytes). Both ends read equal units (the
// caller's contract), so they cut the same chunks and their channel counters stay paired.
template <typename Args>
__device__ __forceinline__ uint64_t opBytes(const Args& a, const CopyOp& op) {
  if (!a.u.s.on()) return op.bytes;
  const int rank = op.dir == kDirLocal ? a.u.meRank : a.u.rankOf[op.peer];
  return a.u.s.bytes(op.dir == kDirRecv, rank, op.bytes);
}
template <typename Args>
__device__ __forceinline__ uint32_t opChunks(const Args& a, const CopyOp& op) {
  if (!a.u.s.on()) return op.nChunks;
  return (uint32_t)((opBytes(a, op) + op.chunkBytes - 1) / op.chunkBytes);
}

template <typename Args>
__device__ __forceinline__ uint32_t nextOp(const Args& a, uint32_t from, int peer, int dir,
                                           int lane) {
  for (uint32_t o = from; o < (uint32_t)a.nOps; o++) {
    const CopyOp& op = a.ops[o];
    if (op.peer == peer && op.dir == dir && opChunks(a, op) > (uint32_t)lane) return o;
  }
  return (uint32_t)a.nOps;
}

template <int MaxOps, int MaxStreams>
__global__ void __launch_bounds__(kCollThreads, 1)
    copyKernel(const __grid_constant__ CopyArgsT<MaxOps, MaxStreams> a) {
  extern __shared__ StreamState st[];
  __shared__ CopyShared sh;
  const CommDev& c = a.c;
  const WsLayout& w = c.ws;
  const int tid = threadIdx.x, nt = blockDim.x;
  if (rt::ctaFailed(c.w)) return;
  for (int q = tid; q < c.nLocal; q += nt) sh.ws[q] = c.peers[q];
  const int nMine =
      (int)(a.nStreams > (int)blockIdx.x ? (a.nStreams - blockIdx.x + gridDim.x - 1) / gridDim.x
                                         : 0);
  for (int k = tid; k < nMine; k += nt) {
    uint32_t s = a.streams[blockIdx.x + (uint64_t)k * gridDim.x];
    int peer = s >> 16, dir = (s >> 8) & 0xff, lane = s & 0xff;
    uint64_t* cnt = dir == kDirSend ? c.sendCnt : c.recvCnt;
    st[k].cnt = cnt[peer * kMaxLanes + lane];
    st[k].op = nextOp(a, 0, peer, dir, lane);
    st[k].chunk = lane;
  }
  __syncthreads();
  if (tid == 0) {
    int rem = 0;
    for (int k = 0; k < nMine; k++) rem += st[k].op < (uint32_t)a.nOps;
    sh.remaining = rem;
    sh.rr = 0;
    sh.err = 0;
  }
  // Local copies (own block of AllGather, root's block of Gather/Scatter, send to self):
  // every CTA takes a 16-byte aligned share.
  for (int o = 0; o < a.nOps; o++) {
    const CopyOp& op = a.ops[o];
    if (op.dir != kDirLocal) continue;
    const uint64_t bytes = opBytes(a, op);
    uint64_t share = (bytes + gridDim.x - 1) / gridDim.x;
    share = (share + 15) / 16 * 16;
    uint64_t b0 = share * blockIdx.x;
    if (b0 >= bytes) continue;
    uint64_t len = umin64(share, bytes - b0);
    copyBytes((char*)op.dst + b0, (const char*)op.src + b0, len, tid, nt);
  }
  __syncthreads();

  rt::Spin spin;  // meaningful in thread 0 only
  while (sh.remaining > 0) {
    if (tid < 32) {
      const int base = sh.rr;
      const int k = base + tid;
      bool ready = false;
      if (k < nMine && st[k].op < (uint32_t)a.nOps) {
        uint32_t s = a.streams[blockIdx.x + (uint64_t)k * gridDim.x];
        int peer = s >> 16, dir = (s >> 8) & 0xff, lane = s & 0xff;
        ready = dir == kDirSend ? canSend(sendLink(c, sh.ws, peer, lane), st[k].cnt)
                                : canRecv(recvLink(c, sh.ws, peer, lane), st[k].cnt);
      }
      uint32_t mask = __ballot_sync(0xffffffffu, ready);
      if (tid == 0) {
        sh.mask = mask;
        sh.base = base;
      }
    }
    __syncthreads();
    const uint32_t mask = sh.mask;
    const int base = sh.base;
    if (mask == 0) {
      if (tid == 0) {
        const uint32_t code = spin.check(c.w);
        if (code != rt::kErrNone) {
          if (code != rt::kErrPeerFailed) {
            // Name the first stream that is still waiting.
            for (int k = 0; k < nMine; k++) {
              if (st[k].op >= (uint32_t)a.nOps) continue;
              const uint32_t s = a.streams[blockIdx.x + (uint64_t)k * gridDim.x];
              const int peer = s >> 16, lane = s & 0xff;
              const bool send = ((s >> 8) & 0xff) == kDirSend;
              const uint64_t cnt = st[k].cnt;
              const P2pLink l =
                  send ? sendLink(c, sh.ws, peer, lane) : recvLink(c, sh.ws, peer, lane);
              const uint64_t target = !send                         ? chanReady(cnt)
                                      : chanNeedsFree(cnt, l.slots) ? chanFree(cnt, l.slots)
                                                                    : 0;
              rt::recordError(c.w, code, chanSite(a.coll, peer, lane, l, cnt, send), target,
                              spin.waited());
              break;
            }
          }
          sh.err = 1;
        }
        sh.rr = base + 32 < nMine ? base + 32 : 0;
      }
      __syncthreads();
      if (sh.err) return;
      continue;
    }
    for (uint32_t m = mask; m != 0; m &= m - 1) {
      const int k = base + __ffs(m) - 1;
      const uint32_t s = a.streams[blockIdx.x + (uint64_t)k * gridDim.x];
      const int peer = s >> 16, dir = (s >> 8) & 0xff, lane = s & 0xff;
      const CopyOp& op = a.ops[st[k].op];
      const uint64_t cnt = st[k].cnt;
      const uint64_t off = (uint64_t)st[k].chunk * op.chunkBytes;
      const uint64_t len = umin64(op.chunkBytes, opBytes(a, op) - off);
      const P2pLink l =
          dir == kDirSend ? sendLink(c, sh.ws, peer, lane) : recvLink(c, sh.ws, peer, lane);
      if (dir == kDirSend)
        copyBytes(slotData(l, cnt), (const char*)op.src + off, len, tid, nt);
      else
        copyBytes((char*)op.dst + off, slotData(l, cnt), len, tid, nt);
      __syncthreads();
      if (tid == 0) {
        ptx::fenceAcqRelSys();
        if (dir == kDirSend)
          publish(l, cnt);
        else
          release(l, cnt);
        st[k].cnt = cnt + 1;
        uint32_t chunk = st[k].chunk + (uint32_t)w.p2pLanes;
        if (chunk >= opChunks(a, op)) {
          st[k].op = nextOp(a, st[k].op + 1, peer, dir, lane);
          chunk = lane;
          if (st[k].op >= (uint32_t)a.nOps) sh.remaining--;
        }
        st[k].chunk = chunk;
      }
      __syncthreads();
    }
    if (tid == 0) {
      spin = rt::Spin();  // progress: restart the deadline
      sh.rr = base + 32 < nMine ? base + 32 : 0;
    }
    __syncthreads();
  }
  for (int k = tid; k < nMine; k += nt) {
    uint32_t s = a.streams[blockIdx.x + (uint64_t)k * gridDim.x];
    int peer = s >> 16, dir = (s >> 8) & 0xff, lane = s & 0xff;
    uint64_t* cnt = dir == kDirSend ? c.sendCnt : c.recvCnt;
    cnt[peer * kMaxLanes + lane] = st[k].cnt;
  }
  __syncthreads();
  if (tid == 0) rt::finishCta(c.w);
}

// One-rank comm: the result of every operation but PreMulSum is the input. A kernel with
// three arguments, not cudaMemcpyAsync: the host cost of this call is what a one-rank
// comm measures, and a small launch is the cheapest thing to enqueue.
__global__ void __launch_bounds__(kCollThreads)
    oneRankCopyKernel(void* dst, const void* src, uint64_t bytes) {
  // Split in per-CTA ranges of whole 16-byte units, so aligned buffers stay aligned.
  uint64_t per = (bytes + gridDim.x - 1) / gridDim.x;
  per = (per + 15) / 16 * 16;
  const uint64_t b0 = umin64(per * blockIdx.x, bytes);
  copyBytes((char*)dst + b0, (const char*)src + b0, umin64(per, bytes - b0), threadIdx.x,
            blockDim.x);
}

}  // namespace dev

cudaError_t launchOneRankCopy(void* dst, const void* src, uint64_t bytes, int grid,
                              cudaStream_t s) {
  dev::oneRankCopyKernel<<<grid, kCollThreads, 0, s>>>(dst, src, bytes);
  return cudaGetLastError();
}

cudaError_t launchCopySmall(const CopyArgsSmall& a, int grid, size_t smem, cudaStream_t s) {
  dev::copyKernel<kCopySmallOps, kCopySmallStreams><<<grid, kCollThreads, smem, s>>>(a);
  return cudaGetLastError();
}

cudaError_t launchCopyLarge(const CopyArgsLarge& a, int grid, size_t smem, cudaStream_t s) {
  dev::copyKernel<kCopyLargeOps, kCopyLargeStreams><<<grid, kCollThreads, smem, s>>>(a);
  return cudaGetLastError();
}

}  // namespace mk
