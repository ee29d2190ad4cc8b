// Host side of one kernel launch: turning NCCL calls into kernel arguments (plan) and
// issuing them on a stream (run). No synchronisation, no waiting on peers.
#pragma once
#include <cuda_runtime.h>
#include <memory>
#include <nccl.h>
#include <vector>

#include "coll/coll.h"
#include "coll/launch.h"

struct ncclComm;

namespace mk {

struct KernelLaunch {
  // kMemcpy: a one-rank comm, where every operation but a PreMulSum is a copy from the
  // send to the receive buffer (one small kernel).
  enum Kind { kReduce, kCopySmall, kCopyLarge, kMemcpy, kZcCopy } kind = kReduce;
  CollType coll = CollType::kAllReduce;
  ReduceArgs red{};
  ZcCopyArgs zc{};
  std::unique_ptr<CopyArgsSmall> small;
  std::unique_ptr<CopyArgsLarge> large;
  const void* mcSrc = nullptr;  // kMemcpy
  void* mcDst = nullptr;
  size_t mcBytes = 0;
  int grid = 1;
  size_t smem = 0;
  // In-place AlltoAll: the send buffer is staged into a stream-ordered temporary before
  // the kernel (receives overwrite blocks that are still being sent).
  const char* stageBase = nullptr;
  size_t stageBytes = 0;
};

// MKERNEL_ALGO, parsed (warns once about an unknown value).
Algo collForcedAlgo();
// Plans one collective (not Send/Recv). *empty: nothing to launch (count 0).
ncclResult_t planColl(ncclComm* comm, const CollArgs& a, KernelLaunch* out, bool* empty);
// Plans all Send/Recv of one comm in one group (issue order), as one copy-engine launch.
ncclResult_t planP2p(ncclComm* comm, const std::vector<CollArgs>& ops, KernelLaunch* out,
                     bool* empty);
// Issues the launch (and the staging, if any) on stream s.
ncclResult_t runLaunch(ncclComm* comm, KernelLaunch& l, cudaStream_t s);

}  // namespace mk
