#!/usr/bin/env bash
# Prepared in session 49 for the next session (its first run, BK, was cut in the build at 200 s): is the engine's k-step slower in short tiles? Traces
# (static walk, pipeline 0 = the carried epilogue) of 8192x8192xK at K = 1024, 2048 and 8192
# in one run: the main loop's time a k-step and the SM clock each ran at, so a k-step is
# compared in cycles. Call BI put cuBLAS-best equal at K = 1024 and 8192 (762 / 756 TFLOP/s)
# and the engine at 696 / 761.
set -u
source scripts/gpu_call.sh
gc_init BK
GC_BUILD_S=330 gc_build /tmp/bk "gpu/test_gemm_trace.cu" bench_gemm_bench
gc_run trace 400 60 15 1 "x.*(engine  |trace)|rror" \
  /tmp/bk/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x8192 \
  --reps 5 --trace --commit "$(cat COMMIT_SNAP)"
gc_tar
