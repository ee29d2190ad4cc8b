#include "device/rt/err_host.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "base/param.h"

namespace mk {
namespace rt {

uint64_t timeoutNs() {
  int64_t ms = MK_PARAM_INT(TimeoutMs);
  if (ms <= 0 || ms > (int64_t)1e12) return ~0ull >> 1;  // no overflow in clock arithmetic
  return (uint64_t)ms * 1000000ull;
}

namespace {

constexpr int kRecordsPerBlock = 1024;
struct RecordPool {
  std::mutex mu;
  std::vector<ErrRecord*> free;
};
RecordPool& recordPool() {
  static RecordPool* p = new RecordPool();  // never destroyed: records outlive static dtors
  return *p;
}

}  // namespace

ncclResult_t recordAlloc(ErrRecord** host, ErrRecord** dev) {
  RecordPool& p = recordPool();
  std::lock_guard<std::mutex> g(p.mu);
  if (p.free.empty()) {
    ErrRecord* b = nullptr;
    CUDACHECK(cudaHostAlloc((void**)&b, sizeof(ErrRecord) * kRecordsPerBlock,
                            cudaHostAllocMapped | cudaHostAllocPortable));
    memset(b, 0, sizeof(ErrRecord) * kRecordsPerBlock);
    for (int i = kRecordsPerBlock - 1; i >= 0; i--) p.free.push_back(b + i);
  }
  ErrRecord* r = p.free.back();
  void* d = nullptr;
  CUDACHECK(cudaHostGetDevicePointer(&d, r, 0));
  p.free.pop_back();
  memset(r, 0, sizeof(*r));
  *host = r;
  *dev = static_cast<ErrRecord*>(d);
  return ncclSuccess;
}

void recordFree(ErrRecord* host) {
  if (host == nullptr) return;
  RecordPool& p = recordPool();
  std::lock_guard<std::mutex> g(p.mu);
  memset(host, 0, sizeof(*host));
  p.free.push_back(host);
}

const char* opName(int32_t op) {
  switch (op) {
    case kOpAllReduce:
      return "AllReduce";
    case kOpBroadcast:
      return "Broadcast";
    case kOpReduce:
      return "Reduce";
    case kOpAllGather:
      return "AllGather";
    case kOpReduceScatter:
      return "ReduceScatter";
    case kOpAlltoAll:
      return "AlltoAll";
    case kOpGather:
      return "Gather";
    case kOpScatter:
      return "Scatter";
    case kOpSend:
    case kOpRecv:
      return "Send/Recv";  // one kernel runs a group's sends and receives
    case kOpPut:
      return "put";
    case kOpPutSignal:
      return "put_signal";
    case kOpSignal:
      return "signal";
    case kOpWaitSignal:
      return "wait_signal";
    case kOpQuiet:
      return "quiet";
    case kOpGemm:
      return "GEMM (rows-ready wait)";
    case kOpExample:
      return "fused example (GEMM + ring copy)";
    case kOpGemmAllReduce:
      return "GemmAllReduce";
    case kOpAllGatherGemm:
      return "AllGatherGemm";
    case kOpGemmReduceScatter:
      return "GemmReduceScatter";
    case kOpMoe:
      return "MoE dispatch (MoeDispatchGemm, MoeDispatchFfnCombine)";
    case kOpMoeCombine:
      return "MoE combine (MoeDispatchFfnCombine)";
    case kOpRingAttention:
      return "RingAttention";
    default:
      return "device operation";
  }
}

namespace {

bool isNetOp(int32_t op) {
  return op >= kOpPut && op <= kOpQuiet;
}

// What the wait was for, as the end of "waiting for ...".
std::string awaited(const ErrRecord& e, const std::string& who) {
  char b[160];
  switch (e.wait) {
    case kWaitData:
      return who + " to send its data";
    case kWaitSlot:
      return who + " to free a workspace slot";
    case kWaitSignal:
      snprintf(b, sizeof(b), "signal slot %d to reach %llu", e.slot, (unsigned long long)e.seq);
      return b;
    case kWaitRing:
      return "a free slot in the proxy command ring";
    case kWaitStage:
      return "a free staging slot (the proxy was still sending its data)";
    case kWaitQuiet:
      return "the proxy to complete the commands issued so far";
    case kWaitFlag:
      if (e.peer >= 0) {  // a flag this rank sets for data of `who` (e.g. its rows of A)
        snprintf(b, sizeof(b), "flag %d (data of %s) to reach %llu", e.slot, who.c_str(),
                 (unsigned long long)e.seq);
      } else {
        snprintf(b, sizeof(b), "flag %d to reach %llu", e.slot, (unsigned long long)e.seq);
      }
      return b;
    default:
      return "nothing";
  }
}

}  // namespace

ncclResult_t describe(const ErrRecord& e, const ErrNames& n, std::string* msg) {
  const char* op = opName(e.op);
  int peer = e.peer;
  if ((e.flags & kErrPeerLocal) && peer >= 0 && n.localRanks != nullptr && peer < n.nLocal)
    peer = n.localRanks[peer];
  const std::string who = peer >= 0 ? "rank " + std::to_string(peer) : std::string("the peer");
  const int64_t tms = n.timeoutMs >= 0 ? n.timeoutMs : (int64_t)MK_PARAM_INT(TimeoutMs);
  const std::string what = awaited(e, who);
  char m[1536];  // room for a queue hint (ncclComm::queueHint) after the timeout text
  ncclResult_t res = ncclSystemError;
  switch (e.kind) {
    case kErrTimeout: {
      res = ncclRemoteError;
      std::string blame = who + " did not join the operation or failed";
      if (e.wait == kWaitRing || e.wait == kWaitStage || e.wait == kWaitQuiet)
        blame = "the proxy or the connection to " + who + " is stalled";
      else if (e.wait == kWaitFlag && e.peer < 0)
        blame = "a role of this rank stopped before publishing it";
      else if (n.hint != nullptr && n.hint[0] != '\0' && peer >= 0 && peer < n.nHintPeers &&
               n.hintPeers[peer] != 0)
        blame += " (" + std::string(n.hint) + ")";
      snprintf(m, sizeof(m),
               "rank %d: %s timed out after %.3f s waiting for %s (%s %d, slot %d, value %llu, "
               "after %llu operations on this comm); %s (MKERNEL_TIMEOUT_MS=%lld)",
               n.rank, op, (double)e.waitedNs * 1e-9, what.c_str(), isNetOp(e.op) ? "CTA" : "lane",
               e.lane, e.slot, (unsigned long long)e.seq, (unsigned long long)e.opCount,
               blame.c_str(), (long long)tms);
      break;
    }
    case kErrAbort:
      snprintf(m, sizeof(m),
               "rank %d: %s aborted (ncclCommAbort/revoke) while waiting for %s (%s %d, slot %d, "
               "value %llu)",
               n.rank, op, what.c_str(), isNetOp(e.op) ? "CTA" : "lane", e.lane, e.slot,
               (unsigned long long)e.seq);
      break;
    case kErrProxy:
      res = ncclRemoteError;
      snprintf(m, sizeof(m), "rank %d: %s (%s, CTA %d) failed: the proxy stopped (%s)", n.rank, op,
               who.c_str(), e.lane, n.proxyMsg && n.proxyMsg[0] ? n.proxyMsg : "comm aborted");
      break;
    case kErrArgs:
      res = ncclInvalidUsage;
      if (e.op == kOpMoe && e.slot == -2)
        // The AllToAll path's pair buffers: a peer's maxRows in seq, this rank's in waitedNs.
        snprintf(m, sizeof(m),
                 "rank %d: %s: rank %d passed maxRows=%llu and this rank %llu; ranks in separate "
                 "processes or on several GPUs must pass the same maxRows (nothing was received)",
                 n.rank, op, e.peer, (unsigned long long)e.seq, (unsigned long long)e.waitedNs);
      else if (e.op == kOpMoe)
        // The dispatch's bad expert id: the routing slot in seq, the id in waitedNs.
        snprintf(m, sizeof(m),
                 "rank %d: %s: topkIdx slot %llu holds expert id %d, outside [0, experts) and not "
                 "-1 (the slot was not sent)",
                 n.rank, op, (unsigned long long)e.seq, (int)(int32_t)e.waitedNs);
      else if (e.wait == kWaitNone && e.op == kOpWaitSignal)
        snprintf(m, sizeof(m), "rank %d: %s: signal slot %d out of range", n.rank, op, e.slot);
      else
        // Argument records carry dst_offset in seq and the byte count in waitedNs.
        snprintf(m, sizeof(m),
                 "rank %d: %s to %s (CTA %d): bad arguments (peer out of range, dst_offset "
                 "%llu + %llu bytes beyond the window, or signal slot %d out of range)",
                 n.rank, op, who.c_str(), e.lane, (unsigned long long)e.seq,
                 (unsigned long long)e.waitedNs, e.slot);
      break;
    case kErrOverflow:
      res = ncclInvalidUsage;
      if (e.peer < 0)
        // A receiver's own bound: the rows needed in seq, the bound in waitedNs.
        snprintf(m, sizeof(m),
                 "rank %d: %s: %llu rows (padding included) would arrive, more than the bound "
                 "of %llu rows the caller gave; nothing was received",
                 n.rank, op, (unsigned long long)e.seq, (unsigned long long)e.waitedNs);
      else
        snprintf(m, sizeof(m),
                 "rank %d: %s: %llu items from %s exceed the bound the caller gave (slot %d)",
                 n.rank, op, (unsigned long long)e.seq, who.c_str(), e.slot);
      break;
    case kErrPeerFailed:
      res = ncclRemoteError;
      snprintf(m, sizeof(m), "rank %d: %s stopped: %s failed first", n.rank, op, who.c_str());
      break;
    case kErrProtocol:
      res = ncclInternalError;
      if (e.op == kOpMoe && e.slot == -3)
        // The node dedup's gateway: rows forwarded in seq, the announced sum in waitedNs.
        snprintf(m, sizeof(m),
                 "rank %d: %s: internal error of MKERNEL_MOE_NODE_DEDUP=1: this rank forwarded "
                 "%llu token rows to rank %d as its node gateway and the count messages "
                 "announced %lld (the fan-out rows differ; MKERNEL_MOE_NODE_DEDUP=0 avoids it)",
                 n.rank, op, (unsigned long long)e.seq, e.peer, (long long)(int32_t)e.waitedNs);
      else if (e.op == kOpMoeCombine && e.slot == -4) {
        // The fused layer's combine found a peer's slot without its out rows (fused_ffn.cuh):
        // the caller's mistake.
        res = ncclInvalidUsage;
        snprintf(m, sizeof(m),
                 "rank %d: %s: rank %d ran this call on the sequential path while this rank ran "
                 "the fused kernel (every rank must pass the same algo, weight layout and "
                 "MKERNEL_MOE_SWIGLU_EPILOGUE)",
                 n.rank, op, e.peer);
      } else
        snprintf(m, sizeof(m), "rank %d: %s: protocol error with %s (lane %d, slot %d, value %llu)",
                 n.rank, op, who.c_str(), e.lane, e.slot, (unsigned long long)e.seq);
      break;
    default:
      snprintf(m, sizeof(m), "rank %d: %s (%s) failed with device error %u", n.rank, op,
               who.c_str(), e.kind);
  }
  *msg = m;
  return res;
}

bool poll(const ErrRecord* host, std::atomic<bool>* reported, const ErrNames& names,
          ncclResult_t* res, std::string* msg) {
  if (host == nullptr || __atomic_load_n(&host->valid, __ATOMIC_ACQUIRE) == 0) return false;
  if (reported->exchange(true)) return false;
  ErrRecord e;
  memcpy(&e, (const void*)host, sizeof(e));
  *res = describe(e, names, msg);
  MK_WARN("%s", msg->c_str());
  return true;
}

ncclResult_t domainCreate(int rank, Domain** out) {
  Domain* d = new Domain();
  d->rank = rank;
  ncclResult_t res = ncclSuccess;
  CUDACHECKGOTO(cudaGetDevice(&d->device), res, fail);
  NCCLCHECKGOTO(recordAlloc(&d->errHost, &d->errDev), res, fail);
  CUDACHECKGOTO(cudaMalloc(&d->hdr, sizeof(CtlHdr)), res, fail);
  CUDACHECKGOTO(cudaMemset(d->hdr, 0, sizeof(CtlHdr)), res, fail);
  CUDACHECKGOTO(cudaHostAlloc((void**)&d->abortHost, 64, cudaHostAllocMapped), res, fail);
  *d->abortHost = 0;
  CUDACHECKGOTO(cudaHostGetDevicePointer((void**)&d->abortDev, d->abortHost, 0), res, fail);
  *out = d;
  return ncclSuccess;
fail:
  domainDestroy(d);
  return res;
}

ncclResult_t domainDestroy(Domain* d) {
  if (d == nullptr) return ncclSuccess;
  recordFree(d->errHost);
  if (d->hdr) cudaFree(d->hdr);
  if (d->abortHost) cudaFreeHost(d->abortHost);
  delete d;
  return ncclSuccess;
}

void domainSetAbort(Domain* d, bool abort) {
  __atomic_store_n(d->abortHost, abort ? 1u : 0u, __ATOMIC_RELEASE);
}

WaitCtx domainCtx(const Domain* d, int32_t op, int64_t timeoutMs) {
  WaitCtx w{};
  w.abortFlag = d->abortDev;
  w.hdr = d->hdr;
  w.err = d->errDev;
  w.timeoutNs = timeoutMs > 0 ? (uint64_t)timeoutMs * 1000000ull : timeoutNs();
  w.rank = d->rank;
  w.op = op;
  return w;
}

ncclResult_t domainCheck(Domain* d, std::string* msg) {
  if (__atomic_load_n(&d->errHost->valid, __ATOMIC_ACQUIRE) == 0) return ncclSuccess;
  ErrRecord e;
  memcpy(&e, (const void*)d->errHost, sizeof(e));
  ErrNames names;
  names.rank = d->rank;
  std::string m;
  ncclResult_t res = describe(e, names, &m);
  if (!d->reported.exchange(true)) MK_WARN("%s", m.c_str());
  if (msg) *msg = m;
  return res;
}

ncclResult_t domainReset(Domain* d) {
  CUDACHECK(cudaDeviceSynchronize());
  CUDACHECK(cudaMemset(d->hdr, 0, sizeof(CtlHdr)));
  memset(d->errHost, 0, sizeof(ErrRecord));
  d->reported.store(false);
  return ncclSuccess;
}

}  // namespace rt
}  // namespace mk
