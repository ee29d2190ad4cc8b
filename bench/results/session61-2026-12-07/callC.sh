#!/usr/bin/env bash
# Session 61 call C: call B cut to the 413 s of device time left. Every GemmGrouped test (the
# units' default, MKERNEL_GEMM_GROUP_UNITS 2, in CarriedEpilogueSetting's default block), then,
# with what time is left, grouped_bench at the two shapes the default moved to the units
# (2048 -> 7168, and the small model's 1408 -> 2048) against session 60's default (carry:
# MKERNEL_GEMM_GROUP_UNITS=0) in the same rounds.
set -u
source scripts/gpu_call.sh
gc_init C
GC_BUILD_S=330 gc_build /tmp/bf "gpu/test_gemm_grouped.cu" mk_gpu_tests bench_gemm_bench
gc_tar
T=$(gc_el)
gc_tests /tmp/bf 'GemmGrouped.*' $((T + 35)) 35
gc_run grouped 390 60 25 0 "^\||rror" python3 bench/grouped_bench.py --build /tmp/bf \
  --shapes 32:4096:2048:7168,64:1024:1408:2048 --out "$GC_L/grouped" --rounds 3 --reps 10 \
  --engine-env carry:MKERNEL_GEMM_GROUP_UNITS=0
gc_tar
