// Instantiation unit of the fused ring-attention kernel: head dim 128, bf16 and fp16 inputs.
#include "fused/ops/ring_attn/fused_kernel.cuh"

namespace mk {
namespace fused {
MK_RING_ATTN_INSTANTIATE(, 128)
}  // namespace fused
}  // namespace mk
