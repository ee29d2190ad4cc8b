#!/usr/bin/env bash
# Session 56, call M: pipeline 0 now runs plain small-K GEMMs as the unit walk (pipeline 4) where
# its units load the grid at least as evenly as tiles (MKERNEL_GEMM_UNITS_MAXK, default 4096).
# 1. Every GEMM test file's tests (Gemm*), the default path now taking units at large shapes.
# 2. bench_gemm_bench (defaults) at the small-K shapes and the default list: the engine column.
set -u
source scripts/gpu_call.sh
gc_init M
GC_BUILD_S=330 gc_build /tmp/bd "gpu/test_gemm*.cu" mk_gpu_tests bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
gc_run small $((T + 60)) 60 20 1 "x.*engine  |rror|geomean" $B --reps 10 \
  --shapes 8192x8192x1024,8192x8192x512,16384x8192x1024,8192x28672x1024,8192x8192x2048,4096x4096x1024
gc_tests /tmp/bd 'Gemm*' $((T + 200)) 140
gc_run list $((T + 270)) 70 30 1 "x.*engine  |rror|geomean" $B --reps 8
gc_tar
