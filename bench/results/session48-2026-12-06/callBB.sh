#!/usr/bin/env bash
# Session 48, call BB: the carried epilogue (pipeline 6) with the tile's last k-step split in
# two column halves (the first half converted and staged under the second half's wgmmas); the
# fp32 carry is gone (call BA: it spilled and ran slower). GEMM tests, racecheck and synccheck
# on GemmSmall, then timed and traced beside the lent stage and the default at small K.
set -u
source scripts/gpu_call.sh
gc_init BB
GC_BUILD_S=330 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_dynamic.cu;gpu/test_gemm_trace.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 400 90
gc_run racecheck 430 40 15 0 "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED" \
  compute-sanitizer --tool racecheck /tmp/bn/tests/mk_gpu_tests --gtest_filter='GemmSmall.*'
gc_run synccheck 450 30 10 0 "ERROR SUMMARY|PASSED|FAILED" \
  compute-sanitizer --tool synccheck /tmp/bn/tests/mk_gpu_tests --gtest_filter='GemmSmall.*'
gc_run gemm_carry 590 140 20 1 "x.*(engine  |carried|lent stage|claimed|trace (deep|engine|carried))|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x4096,4096x4096x4096,8192x8192x512 \
  --reps 12 --carry --lend --claim --trace --commit "$(cat COMMIT_SNAP)"
gc_tar
