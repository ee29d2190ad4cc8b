#!/usr/bin/env bash
# Session 49, the one call that fits what device time was left after five failed starts (BG/BH,
# the whole suite, did not run): the GEMM test files and the bench only. `Gemm*` (pipeline 0's
# carried epilogue at every K; AutoClaimsBackToBack at K = 4200), the default list against
# MKERNEL_GEMM_AUTO_LEND=0 (the wide split / deep ring) interleaved, then soak windows at
# 8192x8192x1024 (pipeline 0, cuBLAS-best, the carried epilogue as CTA pairs) with nvidia-smi
# sampling beside them: does multicast buy clock under the power cap?
set -u
source scripts/gpu_call.sh
gc_init BI
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_dynamic.cu;gpu/test_gemm_trace.cu;gpu/test_gemm_grouped.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 330 60
gc_run list_default 345 40 15 1 "x.*(engine  )|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)"
MKERNEL_GEMM_AUTO_LEND=0 gc_run list_lend0 360 40 15 1 "x.*(engine  )|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 50 >"$GC_L/smi.csv" 2>"$GC_L/smi.err" &
SMI=$!
gc_run soak 420 70 30 1 "x.*(engine  |carried|soak)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024 --reps 10 --carry --clusters --soak 5 \
  --commit "$(cat COMMIT_SNAP)"
kill $SMI 2>/dev/null
[ -s "$GC_L/smi.csv" ] && python3 bench/results/session41-2026-12-05/soak_clocks.py \
  "$GC_L/soak.log" "$GC_L/smi.csv" | tee "$GC_L/soak_clocks.log"
gc_tar
