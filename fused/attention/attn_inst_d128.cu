// Instantiation unit: head dim 128, bf16 and fp16 inputs.
#include "fused/attention/attn_launch.cuh"

namespace mk {
namespace attn {
MK_ATTN_INSTANTIATE(128)
}  // namespace attn
}  // namespace mk
