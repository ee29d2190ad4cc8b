#!/usr/bin/env bash
# Session 31, call A: grouped GEMMs on the ping-pong consumers (pipeline 3), whose WG1 skips a
# last column tile's empty half (N % 256 in 1..128: N 1408 computes 1/12 zeros on the other
# pipelines). The grouped and ping-pong GEMM tests, the grouped default / wide / ping-pong side
# by side (bench_gemm_bench --pipelines), then the grouped GEMM against torch._grouped_mm with
# MKERNEL_GEMM_GROUP_PING 0 and 1 alternating; last, which cuBLAS kernel torch runs at
# 8192x8192x1024 (issue 12's shape), from ncu's kernel names.
set -u
source scripts/gpu_call.sh
gc_init A
GC_BUILD_S=300 gc_build /tmp/ba "gpu/test_gemm_grouped.cu;gpu/test_gemm.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/ba 'GemmGrouped*:GemmCorrectness.PingPong*' 330 120
for g in 16 64; do
  gc_run "pipes_g$g" 380 60 15 1 "grouped|rror" /tmp/ba/bench/bench_gemm_bench --groups $g \
    --shapes 131072x1408x2048 --pipelines --reps 10
done
S="16:8192:2048:1408,64:2048:2048:1408"
i=0
for ping in 0 1 0 1; do
  i=$((i + 1))
  MKERNEL_GEMM_GROUP_PING=$ping gc_run "grouped${i}_p$ping" 540 50 15 0 "^\| [0-9]|rror" \
    python3 bench/grouped_bench.py --build /tmp/ba --out "$GC_L/g_p$ping" --shapes "$S" --rounds 2
done
gc_run cublas_k1024 585 40 15 0 "nvjet|sm90|gemm|Kernel|rror" ncu --metrics gpu__time_duration.sum \
  python3 -c "
import torch
a = torch.randn(8192, 1024, device='cuda', dtype=torch.bfloat16)
b = torch.randn(8192, 1024, device='cuda', dtype=torch.bfloat16)
for _ in range(2): c = a @ b.t()
torch.cuda.synchronize()"
gc_tar
