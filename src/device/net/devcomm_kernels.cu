// Generic kernels over the device communication API (see devcomm_kernels.h).
#include <cstdint>

#include "device/net/devcomm.cuh"
#include "device/net/devcomm_kernels.h"

namespace mk {
namespace {

namespace dn = dev::net;

template <class G>
__device__ bool runSend(const NetTestArgs& a, const NetTestOp& op) {
  const NetDev& d = a.d;
  const char* src = a.src + op.srcOff;
  if (op.flags & kNetTestZeroCopy) {
    char* z = dn::send_ptr(d, op.srcOff);
    dn::detail::copy<G>(z, src, op.bytes);
    G::sync();  // the put below reads what other threads of the group just wrote
    src = z;
  }
  const uint32_t sigOp = (op.flags & kNetTestAdd) ? kSignalAdd : kSignalSet;
  bool ok;
  if (!(op.flags & kNetTestSignal)) {
    ok = dn::put<G>(d, src, op.peer, op.dstOff, op.bytes);
  } else if (op.flags & kNetTestSplit) {
    ok = dn::put<G>(d, src, op.peer, op.dstOff, op.bytes) &&
         dn::signal<G>(d, op.peer, op.slot, op.value, sigOp);
  } else {
    ok = dn::put_signal<G>(d, src, op.peer, op.dstOff, op.bytes, op.slot, op.value, sigOp);
  }
  if (ok && (op.flags & kNetTestQuiet)) ok = dn::quiet<G>(d);
  return ok;
}

template <class G>
__device__ bool runRecv(const NetTestArgs& a, const NetTestOp& op) {
  const NetDev& d = a.d;
  if (!dn::wait_signal<G>(d, op.slot, op.value, op.peer)) return false;
  if (op.bytes)
    dn::detail::copy<G>(a.out + op.outOff, dn::recv_ptr(d, op.peer, op.dstOff), op.bytes);
  return true;
}

template <class G>
__device__ void runAll(const NetTestArgs& a, int unit, int units) {
  int status = 0;
  for (int i = unit; i < a.nSends && status == 0; i += units)
    if (!runSend<G>(a, a.sends[i])) status = i + 1;
  for (int i = unit; i < a.nRecvs && status == 0; i += units)
    if (!runRecv<G>(a, a.recvs[i])) status = 1000000 + i + 1;
  if (status == 0 && a.quietAtEnd && !dn::quiet<G>(a.d)) status = 2000000;
  if (G::rank() == 0 && status != 0) atomicMax(&a.status[blockIdx.x], status);
}

__global__ void netTestKernel(const NetTestArgs a) {
  if (a.warpScope) {
    const int warps = blockDim.x / 32;
    runAll<dn::Warp>(a, blockIdx.x * warps + threadIdx.x / 32, gridDim.x * warps);
  } else {
    runAll<dn::Block>(a, blockIdx.x, gridDim.x);
  }
}

}  // namespace

cudaError_t launchNetTest(const NetTestArgs& a, int grid, int threads, cudaStream_t s) {
  netTestKernel<<<grid, threads, 0, s>>>(a);
  return cudaGetLastError();
}

}  // namespace mk
