// MKERNEL_FUSED_TRACE's stamp buffers, shared by the fused kernels that trace (the GEMM +
// collective kernels, the MoE kernel across nodes): each CTA writes up to kTraceMaxWords
// %globaltimer stamps or counters into mapped host memory, and a host function queued behind
// the kernel prints a summary. Host functions may not call CUDA, so a buffer goes back to a
// process-wide pool (zeroed in host code) instead of being freed.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace mk {
namespace fused {

constexpr int kTraceMaxCtas = 4096;
constexpr int kTraceMaxWords = 8;  // words per CTA a buffer holds

// A zeroed buffer of kTraceMaxCtas * kTraceMaxWords words for a launch of `grid` CTAs; null
// when MKERNEL_FUSED_TRACE is 0, the grid is wider than a buffer, the launch is being captured
// (a replay would print nothing useful), or mapped memory cannot be had.
uint64_t* traceAcquire(int grid, bool capturing);
// Back to the pool, zeroed; no CUDA call (safe in a host function).
void traceRelease(uint64_t* stamps);
// Back to the pool once `stream` reaches this point (kernels queued before may still write the
// stamps); kept out of the pool for good when that cannot be queued.
void traceReleaseAfter(cudaStream_t stream, uint64_t* stamps);
// Queues print(arg) on `stream` behind the kernel that writes `stamps`. print owns arg and
// must release the stamps; when the host function cannot be queued, false is returned (the
// caller deletes arg) and the stamps stay out of the pool (the kernel may still write them).
bool traceQueue(cudaStream_t stream, cudaHostFn_t print, void* arg, uint64_t* stamps);

}  // namespace fused
}  // namespace mk
