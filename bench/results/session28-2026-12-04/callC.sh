#!/usr/bin/env bash
# Session 28, call C. Call B: MKERNEL_GEMM_PREFETCH (L2 prefetch batches) halved the engine's
# speed everywhere (removed). Here: the grouped raster (MKERNEL_GEMM_GROUP_RASTER=1: bands
# inside each expert, never across two experts' weights) and the band height
# (MKERNEL_GEMM_GROUP_M), against the old raster, on the MoE benches (4 ranks sharing the GPU:
# dispatch + GEMM with the sequential GEMMs at all SMs and at the rank's share, the layer) and
# the grouped GEMM alone; first the grouped GEMM and fused MoE tests under the new raster.
set -u
source scripts/gpu_call.sh
gc_init C
T="gpu/test_gemm_grouped.cu;gpu/test_moe_fused.cu;gpu/test_moe_ffn_fused.cu"
GC_BUILD_S=300 gc_build /tmp/bc "$T" mk_gpu_tests bench_moe_threads_bench bench_gemm_bench
MKERNEL_GEMM_GROUP_RASTER=1 gc_tests /tmp/bc 'GemmGrouped*:*MoeFused*:*MoeFfnFused*' 260 100
B=/tmp/bc/bench/bench_moe_threads_bench
mb() {  # NAME UNTIL ARGS...
  local name=$1 until=$2 left
  shift 2
  left=$(gc_left "$until" 60)
  [ "$left" -lt 15 ] && { echo "$name skipped"; return; }
  timeout "$left" $B "$@" --out "$GC_L/$name.json" > "$GC_L/$name.log" 2>&1
  echo "$name raster=${MKERNEL_GEMM_GROUP_RASTER:-0} gm=${MKERNEL_GEMM_GROUP_M:-0} seq=${MKERNEL_SEQ_GEMM_SMS:-0} rc=$? at $(gc_el)s"
  grep -E "^H=|FAIL" "$GC_L/$name.log"
  gc_tar
}
R="--ranks 4 --reps 4 --warmup 1 --trials 3"
S=7168:4096:256:8:4096,2048:2816:64:6:4096
for cfg in "0 0" "1 0" "1 4" "1 2" "0 4"; do
  set -- $cfg
  export MKERNEL_GEMM_GROUP_RASTER=$1 MKERNEL_GEMM_GROUP_M=$2
  MKERNEL_SEQ_GEMM_SMS=0 mb dg_r$1g$2 540 $R --shapes $S
  MKERNEL_SEQ_GEMM_SMS=-1 mb dgs_r$1g$2 540 $R --shapes 7168:4096:256:8:4096
  mb ffn_r$1g$2 540 --ffn $R --shapes 7168:2048:256:8:4096,2048:1408:64:6:4096
done
unset MKERNEL_GEMM_GROUP_RASTER MKERNEL_GEMM_GROUP_M
G=/tmp/bc/bench/bench_gemm_bench
for r in 0 1; do
  left=$(gc_left 590 40)
  [ "$left" -lt 15 ] && break
  MKERNEL_GEMM_GROUP_RASTER=$r timeout "$left" $G --reps 8 --groups 64 --shapes 32768x4096x7168 \
    --out "$GC_L/g64_r$r.json" > "$GC_L/g64_r$r.log" 2>&1
  echo "g64 raster=$r rc=$? at $(gc_el)s"; grep -E "grouped" "$GC_L/g64_r$r.log" | head -3
  gc_tar
done
