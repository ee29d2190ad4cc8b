#!/usr/bin/env bash
# Session 62 call A (session 61's next_callA.sh, unchanged below this header): the units'
# default (MKERNEL_GEMM_GROUP_UNITS 2: K <= 2048 and N >= 2048, from session 61 call A's rounds)
# on the GPU.
# 1. Every GemmGrouped test (CarriedEpilogueSetting's default block now expects the units at
#    K 136 / 2048 with N 4096 / 2056 and the carry at K 2056, N 4096).
# 2. grouped_bench.py: the new default against session 60's (carry: MKERNEL_GEMM_GROUP_UNITS=0)
#    and the tiles (both settings 0), in the same rounds, three rounds, call A's four shapes.
# 3. bench_moe_threads_bench at the small model's dispatch + GEMM (H 2048 -> N 2816, 4 ranks): its
#    sequential GEMM now takes the units, and the bench stops if the fused y (the deep ring with
#    row hooks) is not bit for bit the sequential y (session 61's review: no test reaches the
#    units from the MoE paths).
# 4. bench_gemm_bench --groups 32 at issue 13's two 32-group shapes: the plain engine, cuBLAS and
#    the grouped default in one process, to tell whether the 3-4% torch keeps at 7168 -> 2048 is
#    the grouping's or the engine's at that shape.
# 5. A racecheck of CarriedEpilogueSetting with the time left (60 s cut it off twice).
set -u
source scripts/gpu_call.sh
gc_init A
GC_BUILD_S=340 gc_build /tmp/bf "gpu/test_gemm_grouped.cu" mk_gpu_tests bench_gemm_bench \
  bench_moe_threads_bench
gc_tar
T=$(gc_el)
gc_tests /tmp/bf 'GemmGrouped.*' $((T + 45)) 45
S=32:4096:7168:2048,16:8192:2048:1408,32:4096:2048:7168,64:1024:1408:2048
gc_run grouped $((T + 135)) 90 10 0 "^\||rror" python3 bench/grouped_bench.py --build /tmp/bf \
  --shapes $S --out "$GC_L/grouped" --rounds 3 --reps 10 \
  --engine-env carry:MKERNEL_GEMM_GROUP_UNITS=0 \
  --engine-env tiles:MKERNEL_GEMM_GROUP_UNITS=0,MKERNEL_GEMM_GROUP_CARRY=0
gc_tar
gc_moe_bench /tmp/bf dg4 $((T + 190)) 55 --ranks 4 --reps 3 --warmup 1 --trials 3 \
  --shapes 2048:2816:64:6:4096
gc_run plain $((T + 235)) 45 15 0 "^\||rror|differ" "/tmp/bf/bench/bench_gemm_bench" --groups 32 \
  --shapes 131072x2048x7168,131072x7168x2048 --reps 6 --out "$GC_L/plain.json"
R=$((585 - $(gc_el)))
if [ "$R" -gt 60 ]; then
  gc_run racecheck 585 "$R" 60 0 "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED" \
    compute-sanitizer --tool racecheck /tmp/bf/tests/mk_gpu_tests \
    --gtest_filter='GemmGrouped.CarriedEpilogueSetting'
fi
gc_tar
