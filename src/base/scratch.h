// Stream-ordered scratch memory of the library's calls (staged collectives, the fused
// operators' temporaries), from a memory pool of the library rather than the device's
// default pool.
//
// Why: the default pool keeps nothing across a synchronisation (its release threshold is
// 0), so every torch.cuda.synchronize() or cudaStreamSynchronize between two calls hands
// the scratch back to the driver and the next call maps it again: milliseconds for the
// gigabytes a large MoE layer stages, more than the layer's own work at small batch counts.
// The library's pool keeps up to MKERNEL_SCRATCH_KEEP_MB (default: a quarter of the GPU's
// memory) across synchronisations, gives everything unused back when an allocation would
// fail (then retries) and when a comm of the device is destroyed. Changing the default
// pool's threshold instead would change the application's own cudaMallocAsync behaviour.
//
// Under stream capture the allocation becomes a graph memory node (owned by the graph, not
// the pool), exactly as cudaMallocAsync's would.
#pragma once
#include <cstddef>
#include <cuda_runtime.h>
#include <nccl.h>

namespace mk {

// bytes on GPU dev (the comm's: not the current device, which a caller may have changed),
// ordered on s; *p is null for 0 bytes.
ncclResult_t scratchAlloc(void** p, size_t bytes, int dev, cudaStream_t s);
// Frees p (may be null) ordered on s: reusable by later work of the pool after s reaches it.
ncclResult_t scratchFree(void* p, cudaStream_t s);
// Releases the memory the pool of dev holds but no allocation uses (best effort, no error).
void scratchTrim(int dev);
// Bytes the pool of dev holds from the driver now (0 without a pool): logs and tests.
size_t scratchReserved(int dev);

}  // namespace mk
