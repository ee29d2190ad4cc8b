// Instantiation unit: head dim 64, MKERNEL_ATTN_D64_VARIANT=2 (4 stages), bf16 and fp16 inputs,
// the overlapped schedule (Cfg, attn_kernel.cuh).
#include "fused/attention/attn_launch.cuh"

namespace mk {
namespace attn {
MK_ATTN_D64_VARIANT(, 2)
}  // namespace attn
}  // namespace mk
