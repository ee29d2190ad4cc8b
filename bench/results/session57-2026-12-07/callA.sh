#!/usr/bin/env bash
# Session 57 call A = session 56 callN (what session 56 changed after call M).
# 1. Gemm* (every GEMM test file): PingPong192's check of pipeline 0 resolving to units, the two
#    tests pinned to the tile walk (MKERNEL_GEMM_UNITS_MAXK=0), skipStores / storeHint keeping it.
# 2. bench_gemm_bench (defaults) at small K, including 8192x8192x512 and the shapes that stay on
#    tiles, then the default list (>= 0.97 of cuBLAS-best there is issue 12's other half).
set -u
source scripts/gpu_call.sh
gc_init A
GC_BUILD_S=330 gc_build /tmp/bd "gpu/test_gemm*.cu" mk_gpu_tests bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
gc_tests /tmp/bd 'Gemm*' $((T + 120)) 120
gc_run small $((T + 200)) 80 20 1 "x.*engine  |rror|geomean" $B --reps 10 --shapes \
  8192x8192x512,8192x8192x1024,16384x8192x1024,8192x28672x1024,4096x4096x1024,2048x8192x1024
gc_run list $((T + 300)) 100 30 1 "x.*engine  |rror|geomean" $B --reps 10
gc_tar
