// Host side of the device error record (err.h): where records live, the one poller that
// turns a record into (ncclResult_t, message naming rank, peer and op) for
// ncclCommGetAsyncError, and a failure domain not tied to a comm (the GEMM engine's own
// tests). The collectives (coll/coll_state.cc), the net layer (transport/net_state.cc) and
// the fused operators (through the comm's collective record) all report through poll().
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>
#include <nccl.h>

#include "device/rt/err.h"

namespace mk {
namespace rt {

// MKERNEL_TIMEOUT_MS in nanoseconds (<= 0: practically infinite), read at every call, so
// that a change of the parameter applies to the next launch.
uint64_t timeoutNs();

// Records live in host-pinned mapped blocks that are never freed: freeing pinned memory
// synchronises the whole device, which a destroy or abort must not wait for (another
// comm's kernel may be waiting for a peer). Freed records are zeroed and reused.
ncclResult_t recordAlloc(ErrRecord** host, ErrRecord** dev);
void recordFree(ErrRecord* host);

const char* opName(int32_t op);

// How to name things in a message.
struct ErrNames {
  int rank = -1;                    // this rank (comm rank)
  const int* localRanks = nullptr;  // comm rank of each local index (kErrPeerLocal records)
  int nLocal = 0;
  const char* proxyMsg = "";  // the proxy's own error, when it stopped
  int64_t timeoutMs = -1;     // quoted in timeout messages; -1: MKERNEL_TIMEOUT_MS
  // Appended to timeouts that blame a peer whose entry in hintPeers (indexed by comm rank) is
  // non-zero: ncclComm::queueHint and Topo::inMyProcess (the peers that share this process's
  // queues).
  const char* hint = "";
  const uint8_t* hintPeers = nullptr;
  int nHintPeers = 0;
  // Both pollers' way to fill the three above (the strings must outlive the names).
  void setHint(const std::string& h, const std::vector<uint8_t>& peers) {
    hint = h.c_str();
    hintPeers = peers.data();
    nHintPeers = (int)peers.size();
  }
};
// The result code and message of a record.
ncclResult_t describe(const ErrRecord& e, const ErrNames& names, std::string* msg);
// Non-blocking: true exactly once per record (`reported` remembers), once the device has
// published it, with its result code and message (also logged as a warning).
bool poll(const ErrRecord* host, std::atomic<bool>* reported, const ErrNames& names,
          ncclResult_t* res, std::string* msg);

// A failure domain of its own: record, control header (device memory) and abort word
// (host-mapped). For code that runs device waits without a comm (the GEMM engine's tests);
// operators on a comm use the comm's (fused/core/fused_comm.h).
struct Domain {
  int rank = 0;
  int device = 0;
  ErrRecord* errHost = nullptr;
  ErrRecord* errDev = nullptr;
  CtlHdr* hdr = nullptr;
  uint32_t* abortHost = nullptr;
  uint32_t* abortDev = nullptr;
  std::atomic<bool> reported{false};
};
ncclResult_t domainCreate(int rank, Domain** out);  // on the current device
ncclResult_t domainDestroy(Domain* d);
// Raises (or clears) the abort flag; waits notice within kSpinCheck spins.
void domainSetAbort(Domain* d, bool abort);
// Wait context for `op`; timeoutMs > 0 overrides MKERNEL_TIMEOUT_MS.
WaitCtx domainCtx(const Domain* d, int32_t op, int64_t timeoutMs = 0);
// ncclSuccess while nothing failed; else the record's result code and message.
ncclResult_t domainCheck(Domain* d, std::string* msg);
// Forgets a failure once every kernel of the domain has finished (synchronous).
ncclResult_t domainReset(Domain* d);

}  // namespace rt
}  // namespace mk
