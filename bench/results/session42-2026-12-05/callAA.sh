#!/usr/bin/env bash
# Session 42, call AA: storeWarps -1 (store threads at K <= 2048 only): every stand-alone GEMM
# GPU test with the default, the default shape list and the small-K shapes once.
set -u
source scripts/gpu_call.sh
gc_init AA
GC_BUILD_S=240 gc_build /tmp/bn \
  "gpu/test_gemm.cu;gpu/test_gemm_trace.cu;gpu/test_gemm_dynamic.cu;gpu/test_gemm_grouped.cu;gpu/test_gemm_hooks.cu;gpu/test_gemm_streamk.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 280 60
gc_run gemm_list 300 40 15 0 "x.*(engine  |other stores)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)" --out "$GC_L/gemm_list.json"
gc_run gemm_smallk 320 30 10 0 "x.*(engine  |other stores)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x4096 --reps 20 \
  --commit "$(cat COMMIT_SNAP)" --out "$GC_L/gemm_smallk.json"
gc_tar
