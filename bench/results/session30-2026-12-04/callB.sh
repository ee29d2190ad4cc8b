#!/usr/bin/env bash
# Session 30, call B: call A's two launches (wide tiles, then tall ones over the last column
# block) gained nothing: the second launch read all of A again from memory. Now the tall tiles run
# in the same launch, each band's right after its wide ones, and every tile of that kernel runs
# as two m64n128 wgmmas a k16 step. The GEMM and MoE tests (the grouped suite's tall cases: N 72,
# 264, 300, 384, 520, 640, 1408), the grouped GEMM against torch._grouped_mm with the tall tail
# off and on (twice, alternating), and the plain engine against cuBLAS at two shapes.
set -u
source scripts/gpu_call.sh
gc_init B
T="gpu/test_gemm*.cu;gpu/test_moe_*.cu"
GC_BUILD_S=300 gc_build /tmp/bb "$T" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bb 'Gemm*:*Moe*' 360 150
S="16:8192:2048:1408,64:2048:2048:1408,32:4096:7168:2048"
i=0
for tall in 0 1 0 1; do
  i=$((i + 1))
  MKERNEL_GEMM_TALL_TAIL=$tall gc_run "grouped${i}_t$tall" 540 60 30 0 "^\||engine|target|Error|error" \
    python3 bench/grouped_bench.py --build /tmp/bb --out "$GC_L/g_t$tall" --shapes "$S" --rounds 2
done
gc_run plain 580 40 15 1 "^\||engine" /tmp/bb/bench/bench_gemm_bench --shapes 8192x8192x8192,8192x8192x1024 --reps 10
gc_tar
