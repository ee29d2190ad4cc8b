#!/usr/bin/env bash
# The next session's first call (session 63's call B, which never got a machine): 176-column
# units (pipeline 4 with MKERNEL_GEMM_UNIT_NARROW; never run on a GPU).
# 1. Build with -DMK_BUILD_F16=OFF (call A's full build with the split units took 212 s, more
#    than session 62's 161 s): build_times.log and the wall time.
# 2. The unit walk's tests (PingPong192 now also on 176-column units) and every grouped test
#    (NarrowUnits new; fp16 cases skipped in this build).
# 3. grouped_bench at N 1408 (16 x 8192 and 64 x 2048 rows, K 2048): the default (the tiles)
#    beside the units at 176 (setting 2's exact fit) and at 192 columns.
# 4. The fused MoE layer, 4 ranks as threads: call A read 1.405x the sequential path at H 7168,
#    4096 tokens a rank (session 27-28 on the H200: 1.11-1.23x); again, with 8192 tokens and the
#    small model.
# 5. bench_gemm_bench on the plain GEMM at N 1408: pipeline 0's choice under
#    MKERNEL_GEMM_UNIT_NARROW 2 (176-column units, which fill the grid) against 0 (at 131072 x
#    1408 x 2048 on 132 SMs the 192-column units fail unitsFill, so 0 runs the carried
#    epilogue): what setting 2 as the default would change, not 176 against 192 units; two alternating passes.
set -u
source scripts/gpu_call.sh
gc_init A
GC_CMAKE_ARGS=-DMK_BUILD_F16=OFF GC_BUILD_S=300 gc_build /tmp/bf "gpu/test_gemm*.cu" \
  mk_gpu_tests bench_gemm_bench bench_moe_threads_bench
head -6 "$GC_L/build_times.log"
gc_tar
T=$(gc_el)
gc_tests /tmp/bf 'GemmCorrectness.PingPong192:GemmGrouped.*' $((T + 120)) 120
S=16:8192:2048:1408,64:2048:2048:1408
gc_run grouped $((T + 230)) 100 10 0 "^\||rror" python3 bench/grouped_bench.py --build /tmp/bf \
  --shapes $S --out "$GC_L/grouped" --rounds 5 --reps 10 \
  --engine-env u176:MKERNEL_GEMM_GROUP_UNITS=1,MKERNEL_GEMM_UNIT_NARROW=2 \
  --engine-env u192:MKERNEL_GEMM_GROUP_UNITS=1,MKERNEL_GEMM_UNIT_NARROW=0
gc_moe_bench /tmp/bf ffn4 $((T + 310)) 80 --ffn --ranks 4 --reps 3 --warmup 1 --trials 3 \
  --shapes 7168:2048:256:8:4096,7168:2048:256:8:8192,2048:1408:64:6:4096
for pass in 1 2; do
  for w in 2 0; do
    gc_run "plain_n${w}_$pass" $((T + 380)) 40 10 0 "^ +[0-9]+ x|rror" \
      env MKERNEL_GEMM_UNIT_NARROW=$w /tmp/bf/bench/bench_gemm_bench \
      --shapes 131072x1408x2048,16384x1408x1024 --reps 6
  done
done
gc_tar
