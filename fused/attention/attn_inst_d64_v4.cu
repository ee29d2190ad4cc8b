// Instantiation unit: head dim 64, MKERNEL_ATTN_D64_VARIANT=4 (three consumer warpgroups, 192-row
// tiles), bf16 and fp16 inputs, the overlapped schedule (Cfg, attn_kernel.cuh).
#include "fused/attention/attn_launch.cuh"

namespace mk {
namespace attn {
MK_ATTN_D64_VARIANT(, 4)
}  // namespace attn
}  // namespace mk
