#!/usr/bin/env bash
# Session 57 call D: where pipeline 0 still walks tiles (units fill the grid less evenly, or
# K > MKERNEL_GEMM_UNITS_MAXK), does pipeline 4 with its staged epilogue (call C) now win?
# --pipelines times it ('ping192') beside the default on those shapes; then the small-K
# defaults again (a second run for their spread).
set -u
source scripts/gpu_call.sh
gc_init D
GC_BUILD_S=330 gc_build /tmp/bd "gpu/test_gemm_trace.cu" bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
gc_run tiles $((T + 120)) 110 20 1 "x.*(engine  |ping192)|rror|geomean" $B --reps 8 --pipelines \
  --shapes 4096x4096x1024,2048x8192x1024,4096x4096x4096,2048x8192x8192,1024x8192x8192,8192x8192x8192,8192x28672x8192,8192x8192x28672,16384x8192x8192,8192x8192x2048,8192x8192x4096
gc_run small2 $((T + 180)) 60 20 1 "x.*engine  |rror|geomean" $B --reps 10 --shapes \
  8192x8192x512,8192x8192x1024,16384x8192x1024,8192x28672x1024,4096x4096x1024,2048x8192x1024
gc_tar
