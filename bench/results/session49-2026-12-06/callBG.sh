#!/usr/bin/env bash
# Session 49, first of two calls on one warm machine (callBH.sh reuses /tmp/bt): the whole GPU
# test binary built (the README's Release configure, every GPU test file), `Gemm*` first (the
# carried epilogue now pipeline 0's choice at every K; AutoClaimsBackToBack at K = 4200), the
# default GEMM list against MKERNEL_GEMM_AUTO_LEND=0 (wide split / deep ring, the choice before
# sessions 47-49) in two interleaved rounds, then the first third of the whole suite.
set -u
source scripts/gpu_call.sh
gc_init BG
GC_BUILD_S=400 gc_build /tmp/bt "gpu/*.cc;gpu/*.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bt 'Gemm*' 470 60
mv "$GC_L/tests.log.gz" "$GC_L/tests_gemm.log.gz"
for r in 1 2; do
  gc_run "list_default_$r" 480 40 15 1 "x.*(engine  )|geomean|rror" \
    /tmp/bt/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)"
  MKERNEL_GEMM_AUTO_LEND=0 gc_run "list_lend0_$r" 500 40 15 1 "x.*(engine  )|geomean|rror" \
    /tmp/bt/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)"
done
gc_run small_k 510 30 10 1 "x.*(engine  )|rror" \
  /tmp/bt/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,16384x8192x1024 \
  --reps 20 --commit "$(cat COMMIT_SNAP)"
# The whole suite in three filters whose union is every test: the fused operators' suites here.
gc_tests /tmp/bt '*Fused*:*Moe*:*Gemm*:*Attn*' 590 400
mv "$GC_L/tests.log.gz" "$GC_L/tests_b1.log.gz"
gc_tar
