#!/usr/bin/env bash
# Session 57's unrun next_callF, first half: what session 57 built after its last call.
# 1. Gemm* (every GEMM test file): GemmGrouped.RandomGroupsLayoutsTypes' pipeline 4 cases (the
#    grouped unit walk), GemmGrouped.UnitWalkSetting (MKERNEL_GEMM_GROUP_UNITS=1), GemmSmall
#    running pipeline 4 with both epilogues; then the Shapes/FusedGemmColl cases.
# 2. bench_gemm_bench --groups --pipelines at issue 13's shapes: the grouped '192-column units'
#    line against the grouped default, side by side.
set -u
source scripts/gpu_call.sh
gc_init A
GC_BUILD_S=330 gc_build /tmp/bd "gpu/test_gemm*.cu;gpu/test_fused_gemm_coll.cu" mk_gpu_tests \
  bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
gc_tests /tmp/bd 'Gemm*:*FusedGemmColl*' $((T + 100)) 100
gc_run gpipes $((T + 175)) 70 20 1 "grouped|rror" $B --reps 8 --pipelines --groups 32 \
  --shapes 131072x2048x7168,131072x7168x2048
gc_run gpipes16 $((T + 215)) 40 15 1 "grouped|rror" $B --reps 8 --pipelines --groups 16 \
  --shapes 131072x1408x2048
gc_tar
