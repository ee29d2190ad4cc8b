// Host side of the collectives: argument checks, enqueue, per-comm collective state.
#pragma once
#include <cstddef>
#include <functional>
#include <cuda_runtime.h>
#include <nccl.h>

#include "coll/redop.h"
#include "comm/workspace.h"  // MK_HD

struct ncclComm;

namespace mk {

enum class CollType : int {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAlltoAll,
  kGather,
  kScatter,
  kSend,
  kRecv,
  kCount
};
const char* collName(CollType t);

// Device-sized AlltoAll: the block for rank q moves max(0, units[q * stride]) * unitBytes
// bytes, at most its planned size, read when the kernel runs, so its size need not be known
// to the host. units[0] sizes the blocks this rank sends (and its copy to itself), units[1]
// those it receives: rank p's units[1][q] must equal rank q's units[0][p] (both ends cut the
// same chunks). Paths that cannot size on the device move whole blocks: the same bytes where
// the units say, the rest unspecified.
struct SizedUnits {
  const int32_t* units[2] = {nullptr, nullptr};
  uint64_t unitBytes = 0;
  uint32_t stride = 0;
  MK_HD bool on() const { return units[0] != nullptr && units[1] != nullptr; }
  // Bytes of rank's block (recv: a block this rank receives), at most planned. The counts are
  // written by earlier kernels of the stream and stay fixed while this one runs. The select,
  // not an index, keeps kernel parameters out of local memory.
  MK_HD uint64_t bytes(bool recv, int rank, uint64_t planned) const {
    const int32_t n = (recv ? units[1] : units[0])[(uint64_t)rank * stride];
    if (n <= 0) return 0;
    const uint64_t b = (uint64_t)n * unitBytes;
    return b < planned ? b : planned;
  }
};

struct CollArgs {
  CollType type;
  const void* sendbuff;
  void* recvbuff;
  size_t count;  // NCCL's count for this collective (per rank for AllGather etc.)
  ncclDataType_t dtype;
  ncclRedOp_t op;  // ncclSum for collectives without a reduction
  int root;        // root for rooted collectives, peer for send/recv, -1 otherwise
  ncclComm* comm;
  cudaStream_t stream;
  // The reduction, resolved by collCheckArgs at call time: a PreMulSum destroyed right after
  // the call (even inside a group, before ncclGroupEnd) must still apply.
  RedOpInfo red{};
  SizedUnits sized{};  // AlltoAll of mkernel's fused operators only (never the NCCL API)
};

size_t dtypeSize(ncclDataType_t t);  // 0 for an invalid type
// Every check that needs no CUDA call: comm handle and state, dtype, op (built-in or a
// PreMulSum created on this comm for this dtype), root/peer range, count * size overflow,
// null buffers with a non-zero count. ncclInvalidArgument + message on failure. Fills a.red.
ncclResult_t collCheckArgs(CollArgs& a, const char* api);

// Runs (or, inside ncclGroupStart/End, records) one operation.
ncclResult_t collEnqueue(const CollArgs& a);
// Runs `launch(exec)` as one operation of comm issued on `stream` (a fused operator,
// fused/core/fused_comm.h): ordered with the comm's other operations, capturable, tracked
// for finalize, refused once the comm has failed and inside ncclGroupStart/End.
// `continuation`: a later kernel of a call whose first kernel was already enqueued (the MoE
// combine after its dispatch): run even if that first kernel has since reported an error, so
// that the peers waiting for this rank's part of the call are not left to time out.
ncclResult_t collEnqueueFn(ncclComm* comm, cudaStream_t stream, const char* api,
                           const std::function<ncclResult_t(cudaStream_t)>& launch,
                           bool continuation = false);

// Per-comm collective state, created after peer memory; fini frees it.
ncclResult_t collInit(ncclComm* comm);
ncclResult_t collFini(ncclComm* comm);
// Waits (bounded by MKERNEL_TIMEOUT_MS, abortable) for every operation issued on the comm.
ncclResult_t collFinalize(ncclComm* comm);
// Whether a kernel of the comm may still run: collFinalize gave up on it, or it has not
// completed now. Teardown then leaks what such a kernel may read instead of freeing it.
bool collMayBeRunning(ncclComm* comm);
// Turns a device-side error record (timeout, abort, peer failure) into the comm's async
// error with a message naming rank, peer and operation. Non-blocking.
ncclResult_t collPollAsyncError(ncclComm* comm);

}  // namespace mk
