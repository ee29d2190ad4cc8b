#!/usr/bin/env bash
# Session 46, call AU (branch s46-half; not run: no device time left): the half-depth ring
# (GemmArgs::pipeline 5: 8 stages of 32-deep k-steps, 24 KB each, in the deep ring's shared
# memory, 64-byte swizzle) for the first time on the GPU: its correctness (GemmSmall with one CTA
# or pair walking every tile, BothPipelines, ClusterPairs), racecheck on GemmSmall, then the
# small-K shapes traced beside the deep ring and the default list. Run after callAT.sh (the
# ring sweep without compute), ideally on the same machine.
set -u
source scripts/gpu_call.sh
gc_init AU
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_trace.cu" mk_gpu_tests \
  bench_gemm_bench
gc_tests /tmp/bn 'GemmSmall*:GemmCorrectness.BothPipelines:GemmCorrectness.ClusterPairs:GemmTrace*' 390 90
gc_run san_racecheck 430 40 15 0 "RACECHECK SUMMARY|PASSED|FAILED" \
  compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/bn/tests/mk_gpu_tests \
  --gtest_filter='GemmSmall.*'
gc_run gemm_half 520 90 20 1 "x.*(engine  |pipeline|pairs|trace|half)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x4096 \
  --reps 10 --pipelines --clusters --trace --half --commit "$(cat COMMIT_SNAP)"
gc_run gemm_half_list 590 70 15 1 "x.*(engine  |half)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 8 --half --clusters --commit "$(cat COMMIT_SNAP)"
gc_tar
