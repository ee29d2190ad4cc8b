#!/usr/bin/env bash
# Session 40, call Q (call P's machine, warm): the processes tests P had no time for (the
# staged split's correctness), then one traced ring run at 16K causal with the split.
set -u
source scripts/gpu_call.sh
gc_init Q
[ -f /tmp/bn/tests/mk_gpu_tests ] || GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_ring_attention.cu;gpu/test_ring_attention_procs.cu;gpu/test_ring_attn_xnode.cu" mk_gpu_tests mkernel
export LD_LIBRARY_PATH=/tmp/bn/src MKERNEL_TIMEOUT_MS=20000
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
gc_tests /tmp/bn 'RingAttn/RingAttnProcs.*:RingAttnProcsAbort.*' 150 140
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz"
MKERNEL_FUSED_TRACE=1 gc_run "trace_sp1" 200 45 20 0 "rror" \
  python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
  --layout zigzag --head-dims 128 --causal yes --target-ms 4 --out "$GC_L/trace_sp1" \
  --seqs 16384 --algos auto --backends flash --reps 1 --budget 30
grep "fused trace" "$GC_L/trace_sp1.log" | head -40 > "$GC_L/trace_lines.txt"
rm -rf "$GC_L/trace_sp1"
gc_mps_stop
gc_tar
