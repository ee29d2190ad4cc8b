// The fused operators' view of a communicator, and how they are launched on it.
//
// A fused operator (fused/ops/<op>/) runs on an ncclComm like a collective:
//   - its waits use the comm's wait context (FusedComm::c.w): the comm's abort flag (the
//     word ncclCommAbort raises and the collectives poll), the comm's sticky failure word
//     and error record (the one ncclCommGetAsyncError reads), MKERNEL_TIMEOUT_MS;
//   - it reaches the ranks of its node through the comm's symmetric workspaces and channels
//     (FusedComm::c: peers, layout, device-resident channel counters; device/chan.cuh) and
//     the ranks of other nodes through the device communication API (FusedComm::net,
//     device/net/devcomm.cuh) when the comm spans nodes;
//   - it numbers its calls with device-resident counters (fused_dev.cuh: callSeq /
//     finishCall), so calls run back to back and replay in CUDA graphs without the host;
//   - it sizes its persistent grid from FusedComm::smBudget (SM count / ranks sharing the
//     GPU, with the collectives' overrides), never from a hard-coded SM count;
//   - it is launched through fusedEnqueue: the comm's enqueue path (stream order with the
//     comm's other operations, CUDA graph capture, completion tracked for finalize, refusal
//     once the comm has failed).
#pragma once
#include <cstdint>
#include <functional>
#include <cuda_runtime.h>
#include <nccl.h>

#include "coll/coll.h"  // SizedUnits
#include "comm/comm_dev.h"
#include "device/rt/err.h"
#include "transport/net_state.h"

struct ncclComm;

namespace mk {
namespace fused {

// Call counters, one per fused ErrOp (rt::kOpFusedFirst ..).
constexpr int kSeqSlots = kDevSeqSlots;
static_assert(rt::kOpFusedEnd - rt::kOpFusedFirst <= kSeqSlots, "a call counter per fused op");

// Passed by value to fused kernels (every pointer is a device pointer).
struct FusedComm {
  CommDev c;      // wait context, local workspaces, channel counters (c.w.op: this operator)
  uint64_t* seq;  // [kSeqSlots] completed calls per operator, device memory, never reset
  int32_t rank, nRanks;
  int32_t cudaDev;
  int32_t smBudget;  // CTAs one launch of this rank may use at once
  int32_t hasNet;    // the comm spans (virtual) nodes: `net` is valid
  NetDev net;
};

// The operator's counter of completed calls (device memory). Flags published relative to
// it (GemmHooks::seqBase) carry the call number, so graph replays publish new values.
MK_HD inline uint64_t* fusedCallCounter(const FusedComm& f) {
  return f.seq + (f.c.w.op - rt::kOpFusedFirst);
}

// SMs for a stand-alone GEMM of a sequential path (MKERNEL_SEQ_GEMM_SMS; gemm::GemmArgs::
// smBudget, 0 = all). Such a GEMM waits for no peer, so unlike the fused kernels it needs no
// share of the GPU to stay deadlock-free when ranks share it; a full grid runs the ranks'
// GEMMs nearly one after the other, each with the whole L2, as cuBLAS's do.
int32_t seqGemmBudget(const FusedComm& f);
// The same for a comm without its FusedComm view (the ring attention's sequential kernel).
int32_t seqGemmBudget(const ncclComm* comm);

// SMs of this rank's share of its GPU for the grid of a fused kernel whose ranks wait for each
// other: smCount / the most ranks that any live comm of this process put on this GPU (at least
// this comm's own). A comm split from a larger one (PyTorch subgroups) runs beside its siblings:
// sized for its own ranks alone, the siblings' kernels together can ask for more SMs than the
// GPU has, and a rank whose kernel cannot become resident leaves its peers waiting until the
// timeout (session 31: the MoE layer on subgroup pairs). The count is this process's (its comm
// registry): use it for what stays private to the rank, its grid, never for a verdict every rank
// must share (ranks in other processes may count otherwise).
int32_t fusedGpuShare(const ncclComm* comm);
// smCount / this comm's own ranks on the GPU (at least 1): the rank's own share, for grids.
// Ranks on other GPUs may count otherwise (more ranks on theirs, fewer SMs).
int32_t fusedOwnShare(const ncclComm* comm);
// The least share of a GPU among the comm's ranks (Topo::leastShare, from the allgathered rank
// infos; fusedOwnShare where it was not computed): what every rank of the comm counts alike,
// for verdicts the ranks must share.
int32_t fusedLeastShare(const ncclComm* comm);

// The view of `comm` for operator `op` (an rt::ErrOp of a fused operator). Needs a comm
// that finished its init; ncclInvalidArgument otherwise.
ncclResult_t fusedCommView(ncclComm* comm, int32_t op, FusedComm* out);

// Runs `launch(stream)` as one operation of `comm` on the user's `stream`: ordered after the
// comm's earlier operations (whatever stream they used), capturable, awaited by
// ncclCommFinalize, refused with the comm's error once it has failed. Refused inside
// ncclGroupStart/End. `api` names the call in messages. `continuation`: a later kernel of a
// call already under way (coll/coll.h, collEnqueueFn), launched despite an error the call's
// earlier kernel reported, so that its peers do not wait for it in vain.
ncclResult_t fusedEnqueue(ncclComm* comm, cudaStream_t stream, const char* api,
                          const std::function<ncclResult_t(cudaStream_t)>& launch,
                          bool continuation = false);

// scratchFree(scratch) on `stream` (nothing for NULL): stream-ordered, so after the call's
// kernels even when one of its enqueues failed. Returns res, or the free's error (named with
// `api`) if res was a success.
ncclResult_t fusedFreeScratch(void* scratch, cudaStream_t stream, ncclResult_t res,
                              const char* api);

// One of mkernel's collectives (no reduction: AllGather, AlltoAll, ...) as a step of a fused
// operator's sequential path on `stream`: checked like the public call (messages name `api`),
// then enqueued with the comm's other operations.
ncclResult_t fusedCollective(ncclComm* comm, cudaStream_t stream, int collType, const void* send,
                             void* recv, size_t count, ncclDataType_t dtype, const char* api);

// An AlltoAll of blocks of at most count elements that moves only what `u` says where the
// path can (the copy engine inside a node, the channel engine across nodes); elsewhere (zero-
// copy on registered memory, one rank) whole blocks.
ncclResult_t fusedAlltoAllSized(ncclComm* comm, cudaStream_t stream, const void* send, void* recv,
                                size_t count, ncclDataType_t dtype, const SizedUnits& u,
                                const char* api);

}  // namespace fused
}  // namespace mk
