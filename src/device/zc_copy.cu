// Zero-copy copies: Broadcast, AllGather, AlltoAll, Gather and Scatter straight between
// user buffers (coll/zc_plan.h chooses them, coll/launch.h describes the arguments).
//
// After the handshake (device/zc.cuh) this rank copies its pieces, each one block of
// `bytes`: AllGather and AlltoAll pull every peer's block into the own receive buffer,
// Gather's root pulls, Broadcast's and Scatter's root pushes into every peer's receive
// buffer; the other ranks of a rooted collective only take part in the handshake (their
// buffers are read or written by the root). The pieces of a rank are cut in per-CTA byte
// ranges, so any grid size works; pieces start at the next rank so that the ranks do not
// all read the same peer at once.
#include <cstdint>

#include "device/prims.cuh"
#include "device/zc.cuh"

namespace mk {
namespace dev {

struct ZcCopyShared {
  const void* peerSend[kZcMaxMapped];
  void* peerRecv[kZcMaxMapped];
  const void* src[kZcMaxMapped];
  void* dst[kZcMaxMapped];
  uint64_t seq;
  int np;
  int err;
};

__global__ void __launch_bounds__(kCollThreads, 1)
    zcCopyKernel(const __grid_constant__ ZcCopyArgs a) {
  __shared__ ZcCopyShared sh;
  const CommDev& c = a.c;
  const int n = c.nLocal, me = c.me, tid = threadIdx.x, nt = blockDim.x;
  if (rt::ctaFailed(c.w)) return;  // an earlier operation failed: peers are out of step
  if (tid == 0) {
    sh.err = 0;
    sh.np = 0;
    sh.seq = zcArrive(c, a.zc, a.send, a.recv, 0);
  }
  __syncthreads();
  const uint64_t s = sh.seq;
  if (tid < 32) {
    for (int q = tid; q < n; q += 32) {
      if (q == me) {
        sh.peerSend[q] = a.send;
        sh.peerRecv[q] = a.recv;
        continue;
      }
      if (!zcWaitArrived(c, q, s, a.coll) ||
          !zcPeerBufs(c, a.zc, q, a.coll, &sh.peerSend[q], &sh.peerRecv[q])) {
        sh.err = 1;
        break;
      }
    }
  }
  __syncthreads();
  if (sh.err) return;
  const uint64_t B = a.bytes;
  if (tid == 0) {
    const char* S = (const char*)a.send;
    char* R = (char*)a.recv;
    const CollType coll = static_cast<CollType>(a.coll);
    const bool root = me == a.root;
    int np = 0;
    for (int k = 1; k <= n; k++) {
      const int q = (me + k) % n;  // me last
      const void* src = nullptr;
      void* dst = nullptr;
      if (coll == CollType::kAllGather || (coll == CollType::kGather && root)) {
        dst = R + q * B;
        src = sh.peerSend[q];
      } else if (coll == CollType::kAlltoAll) {
        dst = R + q * B;
        src = (const char*)sh.peerSend[q] + me * B;
      } else if (coll == CollType::kBroadcast && root) {
        dst = sh.peerRecv[q];
        src = S;
      } else if (coll == CollType::kScatter && root) {
        dst = sh.peerRecv[q];
        src = S + q * B;
      }
      if (dst != nullptr && dst != src) {  // in place: nothing to copy
        sh.dst[np] = dst;
        sh.src[np] = src;
        np++;
      }
    }
    sh.np = np;
  }
  __syncthreads();
  // My byte range of the concatenated pieces, in whole 16-byte units.
  const uint64_t total = (uint64_t)sh.np * B;
  uint64_t per = (total + gridDim.x - 1) / gridDim.x;
  per = (per + 15) / 16 * 16;
  uint64_t b = umin64(per * blockIdx.x, total);
  const uint64_t end = umin64(b + per, total);
  while (b < end) {
    const uint64_t k = b / B, off = b - k * B, len = umin64(B - off, end - b);
    copyBytes((char*)sh.dst[k] + off, (const char*)sh.src[k] + off, len, tid, nt);
    b += len;
  }
  __syncthreads();
  if (tid == 0) zcFinish(c, s, a.coll);
}

}  // namespace dev

cudaError_t launchZcCopy(const ZcCopyArgs& a, int grid, cudaStream_t s) {
  dev::zcCopyKernel<<<grid, kCollThreads, 0, s>>>(a);
  return cudaGetLastError();
}

}  // namespace mk
