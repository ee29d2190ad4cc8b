#!/usr/bin/env bash
# Session 57 call B: pipeline 4's staged epilogue (one 8 KB box a warpgroup, TMA stores) against
# its register stores (GemmArgs::regStores = 1), side by side and traced, at small K; then the
# engine defaults (pipeline 0 -> units with the staged epilogue) at small K and on the list.
set -u
source scripts/gpu_call.sh
gc_init C
GC_BUILD_S=330 gc_build /tmp/bd "gpu/test_gemm*.cu" mk_gpu_tests bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
gc_tests /tmp/bd 'Gemm*' $((T + 60)) 60
gc_run epi $((T + 150)) 90 20 1 "x.*(engine  |register|ping192)|rror|geomean|ping-pong 192" $B --reps 10 \
  --pipelines --regstores --trace --shapes 8192x8192x512,8192x8192x1024,16384x8192x1024
gc_run small $((T + 210)) 60 20 1 "x.*engine  |rror|geomean" $B --reps 10 --shapes \
  8192x8192x512,8192x8192x1024,16384x8192x1024,8192x28672x1024,4096x4096x1024,2048x8192x1024
gc_run list $((T + 290)) 80 30 1 "x.*engine  |rror|geomean" $B --reps 10
gc_tar
