// What every kernel knows about its comm (CommDev): the symmetric workspaces of the local
// peers, the channel counters and sticky state in device memory, the host-mapped error
// record, the abort flag and the wait deadline. The collectives' kernels and the net
// layer's kernels (transport/net_state.h: NetDev) both receive one, so it sits in the comm
// layer, below both.
#pragma once
#include <cstddef>
#include <cstdint>

#include "comm/workspace.h"

namespace mk {

// Channel counters and scratch of one comm, in device memory of comm->cudaDev (zeroed at
// init, never reset by the host). Counters are indexed [peer local index * lanes + lane].
struct DevStateHdr {
  uint64_t opCount;  // kernels completed on this comm (error records quote it)
  uint32_t failed;   // sticky: non-zero once any kernel of this comm recorded an error
  uint32_t ctaDone;  // last-CTA detection for opCount
  uint64_t pad[6];
};
// DevStateHdr is followed by uint64_t sendCnt[kMaxLocalRanks * kMaxLanes] and recvCnt[...].
inline size_t devStateBytes() {
  return sizeof(DevStateHdr) + 2 * sizeof(uint64_t) * kMaxLocalRanks * kMaxLanes;
}

// Error record in host-pinned, device-mapped memory: the kernel that first hits a timeout
// or the abort flag fills it (body first, then `valid` with a system-scope release);
// collPollAsyncError (the collectives' record) or netPollAsyncError (the net layer's)
// turns it into the comm's asynchronous error.
enum ErrCode : uint32_t { kErrNone = 0, kErrTimeout = 1, kErrAbort = 2, kErrProtocol = 3 };
struct ErrRecord {
  uint32_t valid;
  uint32_t code;       // ErrCode
  int32_t peer;        // local index of the peer waited for (-1: none)
  int32_t coll;        // CollType of the operation
  int32_t lane, slot;  // channel lane and slot of the wait
  int32_t waitSend;    // 1: waited for the peer to free a slot, 0: for the peer's data
  int32_t pad;
  uint64_t seq;      // channel message sequence number waited for
  uint64_t opCount;  // operations completed on this comm before the failing one
  uint64_t waitedNs;
};

// What every kernel needs to know about its comm.
struct CommDev {
  void* const* peers;  // [nLocal] workspace of every local rank (peerMem->peersDev)
  DevStateHdr* hdr;    // this comm's DevState
  uint64_t* sendCnt;   // [kMaxLocalRanks * kMaxLanes]: messages sent to (peer, lane)
  uint64_t* recvCnt;   // [kMaxLocalRanks * kMaxLanes]: messages received
  ErrRecord* err;      // device pointer of the host-mapped error record
  const volatile uint32_t* abortFlag;  // device pointer of comm->abortFlag
  uint64_t timeoutNs;                  // deadline of every wait (MKERNEL_TIMEOUT_MS)
  WsLayout ws;
  int me;      // local index of this rank
  int nLocal;  // local ranks: the peers of the channels (other nodes go through NetDev)
};

// MKERNEL_TIMEOUT_MS in nanoseconds (<= 0: practically infinite): CommDev::timeoutNs of
// every kernel, collective or net.
uint64_t devTimeoutNs();

}  // namespace mk
