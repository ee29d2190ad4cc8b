// Device memory that the local ranks of one comm share when they all live in this process on
// one GPU (threads or one thread driving several ranks): each fused operator keeps its
// handshake slots, call counters and flags there, and a rank's kernel reads its peers'
// entries directly (one address space).
#pragma once
#include <cstddef>
#include <cuda_runtime.h>
#include <nccl.h>

struct ncclComm;

namespace mk {
namespace fused {

// One block per operator family.
enum CliqueTag : int {
  kCliqueGemmColl = 0,
  kCliqueMoe = 1,
  kCliqueMoeCombine = 2,
  kCliqueRingAttn = 3,
  kCliqueTags = 4
};

// Whether comm's ranks are all in this process, on one GPU and one (virtual) node, at most
// `maxLocal` of them.
bool cliqueEligible(const ncclComm* comm, int maxLocal);

// The block `tag` of comm's ranks (created zeroed, `bytes` long, by the first of them to ask,
// on comm's device; one per (commHash, tag) in this process). Creation allocates device
// memory: outside stream capture only (ncclInvalidUsage with a message during capture).
ncclResult_t cliqueBlockGet(ncclComm* comm, CliqueTag tag, size_t bytes, void** out);
// Whether comm already holds block `tag` (a captured call can use it).
bool cliqueBlockHeld(const ncclComm* comm, CliqueTag tag);
// cliqueBlockGet for a call issued on `stream`: while the stream is being captured, only a
// block comm already holds (creating one allocates and synchronises); otherwise
// ncclInvalidUsage with a message naming `api`.
ncclResult_t cliqueBlockForCall(ncclComm* comm, CliqueTag tag, size_t bytes, cudaStream_t stream,
                                const char* api, void** out);
// Drops every block reference of comm (at comm destruction); a block is freed with its last.
void cliqueBlocksRelease(ncclComm* comm);

}  // namespace fused
}  // namespace mk
