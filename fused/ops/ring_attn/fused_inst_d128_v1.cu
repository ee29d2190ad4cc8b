// Instantiation unit of the fused ring-attention kernel: head dim 128,
// MKERNEL_ATTN_D128_VARIANT=1 (176-key blocks), bf16 and fp16 inputs, the overlapped schedule.
#include "fused/ops/ring_attn/fused_kernel.cuh"

namespace mk {
namespace fused {
MK_RING_ATTN_VARIANT(, 128, 1)
}  // namespace fused
}  // namespace mk
