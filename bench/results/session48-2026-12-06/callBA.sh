#!/usr/bin/env bash
# Session 48, call BA: (1) session 47's last commits on the GPU (the tile counter keyed by
# stream id, lendsStage/budgetOf) with the GEMM suites and the fused operators' tests (their
# sequential paths call gemm::launch plainly, so pipeline 0 claims tiles there now); (2) the
# carried epilogue (GemmArgs::pipeline 6 packed, 7 fp32): tests, then timed and traced beside
# the lent stage and the default at 8192 x 8192 x 1024 / 2048 / 4096; (3) racecheck on
# GemmSmall (every pipeline, one CTA walking every tile).
set -u
source scripts/gpu_call.sh
gc_init BA
GC_BUILD_S=330 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_dynamic.cu;gpu/test_gemm_trace.cu;gpu/test_fused_gemm_coll.cu;gpu/test_fused_matrix.cu;gpu/test_gemm_fused.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 420 90
gc_run gemm_carry 500 80 20 1 "x.*(engine  |carried|lent stage|claimed|trace (deep|engine|carried))|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x4096 \
  --reps 10 --carry --lend --claim --trace --commit "$(cat COMMIT_SNAP)"
gc_run fused_tests 560 60 15 0 "^\[  (PASSED|FAILED) |tests? ran|^\[  FAILED  \] [A-Z]" \
  /tmp/bn/tests/mk_gpu_tests --gtest_filter='FusedGemmColl*:FusedMatrix*'
gc_run racecheck 590 30 15 0 "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED" \
  compute-sanitizer --tool racecheck /tmp/bn/tests/mk_gpu_tests --gtest_filter='GemmSmall.*'
gc_tar
