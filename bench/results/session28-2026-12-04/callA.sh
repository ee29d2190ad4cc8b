#!/usr/bin/env bash
# Session 28, call A: the GPU tests of what session 27 changed after its last GPU run (the
# cooperative launch helper shared by launchRoles and the MoE fused launchers, the layer
# suites' shared case loop, moeFusedBudget), then why the fused MoE kernels lose on one
# shared GPU: the sequential grouped GEMM of ncclMoeDispatchGemm on 1 rank with all SMs
# against a quarter of them (does one GEMM lose per SM on a small grid?), and 4 / 2 ranks
# with all SMs against their share (do concurrent GEMMs lose to each other?).
set -u
source scripts/gpu_call.sh
gc_init A
T="gpu/test_moe_ffn_fused.cu;gpu/test_moe_ffn.cu;gpu/test_moe_fused.cu"
T="$T;gpu/test_fused_gemm_coll.cu;gpu/test_fused_example*.cu"
GC_BUILD_S=300 gc_build /tmp/ba "$T" mk_gpu_tests bench_moe_threads_bench bench_gemm_bench
gc_tests /tmp/ba '*MoeFfn*:*MoeFused*:*FusedGemmColl*:FusedExample*' 330 140
B=/tmp/ba/bench/bench_moe_threads_bench
mb() {  # NAME UNTIL ARGS...
  local name=$1 until=$2 left
  shift 2
  left=$(gc_left "$until" 60)
  [ "$left" -lt 15 ] && { echo "$name skipped"; return; }
  timeout "$left" $B "$@" --out "$GC_L/$name.json" > "$GC_L/$name.log" 2>&1
  echo "$name rc=$? at $(gc_el)s"; grep -E "^H=|FAIL" "$GC_L/$name.log"
  gc_tar
}
R="--reps 4 --warmup 1 --trials 3"
MKERNEL_SEQ_GEMM_SMS=0 mb r1_all 380 --ranks 1 $R --shapes 7168:4096:256:8:16384
MKERNEL_SEQ_GEMM_SMS=33 mb r1_q 430 --ranks 1 $R --shapes 7168:4096:256:8:16384
MKERNEL_SEQ_GEMM_SMS=66 mb r1_h 470 --ranks 1 $R --shapes 7168:4096:256:8:16384
MKERNEL_SEQ_GEMM_SMS=0 mb r4_all 510 --ranks 4 $R --shapes 7168:4096:256:8:4096
MKERNEL_SEQ_GEMM_SMS=-1 mb r4_share 550 --ranks 4 $R --shapes 7168:4096:256:8:4096
MKERNEL_SEQ_GEMM_SMS=-1 mb r2_share 590 --ranks 2 $R --shapes 7168:4096:256:8:8192
