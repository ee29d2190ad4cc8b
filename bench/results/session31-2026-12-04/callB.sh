#!/usr/bin/env bash
# Session 31, call B: which kernels cuBLAS (torch.matmul) and torch._grouped_mm run at the
# grouped GEMM's shapes (K 2048 -> N 1408; 16 x 8192 and 64 x 2048 rows) and at issue 12's
# 8192x8192x1024 and 8192^3 (ncu kernel names, grid and block); no build.
set -u
source scripts/gpu_call.sh
gc_init B
gc_run kernels 200 150 15 0 "^  [a-zA-Z_]|rror" ncu --metrics gpu__time_duration.sum python3 -c "
import torch
dev = 'cuda'
bf = torch.bfloat16
def mm(m, n, k):
    a = torch.randn(m, k, device=dev, dtype=bf)
    b = torch.randn(n, k, device=dev, dtype=bf)
    print('matmul', m, n, k, flush=True)
    for _ in range(2): a @ b.t()
    torch.cuda.synchronize()
def grouped(g, r, k, n):
    x = torch.randn(g * r, k, device=dev, dtype=bf)
    w = torch.randn(g, n, k, device=dev, dtype=bf)
    offs = torch.arange(1, g + 1, device=dev, dtype=torch.int32) * r
    print('grouped', g, r, k, n, flush=True)
    for _ in range(2): torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
    torch.cuda.synchronize()
mm(131072, 1408, 2048)
mm(8192, 8192, 1024)
mm(8192, 8192, 8192)
mm(131072, 2048, 7168)
grouped(16, 8192, 2048, 1408)
grouped(64, 2048, 2048, 1408)
grouped(32, 4096, 7168, 2048)
"
gc_tar
