// Instantiation unit of the fused ring-attention kernel: head dim 128, bf16 and fp16 inputs.
#include "fused/ops/ring_attn/fused_kernel.cuh"

namespace mk {
namespace fused {
// Variant 1 (MKERNEL_ATTN_D128_VARIANT, 176-key blocks) is compiled in fused_inst_d128_v1.cu.
MK_RING_ATTN_VARIANT(extern, 128, 1)
MK_RING_ATTN_INSTANTIATE(, 128)
}  // namespace fused
}  // namespace mk
