#!/usr/bin/env bash
# For the next session with a device: where the GEMM's small-K gap goes (issue 12's 0.95 at
# 8192 x 8192 x 1024). (1) the GEMM tests touching the new timeline stamps (GemmTrace: a traced
# launch computes the same D and stamps every walked tile in order) and the engine paths they
# ran through; (2) bench_gemm_bench with --trace (per-tile medians: first stage, main loop,
# epilogue; tail; SM clock), --b2b 10 (both sides timed over 10 back-to-back calls: host work
# per call out of the window) and --soak 3 (engine, cuBLAS-best, engine for 3 s each) while
# nvidia-smi samples the SM clock and power every 50 ms (soak_clocks.py lines them up).
# Shapes: the small-K one, one of the same kernel length with long K (4096^3), and 8192^3.
set -u
source scripts/gpu_call.sh
gc_init V
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_gemm_trace.cu;gpu/test_gemm.cu;gpu/test_gemm_dynamic.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'GemmTrace.*:GemmSmall.*:GemmCorrectness.BothPipelines:GemmDynamic.*' 300 60
SMI=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 50 >"$GC_L/smi.csv" 2>"$GC_L/smi.err" &
  SMI=$!
fi
gc_run gemm 560 240 40 0 "x.*(engine|trace|soak|back-to-back)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,4096x4096x4096,8192x8192x8192 \
  --reps 20 --trace --b2b 10 --soak 3 --commit "$(cat COMMIT_SNAP)" --out "$GC_L/gemm.json"
[ -n "$SMI" ] && kill "$SMI"
[ -s "$GC_L/smi.csv" ] && python3 bench/results/session41-2026-12-05/soak_clocks.py \
  "$GC_L/gemm.log" "$GC_L/smi.csv" | tee "$GC_L/soak_clocks.log"
gc_tar
