#!/usr/bin/env bash
# Session 42, call Y: the store warps (GemmArgs::storeWarps, default 1: the producer
# warpgroup's warps 1-2 issue the epilogue's TMA stores; call X's trace put the consumer's
# issue at 0.70 us of a 1.50 us epilogue) and the epilogue without the multiply when alpha is 1
# (0.15 us in call X). (1) every stand-alone GEMM GPU test (the store warps are the default
# there: deep/wide, static/dynamic, stream-K, pairs, grouped, hooks incl. abort) and the trace
# test with both settings; (2) bench_gemm_bench at the small-K shapes with the trace (store
# warps on and off), back-to-back and soak windows, and the 'sw0' column (storeWarps 0 timed
# next to the default); (3) the default shape list (issue 12's >= 0.97 list).
set -u
source scripts/gpu_call.sh
gc_init Y
GC_BUILD_S=300 gc_build /tmp/bn \
  "gpu/test_gemm.cu;gpu/test_gemm_trace.cu;gpu/test_gemm_dynamic.cu;gpu/test_gemm_grouped.cu;gpu/test_gemm_hooks.cu;gpu/test_gemm_streamk.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 360 150
SMI=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 50 >"$GC_L/smi.csv" 2>"$GC_L/smi.err" &
  SMI=$!
fi
gc_run gemm_smallk 450 90 40 0 "x.*(engine|trace|soak|back-to-back|sw0)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,4096x4096x4096 \
  --reps 20 --trace --b2b 10 --soak 2 --commit "$(cat COMMIT_SNAP)" --out "$GC_L/gemm_smallk.json"
[ -n "$SMI" ] && kill "$SMI"
[ -s "$GC_L/smi.csv" ] && python3 bench/results/session41-2026-12-05/soak_clocks.py \
  "$GC_L/gemm_smallk.log" "$GC_L/smi.csv" | tee "$GC_L/soak_clocks.log"
gc_run gemm_list 585 130 40 0 "x.*(engine  |sw0)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)" --out "$GC_L/gemm_list.json"
gc_tar
