#!/usr/bin/env bash
# Session 27, call E (after the review found that the fused layer's GEMM2 took GEMM1's tile
# width, 128 columns, for its 256-column tiles: at H > 384 part of `out` was never computed,
# which the tests (H <= 384) and the bench (sequential run first on the same buffers) missed;
# calls C and D's layer figures are void): the fused layer's tests with H 640 / 1032 / 768 and
# the mixed-path case, then the layer measured again with outputs poisoned between the algos;
# then why the fused dispatch + GEMM loses on one shared GPU: the same bench with the
# sequential grouped GEMMs held to the rank's share of the SMs (MKERNEL_SEQ_GEMM_SMS=-1, as the
# fused kernels) against all SMs (the default).
set -u
source scripts/gpu_call.sh
gc_init E
GC_BUILD_S=300 gc_build /tmp/be "gpu/test_moe_ffn_fused.cu" mk_gpu_tests bench_moe_threads_bench
gc_tests /tmp/be '*MoeFfnFused*' 250 80
B=/tmp/be/bench/bench_moe_threads_bench
mb() {  # NAME UNTIL ARGS...
  local name=$1 until=$2 left
  shift 2
  left=$(gc_left "$until" 90)
  [ "$left" -lt 15 ] && { echo "$name skipped"; return; }
  timeout "$left" $B "$@" --out "$GC_L/$name.json" > "$GC_L/$name.log" 2>&1
  echo "$name rc=$? at $(gc_el)s"; grep -E "^H=|FAIL" "$GC_L/$name.log"
  gc_tar
}
R="--ranks 4 --reps 6 --warmup 1 --trials 5"
mb ffn_shapes 300 --ffn $R --shapes \
  7168:2048:256:8:1024,7168:2048:256:8:4096,7168:2048:256:8:8192,4096:1536:128:8:4096,2048:1408:64:6:4096,2048:1408:64:6:16384
S1=7168:4096:256:8:4096,2048:2816:64:6:4096
mb dg_all 320 $R --shapes $S1
MKERNEL_SEQ_GEMM_SMS=-1 mb dg_share 340 $R --shapes $S1
MKERNEL_SEQ_GEMM_SMS=-1 mb ffn_share 360 --ffn $R --shapes 7168:2048:256:8:4096,2048:1408:64:6:4096
