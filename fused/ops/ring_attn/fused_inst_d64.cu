// Instantiation unit of the fused ring-attention kernel: head dim 64, bf16 and fp16 inputs.
#include "fused/ops/ring_attn/fused_kernel.cuh"

namespace mk {
namespace fused {
// Variants 1..3 (MKERNEL_ATTN_D64_VARIANT) are compiled in fused_inst_d64_v*.cu (4 is not
// built for the ring: attn::kMaxRingD64Variant).
MK_RING_ATTN_VARIANT(extern, 64, 1)
MK_RING_ATTN_VARIANT(extern, 64, 2)
MK_RING_ATTN_VARIANT(extern, 64, 3)
MK_RING_ATTN_INSTANTIATE(, 64)
}  // namespace fused
}  // namespace mk
