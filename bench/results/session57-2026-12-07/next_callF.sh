#!/usr/bin/env bash
# For session 58 (not run in session 57: no device time left). What session 57 built after its
# last call, and issue 13's grouped lever:
# 1. Gemm* (every GEMM test file): GemmGrouped.RandomGroupsLayoutsTypes' new pipeline 4 cases
#    (the grouped unit walk), GemmGrouped.UnitWalkSetting (MKERNEL_GEMM_GROUP_UNITS=1),
#    GemmSmall running pipeline 4 with both epilogues; then the 39 Shapes/FusedGemmColl cases
#    that call E's filter missed.
# 2. bench_gemm_bench --groups --pipelines at issue 13's shapes: the grouped '192-column units'
#    line against the grouped default, side by side.
# 3. grouped_bench.py against torch._grouped_mm, the grouped default and then the unit walk
#    (MKERNEL_GEMM_GROUP_UNITS=1 reaches the engine's subprocess), three rounds each.
set -u
source scripts/gpu_call.sh
gc_init F
GC_BUILD_S=330 gc_build /tmp/bd "gpu/test_gemm*.cu;gpu/test_fused_gemm_coll.cu" mk_gpu_tests \
  bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
gc_tests /tmp/bd 'Gemm*:*FusedGemmColl*' $((T + 90)) 90
gc_run gpipes $((T + 160)) 70 20 1 "grouped|rror" $B --reps 8 --pipelines --groups 32 \
  --shapes 131072x2048x7168,131072x7168x2048
gc_run gpipes16 $((T + 200)) 40 15 1 "grouped|rror" $B --reps 8 --pipelines --groups 16 \
  --shapes 131072x1408x2048
gc_run tiles $((T + 300)) 100 20 0 "^\||rror" python3 bench/grouped_bench.py \
  --build /tmp/bd --out "$GC_L/tiles" --rounds 3 --reps 10
gc_run units $((T + 400)) 100 20 0 "^\||rror" env MKERNEL_GEMM_GROUP_UNITS=1 \
  python3 bench/grouped_bench.py --build /tmp/bd --out "$GC_L/units" --rounds 3 --reps 10
gc_tar
