#!/usr/bin/env bash
# Session 47, call AY: pipeline 0 now resolves to the lent stage on claimed tiles for plain
# unpaired GEMMs with B [N,K], 16-bit D and K <= 4096 (MKERNEL_GEMM_AUTO_LEND=1, default; the
# engine's own counter per device and stream, reset by each launch's last claim). Call AX
# measured it at 1.041 / 1.033 / 1.023 of the default (wide) at 8192 x 8192 x 1024 / 2048 / 4096.
# Every GEMM correctness test (pipeline 0 runs the new path wherever those conditions hold),
# GemmDynamic with the back-to-back/stream/graph test, then the default list and the small-K
# shapes with --pipelines (the wide split beside the new default).
set -u
source scripts/gpu_call.sh
gc_init AY
GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_dynamic.cu;gpu/test_gemm_trace.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 280 100
gc_run gemm_list 345 60 15 1 "x.*(engine  )|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 8 --commit "$(cat COMMIT_SNAP)"
gc_run gemm_small_k 398 50 15 1 "x.*(engine  |pipeline)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x4096 \
  --reps 10 --pipelines --commit "$(cat COMMIT_SNAP)"
gc_tar
