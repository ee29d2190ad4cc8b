#!/usr/bin/env bash
# Session 60 call A (session 59's callA.sh, which never got a machine). What session 58 built after its
# last call, and issue 13's grouped levers side by side:
# 1. GemmGrouped (every grouped test): the carried epilogue with groups (pipeline 6 cases in
#    RandomGroupsLayoutsTypes and DynamicTileClaim, CarriedEpilogueSetting under
#    MKERNEL_GEMM_GROUP_CARRY=1, static and claimed), and the units in their own bands of 2
#    (MKERNEL_GEMM_GROUP_UNIT_BAND, the default since 2d30c7c); session 59's
#    LastGroupEndsAtM (M inside the last group's last tile, every grouped pipeline); racecheck
#    of CarriedEpilogueSetting.
# 2. bench_gemm_bench --pipelines --groups at issue 13's three shapes, once (device time is short): the grouped
#    'carried epilogue' line against the default, the units and the ping-pong.
# 3. grouped_bench.py against torch._grouped_mm: the default, MKERNEL_GEMM_GROUP_CARRY=1 and
#    MKERNEL_GEMM_GROUP_UNITS=1, two rounds each. (Session 58's call E hit a 235 s build cap:
#    the library and bench alone take ~240 s there.)
set -u
source scripts/gpu_call.sh
gc_init A
GC_BUILD_S=330 gc_build /tmp/bf "gpu/test_gemm_grouped.cu" mk_gpu_tests bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bf/bench/bench_gemm_bench
gc_tests /tmp/bf 'GemmGrouped*' $((T + 60)) 60
gc_run racecheck $((T + 100)) 40 15 0 "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED" \
  compute-sanitizer --tool racecheck /tmp/bf/tests/mk_gpu_tests \
  --gtest_filter='GemmGrouped.CarriedEpilogueSetting'
for pass in 1; do
  gc_run "g32p${pass}" $((T + 125)) 20 8 1 "grouped|rror" $B --reps 6 --pipelines --groups 32 \
    --shapes 131072x7168x2048,131072x2048x7168
  gc_run "g16p${pass}" $((T + 145)) 15 8 1 "grouped|rror" $B --reps 6 --pipelines --groups 16 \
    --shapes 131072x1408x2048
done
gc_run carry $((T + 175)) 30 10 0 "^\||rror" env MKERNEL_GEMM_GROUP_CARRY=1 \
  python3 bench/grouped_bench.py --build /tmp/bf --out "$GC_L/carry" --rounds 2 --reps 10
gc_run tiles $((T + 205)) 30 10 0 "^\||rror" python3 bench/grouped_bench.py \
  --build /tmp/bf --out "$GC_L/tiles" --rounds 2 --reps 10
gc_run units $((T + 235)) 30 10 0 "^\||rror" env MKERNEL_GEMM_GROUP_UNITS=1 \
  python3 bench/grouped_bench.py --build /tmp/bf --out "$GC_L/units" --rounds 2 --reps 10
gc_tar
