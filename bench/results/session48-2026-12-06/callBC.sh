#!/usr/bin/env bash
# Session 48, call BC: the carried epilogue back without the split last k-step (call BB: no
# faster), as CTA pairs too, and pipeline 0's default now (MKERNEL_GEMM_AUTO_LEND 2: the
# carried epilogue on claimed tiles). GEMM tests (ClusterPairs with pipeline 6), racecheck on
# GemmSmall, the fused operators' tests (their sequential paths run pipeline 0), then the small-K
# shapes with pairs and the default list.
set -u
source scripts/gpu_call.sh
gc_init BC
GC_BUILD_S=330 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_dynamic.cu;gpu/test_gemm_trace.cu;gpu/test_fused_gemm_coll.cu;gpu/test_fused_matrix.cu;gpu/test_gemm_fused.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 380 90
gc_run racecheck 410 40 15 0 "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED" \
  compute-sanitizer --tool racecheck /tmp/bn/tests/mk_gpu_tests --gtest_filter='GemmSmall.*'
gc_run fused_tests 450 40 15 0 "^\[  (PASSED|FAILED) |tests? ran|^\[  FAILED  \] [A-Z]" \
  /tmp/bn/tests/mk_gpu_tests --gtest_filter='FusedGemmColl*:FusedMatrix*'
gc_run gemm_small_k 525 75 20 1 "x.*(engine  |carried|lent stage|claimed)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x512,16384x8192x1024 \
  --reps 10 --carry --lend --claim --clusters --commit "$(cat COMMIT_SNAP)"
gc_run gemm_list 595 70 20 1 "x.*(engine  )|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 6 --commit "$(cat COMMIT_SNAP)"
gc_tar
