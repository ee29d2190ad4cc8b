// The one error record of every device-side failure (collectives, the device communication
// API, fused operators) and the context every bounded wait needs. Plain data: kernels get
// it by value, the host reads the record from host-pinned mapped memory.
//
// Protocol. A wait that gives up (deadline, abort flag) elects the comm's first failure
// with a device-scope CAS on the sticky `failed` word of its control header (CtlHdr), fills
// the record, then releases `valid` at system scope; the host reads `valid` with acquire
// and turns the record into the comm's asynchronous error (err_host.h). Every later wait of
// the comm sees `failed` and leaves without writing. Kernels never trap.
#pragma once
#include <cstdint>

namespace mk {
namespace rt {

// What went wrong.
enum ErrKind : uint32_t {
  kErrNone = 0,
  kErrTimeout = 1,     // a wait passed its deadline (MKERNEL_TIMEOUT_MS)
  kErrAbort = 2,       // the comm's abort flag was raised (ncclCommAbort, revoke)
  kErrProtocol = 3,    // a peer's flag or message made no sense (a broken invariant)
  kErrPeerFailed = 4,  // the comm already failed elsewhere: this wait leaves, writes nothing
  kErrOverflow = 5,    // more data than the caller's bound (MoE: tokens received)
  kErrProxy = 6,       // the proxy thread stopped (its own error, or netAbort)
  kErrArgs = 7,        // bad arguments given to a device API call
};

// The operation that failed. Collectives keep CollType's order (coll/coll.h checks it).
enum ErrOp : int32_t {
  kOpAllReduce = 0,
  kOpBroadcast = 1,
  kOpReduce = 2,
  kOpAllGather = 3,
  kOpReduceScatter = 4,
  kOpAlltoAll = 5,
  kOpGather = 6,
  kOpScatter = 7,
  kOpSend = 8,
  kOpRecv = 9,
  // the device communication API (device/net/devcomm.cuh)
  kOpPut = 16,
  kOpPutSignal = 17,
  kOpSignal = 18,
  kOpWaitSignal = 19,
  kOpQuiet = 20,
  // fused operators (fused/ops/<op>) and the GEMM engine's own hooks
  kOpGemm = 32,  // engine: producer waiting for "rows ready"
  kOpExample = 33,
  kOpGemmAllReduce = 34,
  kOpAllGatherGemm = 35,
  kOpGemmReduceScatter = 36,
  kOpMoe = 37,
  kOpRingAttention = 38,
  kOpMoeCombine = 39,
};
constexpr int32_t kOpFusedFirst = kOpGemm;
constexpr int32_t kOpFusedEnd = kOpMoeCombine + 1;

// What the failing wait was waiting for.
enum ErrWait : int32_t {
  kWaitNone = 0,    // no wait (argument errors)
  kWaitData = 1,    // a peer's message (its ready flag)
  kWaitSlot = 2,    // a peer to free a channel slot (its consumed flag)
  kWaitSignal = 3,  // a signal slot to reach a value
  kWaitRing = 4,    // a free command slot in the proxy ring
  kWaitStage = 5,   // a free staging slot (the proxy still sends its previous data)
  kWaitQuiet = 6,   // the proxy to complete every command issued so far
  kWaitFlag = 7,    // a flag written by another role of the same rank (tile, rows)
};

enum ErrFlags : uint32_t {
  kErrPeerLocal = 1,  // `peer` is an index among the node's local ranks, not a comm rank
};

// In host-pinned, device-mapped memory (err_host.h allocates them). 64 bytes.
struct ErrRecord {
  uint32_t valid;  // 1 once the body below is written (system-scope release, written last)
  uint32_t kind;   // ErrKind
  int32_t op;      // ErrOp
  int32_t rank;    // comm rank that recorded it
  int32_t peer;    // the rank waited for (-1: none); see kErrPeerLocal
  int32_t lane;    // channel lane, or the CTA
  int32_t slot;    // channel slot, signal slot or flag index
  int32_t wait;    // ErrWait
  uint32_t flags;  // ErrFlags
  uint32_t pad;
  uint64_t seq;       // value waited for (kErrArgs: the destination offset)
  uint64_t opCount;   // kernels completed on this comm before the failing one
  uint64_t waitedNs;  // time spent waiting (kErrArgs: the byte count)
};
static_assert(sizeof(ErrRecord) == 64, "ErrRecord layout");

// Sticky control words of one failure domain (a comm's collectives, its net layer), in
// device memory, zeroed once and never reset by the host.
struct CtlHdr {
  uint64_t opCount;  // kernels completed (error records quote it)
  uint32_t failed;   // sticky: the ErrKind of the first failure, 0 while none
  uint32_t ctaDone;  // last-CTA detection for opCount
  uint64_t pad[6];
};
static_assert(sizeof(CtlHdr) == 64, "CtlHdr layout");

// Everything a bounded wait needs (wait.cuh). Built on the host by the owner of the domain.
struct WaitCtx {
  const volatile uint32_t* abortFlag;  // host-mapped; non-zero = abort (comm->abortFlagDev)
  CtlHdr* hdr;                         // sticky failure word + opCount
  ErrRecord* err;                      // device pointer of the host-mapped record
  uint64_t timeoutNs;                  // deadline of every wait (errTimeoutNs())
  int32_t rank;                        // recorded as ErrRecord::rank
  int32_t op;                          // ErrOp recorded by waits that name none
};

}  // namespace rt
}  // namespace mk
