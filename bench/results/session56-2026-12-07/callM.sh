#!/usr/bin/env bash
# Session 56, call M: pipeline 0 now runs plain small-K GEMMs as the unit walk (pipeline 4) where
# its units load the grid at least as evenly as tiles (MKERNEL_GEMM_UNITS_MAXK, default 4096).
# 1. Every GEMM test file's tests (Gemm*), the default path now taking units at large shapes.
# 2. bench_gemm_bench (defaults) at small-K shapes: the engine column (the device time left
#    allows no default-list run).
set -u
source scripts/gpu_call.sh
gc_init M
GC_BUILD_S=330 gc_build /tmp/bd "gpu/test_gemm*.cu" mk_gpu_tests bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
gc_tests /tmp/bd 'Gemm*' $((T + 120)) 120
gc_run small $((T + 175)) 55 20 1 "x.*engine  |rror|geomean" $B --reps 8 \
  --shapes 8192x8192x1024,16384x8192x1024,8192x28672x1024,8192x8192x2048,4096x4096x1024
gc_tar
