#!/usr/bin/env bash
# Session 45, call AO (not run: no device budget left; after call AN next session): what
# sessions 44-45 left unverified on the GPU. The stand-alone GEMM tests at this commit
# (test_gemm.cu: pipeline 4 and the ping-pong tests; test_gemm_trace.cu: the traced deep-ring
# CTA pairs), racecheck and synccheck on GemmSmall (one CTA walking every tile, pipeline 4
# included), then the default shape list with --pipelines (never run with pipeline 4).
set -u
source scripts/gpu_call.sh
gc_init AO
GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_trace.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 300 60
until=350
for tool in racecheck synccheck; do
  gc_run "san_$tool" "$until" 50 20 0 "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" \
    compute-sanitizer --tool "$tool" --error-exitcode 9 /tmp/bn/tests/mk_gpu_tests \
    --gtest_filter='GemmSmall.*'
  until=$((until + 50))
done
gc_run gemm_list 590 140 15 1 "x.*(engine  |pipeline)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 8 --pipelines --commit "$(cat COMMIT_SNAP)"
gc_tar
