#!/usr/bin/env bash
# Session 27, call D: the fused MoE layer measured over more shapes and over the split
# (commSms: dispatch CTAs of the rank's budget), the fused dispatch + GEMM over the same split;
# and the dispatch suites (dispatch_dev.cuh changed: deferred errors, the slot's new fields).
set -u
source scripts/gpu_call.sh
gc_init D
GC_BUILD_S=300 gc_build /tmp/bd "gpu/test_moe_dispatch.cu;gpu/test_moe_ffn_fused.cu;gpu/test_fused_example.cu" mk_gpu_tests \
  bench_moe_threads_bench
gc_tests /tmp/bd 'Moe*:FusedExample*:-*Procs*:*Vnodes*' 300 90
B=/tmp/bd/bench/bench_moe_threads_bench
mb() {  # NAME UNTIL ARGS...
  local name=$1 until=$2 left
  shift 2
  left=$(gc_left "$until" 120)
  [ "$left" -lt 15 ] && { echo "$name skipped"; return; }
  timeout "$left" $B "$@" --out "$GC_L/$name.json" > "$GC_L/$name.log" 2>&1
  echo "$name rc=$? at $(gc_el)s"; grep -E "^H=|FAIL" "$GC_L/$name.log"
  gc_tar
}
R="--ranks 4 --reps 6 --warmup 1 --trials 5"
mb ffn_shapes 420 --ffn $R --shapes \
  7168:2048:256:8:1024,7168:2048:256:8:2048,7168:2048:256:8:4096,7168:2048:256:8:8192,4096:1536:128:8:4096,2048:1408:64:6:4096,2048:1408:64:6:16384
for c in 2 12 32; do
  mb ffn_c$c 480 --ffn $R --comm-sms $c --shapes 7168:2048:256:8:4096,2048:1408:64:6:4096
done
for c in 2 12 32; do
  mb dg_c$c 540 $R --comm-sms $c --shapes 7168:4096:256:8:4096,2048:2816:64:6:4096
done
