#!/usr/bin/env bash
# Session 61 call A (session 60's calls B and C, which got no machine, in one):
# 1. GemmGrouped.CarriedEpilogueSetting with its default-setting block (MKERNEL_GEMM_GROUP_CARRY
#    2: the carried epilogue at K > 4096 or N >= 4096 with TMA-storable D; K 4160 and N 4096
#    carried, 1408 x 200 on the tiles) and LastGroupEndsAtM (its automatic case).
# 2. grouped_bench.py: the new default, MKERNEL_GEMM_GROUP_CARRY=0 (the tiles) and =1 (the carry
#    everywhere) in the same rounds (--engine-env, session 60), three rounds, at issue 13's three
#    shapes and the small model's GEMM2 (64 x 1024 rows, 1408 -> 2048); session 61 adds the units
#    (MKERNEL_GEMM_GROUP_UNITS=1), 1.003 of torch at 2048 -> 7168 in session 60.
# 3. A racecheck of CarriedEpilogueSetting with a longer cap (session 60's 40 s cut it short).
set -u
source scripts/gpu_call.sh
gc_init A
GC_BUILD_S=340 gc_build /tmp/bf "gpu/test_gemm_grouped.cu" mk_gpu_tests bench_gemm_bench
gc_tar
T=$(gc_el)
gc_tests /tmp/bf 'GemmGrouped.CarriedEpilogueSetting:GemmGrouped.LastGroupEndsAtM' $((T + 30)) 30
S=32:4096:7168:2048,16:8192:2048:1408,32:4096:2048:7168,64:1024:1408:2048
gc_run grouped $((T + 165)) 135 10 0 "^\||rror" python3 bench/grouped_bench.py --build /tmp/bf \
  --shapes $S --out "$GC_L/grouped" --rounds 3 --reps 10 \
  --engine-env tiles:MKERNEL_GEMM_GROUP_CARRY=0 --engine-env carry:MKERNEL_GEMM_GROUP_CARRY=1 \
  --engine-env units:MKERNEL_GEMM_GROUP_UNITS=1
gc_run racecheck $((T + 230)) 60 15 0 "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED" \
  compute-sanitizer --tool racecheck /tmp/bf/tests/mk_gpu_tests \
  --gtest_filter='GemmGrouped.CarriedEpilogueSetting'
gc_tar
