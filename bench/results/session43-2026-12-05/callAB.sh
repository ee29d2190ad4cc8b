#!/usr/bin/env bash
# Session 43, call AB (written without a device; session 43 had none): the ping-pong consumers
# as CTA pairs (GemmArgs::pipeline 3 + cluster 2, B multicast), and session 42's unverified
# storeWarps -1 rule (call AA's steps). Every stand-alone GEMM GPU test first (the ping-pong
# pairs run in GemmCorrectness.PingPong / ClusterPairs and GemmTrace.StampsEveryWalkedTile),
# then the small-K shapes with every pipeline, as pairs and unpaired, traced, and the default
# list once.
set -u
source scripts/gpu_call.sh
gc_init AB
GC_BUILD_S=240 gc_build /tmp/bn \
  "gpu/test_gemm.cu;gpu/test_gemm_trace.cu;gpu/test_gemm_dynamic.cu;gpu/test_gemm_grouped.cu;gpu/test_gemm_hooks.cu;gpu/test_gemm_streamk.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 280 60
# GemmSmall now includes one CTA pair walking every tile (cooperative and ping-pong): the
# multicasts and remote releases under racecheck and synccheck.
until=330
for tool in racecheck synccheck; do
  gc_run "san_$tool" "$until" 45 20 0 "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" \
    compute-sanitizer --tool "$tool" --error-exitcode 9 /tmp/bn/tests/mk_gpu_tests \
    --gtest_filter='GemmSmall.*'
  until=$((until + 45))
done
# The ping-pong pairs against the unpaired ping-pong, the cooperative pairs and the default,
# interleaved; traced (per unit: first stage, main loop, k-step time, union of main loops).
gc_run gemm_pingpairs 475 100 20 1 "x.*(engine  |ping|CTA pairs|trace)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x512,8192x8192x1024,8192x8192x2048,8192x8192x4096 \
  --reps 15 --pipelines --clusters --trace --commit "$(cat COMMIT_SNAP)"
gc_run gemm_list 590 110 15 1 "x.*(engine  |other stores)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)"
gc_tar
