#!/usr/bin/env bash
# Session 48, call BE: the final device code (pipeline 0 = the carried epilogue on claimed
# tiles; the grouped carried epilogue taken out again). GEMM tests and the fused operators'
# tests, then the small-K shapes (the default beside the lent stage and the carried epilogue,
# static and claimed) with more repetitions, and the default list.
set -u
source scripts/gpu_call.sh
gc_init BE
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_dynamic.cu;gpu/test_gemm_trace.cu;gpu/test_fused_gemm_coll.cu;gpu/test_fused_matrix.cu;gpu/test_gemm_fused.cu;gpu/test_gemm_grouped.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 340 60
gc_run fused_tests 380 40 15 0 "^\[  (PASSED|FAILED) |tests? ran|^\[  FAILED  \] [A-Z]" \
  /tmp/bn/tests/mk_gpu_tests --gtest_filter='FusedGemmColl*:FusedMatrix*'
gc_run gemm_small_k 420 40 15 1 "x.*(engine  |carried|lent stage|claimed)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x512,16384x8192x1024,4096x4096x4096 \
  --reps 30 --carry --lend --claim --commit "$(cat COMMIT_SNAP)"
gc_run gemm_list 450 30 15 1 "x.*(engine  )|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)"
gc_tar
