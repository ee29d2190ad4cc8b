#!/usr/bin/env bash
# Session 29, call A: the first GPU run of session 28's last two commits (f073fd8: the review's
# mends, MKERNEL_GEMM_GROUP_M removed, MoeFfnFusedLate checks its shortest call; 2451f9b: the
# raster arithmetic in fused/gemm/raster.h): every GEMM, MoE and fused GEMM + collective test.
# Then the fused MoE kernels against the sequential path where session 28 did not measure
# them: few tokens a rank (128-1024) and 1, 2 and 8 ranks, the data for an ncclFusedAuto rule.
set -u
source scripts/gpu_call.sh
gc_init A
T="gpu/test_gemm*.cu;gpu/test_moe_*.cu;gpu/test_fused_gemm_coll.cu"
GC_BUILD_S=300 gc_build /tmp/ba "$T" mk_gpu_tests bench_moe_threads_bench
gc_tests /tmp/ba 'Gemm*:*Moe*:*FusedGemmColl*' 390 180
R="--reps 6 --warmup 1 --trials 5"
gc_moe_bench /tmp/ba ffn4 450 60 --ffn --ranks 4 $R --shapes \
  7168:2048:256:8:128,7168:2048:256:8:512,4096:1536:128:8:128,4096:1536:128:8:1024,2048:1408:64:6:128,2048:1408:64:6:512,2048:1408:64:6:1024
gc_moe_bench /tmp/ba ffn1 480 30 --ffn --ranks 1 $R --shapes \
  7168:2048:256:8:512,7168:2048:256:8:4096,2048:1408:64:6:512,2048:1408:64:6:4096
gc_moe_bench /tmp/ba ffn8 520 40 --ffn --ranks 8 $R --shapes \
  7168:2048:256:8:256,7168:2048:256:8:1024,2048:1408:64:6:256,2048:1408:64:6:2048
gc_moe_bench /tmp/ba ffn2 545 25 --ffn --ranks 2 $R --shapes \
  7168:2048:256:8:1024,2048:1408:64:6:1024
gc_moe_bench /tmp/ba dg4 575 30 --ranks 4 $R --shapes \
  7168:4096:256:8:512,7168:4096:256:8:4096,2048:2816:64:6:512
