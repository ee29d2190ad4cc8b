#!/usr/bin/env bash
# Session 50: what fits one call after device starts failed for an hour (~840 s of the budget):
# the GEMM test files only, `Gemm*` (pipeline 0 = gemm::autoPipeline since d552d63, host code
# not yet run on a GPU; GemmArgs::skipStores new), then issue 12's small-K question: the
# default engine against itself with the D stores off (bench_gemm_bench --nostore,
# GemmArgs::skipStores, a diagnostic), timed, then traced at K = 1024 / 2048 / 8192 (the
# k-step in cycles by tile length); is the D stores' share of the L2 traffic (8% at K = 1024,
# 1% at 8192) what the small-K k-step loses? Then the default list (issue 12's >= 0.97).
set -u
source scripts/gpu_call.sh
gc_init CD
GC_BUILD_S=330 gc_build /tmp/bd "gpu/test_gemm*.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bd 'Gemm*' 360 70
mv "$GC_L/tests.log.gz" "$GC_L/tests_gemm.log.gz"
gc_run nostore 415 55 20 1 "x.*(engine  |stores off)|rror" \
  /tmp/bd/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x8192 \
  --reps 20 --nostore --commit "$(cat COMMIT_SNAP)"
gc_run trace 485 70 20 1 "x.*(engine  |trace|stores off)|rror" \
  /tmp/bd/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x8192 \
  --reps 5 --trace --nostore --commit "$(cat COMMIT_SNAP)"
gc_run list_default 530 40 25 1 "x.*(engine  )|geomean|rror" \
  /tmp/bd/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)"
gc_tar
