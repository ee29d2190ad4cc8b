// Instantiation unit: head dim 64, bf16 and fp16 inputs, both schedules, variant 0.
#include "fused/attention/attn_launch.cuh"

namespace mk {
namespace attn {
// Variants 1..4 (MKERNEL_ATTN_D64_VARIANT) are compiled in attn_inst_d64_v*.cu.
MK_ATTN_D64_VARIANT(extern, 1)
MK_ATTN_D64_VARIANT(extern, 2)
MK_ATTN_D64_VARIANT(extern, 3)
MK_ATTN_D64_VARIANT(extern, 4)
MK_ATTN_INSTANTIATE(64)
}  // namespace attn
}  // namespace mk
