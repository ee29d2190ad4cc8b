#!/usr/bin/env bash
# Session 46, call AQ (after AP, on the warm machine: its build in /tmp/bn is reused): the rest
# of session 45's call AO: racecheck and synccheck on GemmSmall (one CTA walking every tile,
# pipeline 4 included), then the default shape list with --pipelines.
set -u
source scripts/gpu_call.sh
gc_init AQ
GC_BUILD_S=280 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_trace.cu" mk_gpu_tests \
  bench_gemm_bench
until=$(( $(gc_el) + 60 ))
for tool in racecheck synccheck; do
  gc_run "san_$tool" "$until" 50 20 0 "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" \
    compute-sanitizer --tool "$tool" --error-exitcode 9 /tmp/bn/tests/mk_gpu_tests \
    --gtest_filter='GemmSmall.*'
  until=$((until + 55))
done
gc_run gemm_list 590 150 15 1 "x.*(engine  |pipeline)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 8 --pipelines --commit "$(cat COMMIT_SNAP)"
gc_tar
