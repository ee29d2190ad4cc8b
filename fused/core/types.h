// Types shared by the host and device halves of every fused operator: roles and the SM
// split. Plain structs so they can live in kernel params. (The error record and the wait
// context are the device runtime's: device/rt/err.h.)
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

}  // namespace fused
}  // namespace mk
