#!/usr/bin/env bash
# Session 56, call L (right after call K, same warm machine): where the new pipeline 4 (whole
# 128x192 units, ping-pong, D from registers) wins: bench_gemm_bench --pipelines over the default
# list and more small-K shapes, its 'ping192' column beside the default and cuBLAS-best.
set -u
source scripts/gpu_call.sh
gc_init L
gc_reuse /tmp/bd "gpu/test_gemm.cu;gpu/test_gemm_trace.cu;gpu/test_gemm_grouped.cu" \
  mk_gpu_tests bench_gemm_bench
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
gc_run small $((T + 150)) 150 30 1 "x.*engine  |pipeline|rror" $B --pipelines --reps 10 \
  --shapes 8192x28672x1024,4096x4096x1024,8192x8192x2048,2048x8192x1024,8192x8192x4096
gc_run list $((T + 400)) 250 30 1 "x.*engine  |pipeline|rror|geomean" $B --pipelines --reps 10
gc_tar
