#!/usr/bin/env bash
# Session 56, call K (issue 12): pipeline 4 rebuilt as a ping-pong over whole 128x192 units
# (gemm_pingunit.cuh: each consumer warpgroup every other unit of its CTA, 5 stages of 40 KB,
# D stored from registers), modelled on cuBLAS's fastest kernel at 8192x8192x1024 (a ping-pong
# of 176-column units, 5 stages). First its GPU tests (every element against fp64), then
# bench_gemm_bench --pipelines (its 'ping192' column) beside the default and cuBLAS.
set -u
source scripts/gpu_call.sh
gc_init K
GC_BUILD_S=330 gc_build /tmp/bd "gpu/test_gemm.cu;gpu/test_gemm_trace.cu;gpu/test_gemm_grouped.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tar
T=$(gc_el)
gc_tests /tmp/bd '*PingPong192*:GemmSmall.*:*InPlaceBeta*:*BothPipelines*:GemmTrace.*' \
  $((T + 90)) 90
B=/tmp/bd/bench/bench_gemm_bench
gc_run pp $((T + 240)) 150 30 1 "x.*engine  |ping|pipeline|rror|trace|tile" $B --pipelines --trace \
  --shapes 8192x8192x1024,8192x8192x512,16384x8192x1024 --reps 10
gc_tar
