// Types shared by the host and device halves of every fused operator: roles, the SM split,
// the error record and the wait context. Plain structs so they can live in kernel params
// and in host-mapped memory.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>  // __host__ __device__

namespace mk {
namespace fused {

// What a CTA of a fused persistent kernel does. CTAs are laid out in this order:
// [compute | intra-node comm | inter-node send | inter-node reduce].
enum class Role : int32_t {
  kCompute = 0,
  kIntraComm = 1,
  kInterSend = 2,
  kInterReduce = 3,
  kCount = 4,
};
constexpr int kNumRoles = static_cast<int>(Role::kCount);

const char* roleName(Role r);

struct SmSplit {
  int32_t count[kNumRoles] = {0, 0, 0, 0};
  __host__ __device__ int32_t of(Role r) const { return count[static_cast<int>(r)]; }
  __host__ __device__ int32_t total() const { return count[0] + count[1] + count[2] + count[3]; }
  __host__ __device__ int32_t commTotal() const { return count[1] + count[2] + count[3]; }
  // Role of CTA `cta` and its index among the CTAs of that role.
  __host__ __device__ Role roleOf(int32_t cta, int32_t* idx) const {
    int32_t base = 0;
    for (int r = 0; r < kNumRoles; ++r) {
      if (cta < base + count[r]) {
        *idx = cta - base;
        return static_cast<Role>(r);
      }
      base += count[r];
    }
    *idx = -1;
    return Role::kCount;
  }
};

enum ErrorCode : int32_t {
  kErrNone = 0,
  kErrTimeout = 1,  // a wait passed its deadline (MKERNEL_TIMEOUT_MS)
  kErrAbort = 2,    // the host raised the abort flag (ncclCommAbort)
  kErrPeer = 3,     // another CTA already failed; this one stopped early
};

enum OpId : int32_t {
  kOpGemm = 1,             // engine: producer waiting for "rows ready"
  kOpExampleGemmCopy = 2,  // the framework demo (fused/core/example_gemm_copy)
  kOpGemmAllReduce = 10,
  kOpAllGatherGemm = 11,
  kOpGemmReduceScatter = 12,
};

// Written by the device into host-mapped memory on timeout or abort. The first failing
// thread claims it (atomicCAS on `claimed`), writes the body, then releases `code` at
// system scope: the host reads `code` first and the body only when it is non-zero.
struct ErrorRecord {
  uint32_t claimed;
  int32_t code;
  int32_t rank;
  int32_t peer;
  int32_t op;
  int32_t slot;
  uint64_t seq;
};

// Everything a device wait loop needs to be bounded. Built on the host by makeWaitCtx().
struct WaitCtx {
  const volatile uint32_t* abortFlag = nullptr;  // host-mapped; non-zero = abort
  ErrorRecord* err = nullptr;                    // host-mapped (device pointer)
  uint64_t timeoutCycles = 0;                    // 0 = use kDefaultTimeoutCycles
  int32_t rank = 0;
  int32_t op = 0;
};

}  // namespace fused
}  // namespace mk
