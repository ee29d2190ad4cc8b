#!/usr/bin/env bash
# Session 61 call B: the units' default (MKERNEL_GEMM_GROUP_UNITS 2: K <= 2048 and N >= 2048,
# from call A's rounds) on the GPU.
# 1. Every GemmGrouped test (CarriedEpilogueSetting's default block now expects the units at
#    K 136 / 2048 with N 4096 / 2056 and the carry at K 2056, N 4096).
# 2. grouped_bench.py: the new default against session 60's (carry: MKERNEL_GEMM_GROUP_UNITS=0)
#    and the tiles (both settings 0), in the same rounds, three rounds, call A's four shapes.
# No racecheck: 40 s and 60 s caps cut it off before a summary in sessions 60 and 61, and the
# device time left (953 s) does not hold the minutes it needs beside the rest.
set -u
source scripts/gpu_call.sh
gc_init B
GC_BUILD_S=340 gc_build /tmp/bf "gpu/test_gemm_grouped.cu" mk_gpu_tests bench_gemm_bench
gc_tar
T=$(gc_el)
gc_tests /tmp/bf 'GemmGrouped.*' $((T + 40)) 40
S=32:4096:7168:2048,16:8192:2048:1408,32:4096:2048:7168,64:1024:1408:2048
gc_run grouped $((T + 115)) 75 10 0 "^\||rror" python3 bench/grouped_bench.py --build /tmp/bf \
  --shapes $S --out "$GC_L/grouped" --rounds 3 --reps 10 \
  --engine-env carry:MKERNEL_GEMM_GROUP_UNITS=0 \
  --engine-env tiles:MKERNEL_GEMM_GROUP_UNITS=0,MKERNEL_GEMM_GROUP_CARRY=0
gc_tar
