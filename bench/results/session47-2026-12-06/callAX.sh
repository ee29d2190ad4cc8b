#!/usr/bin/env bash
# Session 47, call AX: the dynamic tile schedule (GemmArgs::tileClaim) for the stand-alone GEMM,
# the default pipeline and the lent stage (pipeline 5, now allowed with tileClaim). Call AW's
# traces: at 8192 x 8192 x 1024 the lent stage's tiles take ~19.9K SM cycles (cuBLAS's whole run,
# ncu in session 46: 306.5K cycles for 16 rounds, ~19.2K a tile) but its span is ~337K cycles,
# the latest CTA ending 7.2 us after the median one (tail). Claimed tiles let fast CTAs take the
# slow ones' share. Tests first (GemmDynamic with pipeline 5 cases), then the benches.
set -u
source scripts/gpu_call.sh
gc_init AX
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_dynamic.cu;gpu/test_gemm_trace.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'GemmDynamic*:GemmSmall*:GemmTrace*' 360 60
gc_run gemm_claim 480 120 20 1 "x.*(engine  |trace|lent|claimed)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x4096 \
  --reps 10 --trace --lend --claim --commit "$(cat COMMIT_SNAP)"
gc_run gemm_claim_list 590 100 15 1 "x.*(engine  |lent|claimed)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 8 --lend --claim --commit "$(cat COMMIT_SNAP)"
gc_tar
