#!/usr/bin/env bash
# Session 42, call Z: the store threads' handshake on mbarriers (no consumer warp waits for
# another; call Y's named barriers cost 0.25 us a tile in warp skew). (1) every stand-alone GEMM
# GPU test (store threads are the default) and the trace test; (2) bench_gemm_bench at the
# small-K shapes, twice, with --pipelines (deep/wide/ping columns, all with store threads: the
# deep ring's double-buffered staging no longer stalls a consumer thread on the store issue),
# --trace (store threads on/off, ping-pong) and --b2b 10; (3) the default shape list.
set -u
source scripts/gpu_call.sh
gc_init Z
GC_BUILD_S=300 gc_build /tmp/bn \
  "gpu/test_gemm.cu;gpu/test_gemm_trace.cu;gpu/test_gemm_dynamic.cu;gpu/test_gemm_grouped.cu;gpu/test_gemm_hooks.cu;gpu/test_gemm_streamk.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 360 150
for i in 1 2; do
  gc_run gemm_smallk$i 480 90 30 0 "x.*(engine|trace|back-to-back|sw0|pipeline)|geomean|rror" \
    /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x512 \
    --reps 20 --trace --b2b 10 --pipelines --commit "$(cat COMMIT_SNAP)" \
    --out "$GC_L/gemm_smallk$i.json"
done
gc_run gemm_list 560 80 30 0 "x.*(engine  |sw0)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)" --out "$GC_L/gemm_list.json"
gc_tar
