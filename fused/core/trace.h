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
// Queues print(arg) on `stream` behind the kernel that writes `stamps`. print owns arg and
// must release the stamps; when the host function cannot be queued, the stamps are released
// and false is returned (the caller deletes arg).
bool traceQueue(cudaStream_t stream, cudaHostFn_t print, void* arg, uint64_t* stamps);

}  // namespace fused
}  // namespace mk
