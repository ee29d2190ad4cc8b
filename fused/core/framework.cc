#include "fused/core/framework.h"

#include <cstdint>
#include <string>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "base/param.h"

namespace mk {
namespace fused {

const char* roleName(Role r) {
  switch (r) {
    case Role::kCompute:
      return "compute";
    case Role::kIntraComm:
      return "intra-comm";
    case Role::kInterSend:
      return "inter-send";
    case Role::kInterReduce:
      return "inter-reduce";
    default:
      return "none";
  }
}

ncclResult_t getDeviceInfo(int device, DeviceInfo* out) {
  static std::mutex mu;
  static DeviceInfo cache[64];
  static bool have[64] = {};
  MK_ARGCHECK(device >= 0 && device < 64, "device %d out of range", device);
  std::lock_guard<std::mutex> lock(mu);
  if (!have[device]) {
    DeviceInfo d;
    d.device = device;
    CUDACHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device));
    CUDACHECK(
        cudaDeviceGetAttribute(&d.smemOptin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    CUDACHECK(cudaDeviceGetAttribute(&d.clockKHz, cudaDevAttrClockRate, device));
    CUDACHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device));
    CUDACHECK(cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, device));
    cache[device] = d;
    have[device] = true;
  }
  *out = cache[device];
  return ncclSuccess;
}

ncclResult_t fusedStateCreate(int rank, FusedState** out) {
  FusedState* st = new FusedState();
  st->rank = rank;
  CUDACHECK(cudaGetDevice(&st->device));
  void* p = nullptr;
  CUDACHECK(cudaHostAlloc(&p, sizeof(ErrorRecord) + 64, cudaHostAllocMapped));
  memset(p, 0, sizeof(ErrorRecord) + 64);
  st->errHost = static_cast<ErrorRecord*>(p);
  st->abortHost = reinterpret_cast<uint32_t*>(static_cast<char*>(p) + sizeof(ErrorRecord) + 32);
  void* d = nullptr;
  CUDACHECK(cudaHostGetDevicePointer(&d, p, 0));
  st->errDev = static_cast<ErrorRecord*>(d);
  st->abortDev = reinterpret_cast<uint32_t*>(static_cast<char*>(d) + sizeof(ErrorRecord) + 32);
  *out = st;
  return ncclSuccess;
}

ncclResult_t fusedStateDestroy(FusedState* st) {
  if (st == nullptr) return ncclSuccess;
  if (st->errHost != nullptr) CUDACHECK(cudaFreeHost(st->errHost));
  delete st;
  return ncclSuccess;
}

void fusedSetAbort(FusedState* st, bool abort) {
  __atomic_store_n(st->abortHost, abort ? 1u : 0u, __ATOMIC_RELEASE);
}

ncclResult_t fusedCheckError(const FusedState* st, std::string* msg) {
  const int32_t code = __atomic_load_n(&st->errHost->code, __ATOMIC_ACQUIRE);
  if (code == kErrNone) return ncclSuccess;
  const ErrorRecord& e = *st->errHost;
  char buf[256];
  snprintf(buf, sizeof(buf), "fused kernel %s: rank %d, peer %d, op %d, seq %llu, slot %d",
           code == kErrTimeout ? "timed out (MKERNEL_TIMEOUT_MS)"
                               : (code == kErrAbort ? "aborted" : "failed"),
           e.rank, e.peer, e.op, (unsigned long long)e.seq, e.slot);
  if (msg != nullptr) *msg = buf;
  MK_WARN("%s", buf);
  return code == kErrTimeout ? ncclRemoteError : ncclSystemError;
}

void fusedClearError(FusedState* st) {
  st->errHost->rank = st->errHost->peer = st->errHost->op = st->errHost->slot = 0;
  st->errHost->seq = 0;
  __atomic_store_n(&st->errHost->code, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&st->errHost->claimed, 0u, __ATOMIC_RELEASE);
}

ncclResult_t makeWaitCtx(const FusedState* st, int32_t op, WaitCtx* out, int64_t timeoutMs) {
  DeviceInfo info;
  NCCLCHECK(getDeviceInfo(st->device, &info));
  int64_t ms = timeoutMs > 0 ? timeoutMs : MK_PARAM_INT(TimeoutMs);
  if (ms <= 0) ms = 300000;
  WaitCtx w;
  w.abortFlag = st->abortDev;
  w.err = st->errDev;
  // clock64() counts SM cycles; the attribute is the peak clock in kHz, so at lower clocks
  // the deadline comes later in wall time, never earlier.
  w.timeoutCycles = static_cast<uint64_t>(ms) * static_cast<uint64_t>(info.clockKHz);
  w.rank = st->rank;
  w.op = op;
  *out = w;
  return ncclSuccess;
}

}  // namespace fused
}  // namespace mk
