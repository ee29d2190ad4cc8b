"""Runs torch._grouped_mm a few times at one shape so ncu can name its kernel, grid and block
(which tile the CUTLASS grouped kernel behind it uses, for issue 13's comparison)."""
import sys
import torch

g, r, k, n = (int(v) for v in sys.argv[1:5])
x = torch.randn(g * r, k, device="cuda", dtype=torch.bfloat16)
w = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)
offs = torch.arange(1, g + 1, device="cuda", dtype=torch.int32) * r
for _ in range(3):
  torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
torch.cuda.synchronize()
