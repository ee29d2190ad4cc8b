#!/usr/bin/env bash
# Session 30, call A: tall tiles for a grouped GEMM's last column block (MKERNEL_GEMM_TALL_TAIL,
# default 1: N % 256 in 1..128 runs that block as 256x128 tiles in a second launch). The GEMM and
# MoE tests (the grouped suite has tall cases: N 72, 264, 300, 384, 520, 640, 1408), then the
# grouped GEMM against torch._grouped_mm with tall tiles off and on, and the plain engine
# against cuBLAS (every kernel's epilogue was touched) at two shapes.
set -u
source scripts/gpu_call.sh
gc_init A
T="gpu/test_gemm*.cu;gpu/test_moe_*.cu"
GC_BUILD_S=300 gc_build /tmp/ba "$T" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/ba 'Gemm*:*Moe*' 360 150
S="16:8192:2048:1408,64:2048:2048:1408,32:4096:7168:2048"
for tall in 0 1 0 1; do
  MKERNEL_GEMM_TALL_TAIL=$tall gc_run "grouped_t$tall" 540 60 30 0 "^\||engine|target|Error|error" \
    python3 bench/grouped_bench.py --build /tmp/ba --out "$GC_L/g_t$tall" --shapes "$S" --rounds 2
done
gc_run plain 580 40 15 1 "^\||engine" /tmp/ba/bench/bench_gemm_bench --shapes 8192x8192x8192,8192x8192x1024 --reps 10
gc_tar
