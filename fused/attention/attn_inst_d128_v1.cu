// Instantiation unit: head dim 128, MKERNEL_ATTN_D128_VARIANT=1 (176-key blocks, 2 stages),
// bf16 and fp16 inputs, the overlapped schedule (Cfg, attn_kernel.cuh).
#include "fused/attention/attn_launch.cuh"

namespace mk {
namespace attn {
MK_ATTN_VARIANT(, 128, 1)
}  // namespace attn
}  // namespace mk
