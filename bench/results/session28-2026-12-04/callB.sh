#!/usr/bin/env bash
# Session 28, call B: call A showed the MoE grouped GEMM (512 rows an expert, H 7168 -> 4096)
# at 520 TFLOP/s with all SMs but at 730-equivalent per SM on 33 SMs alone, and 4 concurrent
# ranks on 33 SMs each 2x slower than one alone: a shared resource, likely DRAM streaming the
# experts' weights one 128-byte piece per row per k-step. Experiment: MKERNEL_GEMM_PREFETCH=n
# (the producer asks L2 for the next n k-steps of A and B in one batch every n k-steps), against
# 0, on 1 rank (all SMs), 4 ranks (dispatch + GEMM and the layer) and the grouped GEMM alone
# (64 x 512 rows, 8 x 4096 rows) and plain 8192x8192x1024 / 8192^3 against cuBLAS.
set -u
source scripts/gpu_call.sh
gc_init B
GC_BUILD_S=300 gc_build /tmp/bb "gpu/test_gemm.cu" bench_moe_threads_bench bench_gemm_bench
B=/tmp/bb/bench/bench_moe_threads_bench
mb() {  # NAME UNTIL ARGS...
  local name=$1 until=$2 left
  shift 2
  left=$(gc_left "$until" 60)
  [ "$left" -lt 15 ] && { echo "$name skipped"; return; }
  timeout "$left" $B "$@" --out "$GC_L/$name.json" > "$GC_L/$name.log" 2>&1
  echo "$name pf=${MKERNEL_GEMM_PREFETCH:-0} rc=$? at $(gc_el)s"; grep -E "^H=|FAIL" "$GC_L/$name.log"
  gc_tar
}
R="--reps 4 --warmup 1 --trials 3"
for pf in 0 4 8 16; do
  MKERNEL_GEMM_PREFETCH=$pf mb r1_pf$pf $((200 + pf * 10)) --ranks 1 $R --shapes 7168:4096:256:8:16384
done
for pf in 0 8; do
  MKERNEL_GEMM_PREFETCH=$pf mb r4_pf$pf $((380 + pf * 3)) --ranks 4 $R --shapes 7168:4096:256:8:4096,2048:2816:64:6:4096
  MKERNEL_GEMM_PREFETCH=$pf mb ffn_pf$pf $((420 + pf * 3)) --ffn --ranks 4 $R --shapes 7168:2048:256:8:4096
done
G=/tmp/bb/bench/bench_gemm_bench
gb() {  # NAME UNTIL ARGS...
  local name=$1 until=$2 left
  shift 2
  left=$(gc_left "$until" 60)
  [ "$left" -lt 15 ] && { echo "$name skipped"; return; }
  timeout "$left" $G "$@" --out "$GC_L/$name.json" > "$GC_L/$name.log" 2>&1
  echo "$name pf=${MKERNEL_GEMM_PREFETCH:-0} rc=$? at $(gc_el)s"; grep -E "engine|grouped" "$GC_L/$name.log" | head -8
  gc_tar
}
for pf in 0 8; do
  MKERNEL_GEMM_PREFETCH=$pf gb g64_pf$pf $((480 + pf * 4)) --reps 8 --groups 64 --shapes 32768x4096x7168
  MKERNEL_GEMM_PREFETCH=$pf gb g8_pf$pf $((520 + pf * 4)) --reps 8 --groups 8 --shapes 32768x4096x7168
  MKERNEL_GEMM_PREFETCH=$pf gb d_pf$pf $((560 + pf * 4)) --reps 10 --shapes 8192x8192x1024,8192x8192x8192
done
