#!/usr/bin/env bash
# Session 44, call AF: the ping-pong consumers with 192-column units (GemmArgs::pipeline 4,
# 128x384 tiles, two m64n192k16 per warpgroup and k16 step, 3 stages, 24/240 registers),
# written without a device run. Every stand-alone GEMM GPU test first (pipeline 4 runs in
# GemmCorrectness.PingPong192 / BothPipelines / InPlaceBeta, GemmSmall, GemmTrace), racecheck
# and synccheck on GemmSmall (one CTA walking every tile with pipeline 4 too), then the small-K
# shapes with every pipeline, traced ('ping192' column and 'ping-pong 192' trace lines), then
# the default list with --pipelines.
set -u
source scripts/gpu_call.sh
gc_init AF
GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_trace.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 290 60
until=335
for tool in racecheck synccheck; do
  gc_run "san_$tool" "$until" 45 20 0 "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" \
    compute-sanitizer --tool "$tool" --error-exitcode 9 /tmp/bn/tests/mk_gpu_tests \
    --gtest_filter='GemmSmall.*'
  until=$((until + 45))
done
gc_run gemm_ping192 490 100 20 1 "x.*(engine  |pipeline|trace)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x512,8192x8192x1024,8192x8192x2048,8192x8192x4096 \
  --reps 15 --pipelines --trace --commit "$(cat COMMIT_SNAP)"
gc_run gemm_list 592 100 15 1 "x.*(engine  |pipeline)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 8 --pipelines --commit "$(cat COMMIT_SNAP)"
gc_tar
