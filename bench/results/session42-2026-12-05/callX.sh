#!/usr/bin/env bash
# Session 42, call X. (1) The GEMM timeline as extended after call V: the epilogue's parts
# (staging free, conversions + shared stores, barrier, store issue), the same with no multiply
# by alpha (traceDiag 1), and the ping-pong consumers traced (their main loops' union per CTA),
# with a ping-pong window in the soak; GPU tests of the stamps (both pipelines, ping-pong, TMA
# and direct epilogues). (2) Session 41's removal of the ring options (dbe45a7), not yet run on a
# GPU: the processes tests under MPS and ring 16K with the 1-rank lead-in changed after call U.
set -u
source scripts/gpu_call.sh
gc_init X
GC_BUILD_S=300 gc_build /tmp/bn \
  "gpu/test_gemm_trace.cu;gpu/test_gemm.cu;gpu/test_ring_attention_procs.cu" \
  mk_gpu_tests bench_gemm_bench mkernel
gc_tests /tmp/bn 'GemmTrace.*:GemmSmall.*:GemmCorrectness.BothPipelines:GemmCorrectness.PingPong' 320 80
mv "$GC_L/tests.log.gz" "$GC_L/tests_gemm.log.gz" 2>/dev/null
SMI=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 50 >"$GC_L/smi.csv" 2>"$GC_L/smi.err" &
  SMI=$!
fi
gc_run gemm 440 120 40 0 "x.*(engine|trace|soak|back-to-back|pipeline)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,4096x4096x4096 \
  --reps 20 --trace --pipelines --soak 2 --commit "$(cat COMMIT_SNAP)" --out "$GC_L/gemm.json"
[ -n "$SMI" ] && kill "$SMI"
[ -s "$GC_L/smi.csv" ] && python3 bench/results/session41-2026-12-05/soak_clocks.py \
  "$GC_L/gemm.log" "$GC_L/smi.csv" | tee "$GC_L/soak_clocks.log"
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
gc_tests /tmp/bn 'RingAttn/RingAttnProcs.*:RingAttnProcsAbort.*' 520 70
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz" 2>/dev/null
gc_run ring_16k 580 50 20 0 "^\| [0-9]|rror|MISMATCH" \
  python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
  --layout zigzag --head-dims 128 --causal both --algos auto --backends flash \
  --out "$GC_L/ring_16k" --budget 30 --seqs 16384 --reps 5 --target-ms 10
gc_mps_stop
gc_tar
