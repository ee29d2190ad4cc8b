#!/usr/bin/env bash
# Session 62 call B.
# 1. The library, the grouped GEMM tests and bench_gemm_bench built with -DMK_BUILD_F16=OFF (the
#    option's first GPU-machine build, and the first with the GEMM instantiation units split by
#    B layout; build_times.log names the slowest units).
# 2. Every GemmGrouped test: the fp16 cases print "skipped" in this build, the bf16 ones run.
# 3. grouped_bench at the two shapes where torch still leads (call A, H100: 0.942 at 32 x 4096,
#    7168 -> 2048, the carried epilogue; 0.946 at 16 x 8192, 2048 -> 1408, the tiles), three
#    rounds (five were planned before the budget fell to 451 s), against L2 settings not yet
#    measured with the carried epilogue: bands of 16 and 32 (32 = a group's 4096 rows whole,
#    each expert's weights read once), claimed tiles, bands of 32 with claims, D evict-first.
# 4. Racecheck of the new GemmGrouped.SanitizerSized (one small case per grouped pipeline), with
#    what is left of 350 s.
set -u
source scripts/gpu_call.sh
gc_init B
GC_CMAKE_ARGS=-DMK_BUILD_F16=OFF GC_BUILD_S=200 gc_build /tmp/bf "gpu/test_gemm_grouped.cu" \
  mk_gpu_tests bench_gemm_bench
cat "$GC_L/build_times.log" | head -8
gc_tar
T=$(gc_el)
gc_tests /tmp/bf 'GemmGrouped.*' $((T + 35)) 35
zcat "$GC_L/tests.log.gz" | grep -c "skipped  \]"
S=32:4096:7168:2048,16:8192:2048:1408
gc_run grouped $((T + 125)) 90 10 0 "^\||rror" python3 bench/grouped_bench.py --build /tmp/bf \
  --shapes $S --out "$GC_L/grouped" --rounds 3 --reps 10 \
  --engine-env band16:MKERNEL_GEMM_GROUP_BAND=16 \
  --engine-env band32:MKERNEL_GEMM_GROUP_BAND=32 \
  --engine-env claim:MKERNEL_GEMM_GROUP_CLAIM=1 \
  --engine-env band32claim:MKERNEL_GEMM_GROUP_BAND=32,MKERNEL_GEMM_GROUP_CLAIM=1 \
  --engine-env hint:MKERNEL_GEMM_GROUP_HINT=1
gc_tar
R=$((350 - $(gc_el)))
[ "$R" -gt 120 ] && R=120
gc_run racecheck 350 "$R" 30 0 "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED" \
  compute-sanitizer --tool racecheck /tmp/bf/tests/mk_gpu_tests \
  --gtest_filter='GemmGrouped.SanitizerSized'
gc_tar
