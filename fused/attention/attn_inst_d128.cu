// Instantiation unit: head dim 128, bf16 and fp16 inputs, both schedules, variant 0.
#include "fused/attention/attn_launch.cuh"

namespace mk {
namespace attn {
// Variant 1 (MKERNEL_ATTN_D128_VARIANT) is compiled in attn_inst_d128_v1.cu.
MK_ATTN_VARIANT(extern, 128, 1)
MK_ATTN_INSTANTIATE(128)
}  // namespace attn
}  // namespace mk
