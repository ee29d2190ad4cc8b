// Instantiation unit of the fused ring-attention kernel: head dim 64, MKERNEL_ATTN_D64_VARIANT=2
// (4 stages), bf16 and fp16 inputs, the overlapped schedule.
#include "fused/ops/ring_attn/fused_kernel.cuh"

namespace mk {
namespace fused {
MK_RING_ATTN_VARIANT(, 64, 2)
}  // namespace fused
}  // namespace mk
