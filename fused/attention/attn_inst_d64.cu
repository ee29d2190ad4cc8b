// Instantiation unit: head dim 64, bf16 and fp16 inputs.
#include "fused/attention/attn_launch.cuh"

namespace mk {
namespace attn {
MK_ATTN_INSTANTIATE(64)
}  // namespace attn
}  // namespace mk
