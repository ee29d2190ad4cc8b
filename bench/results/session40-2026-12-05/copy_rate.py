"""Copy-engine against SM copy rate for one rank's k/v at 16K (32 MB), alone on the GPU.

Session 40's reading of the staged ring attention (two buffers gained nothing) was that one
cudaMemcpyAsync runs at one copy engine's rate; this measures it. torch's copy_ of a
contiguous tensor of the same dtype on the same device is a cudaMemcpyAsync (copy engine);
torch.add(x, 0) is an elementwise kernel on the SMs (reads and writes the same bytes).
Prints GB/s of bytes copied (not counting the read twice).
"""
import torch

n = 32 << 20  # bytes: one rank's k and v at 16K total, 4 ranks, 16 kv heads, d 128, bf16
a = torch.randn(n // 2, dtype=torch.bfloat16, device="cuda")
b = torch.empty_like(a)
zero = torch.zeros((), dtype=torch.bfloat16, device="cuda")


def rate(fn, reps=50):
  for _ in range(5):
    fn()
  s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  s.record()
  for _ in range(reps):
    fn()
  e.record()
  e.synchronize()
  ms = s.elapsed_time(e) / reps
  return ms, n / (ms * 1e-3) / 1e9


ce_ms, ce_gbs = rate(lambda: b.copy_(a))
sm_ms, sm_gbs = rate(lambda: torch.add(a, zero, out=b))
print("copy_rate: 32 MB copy engine %.1f us (%.0f GB/s), SM kernel %.1f us (%.0f GB/s)" %
      (ce_ms * 1e3, ce_gbs, sm_ms * 1e3, sm_gbs))
