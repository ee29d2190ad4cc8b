#!/usr/bin/env bash
# Session 30, call C: call B's tall-tail kernel walked 6x its tiles (numTilesOf multiplied the
# prefix, which counts tiles there, by tilesN: 115 TFLOP/s); fixed. The same steps as call B.
set -u
source scripts/gpu_call.sh
gc_init C
T="gpu/test_gemm*.cu;gpu/test_moe_*.cu"
GC_BUILD_S=300 gc_build /tmp/bc "$T" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bc 'Gemm*:*Moe*' 360 150
S="16:8192:2048:1408,64:2048:2048:1408,32:4096:7168:2048"
i=0
for tall in 0 1 0 1; do
  i=$((i + 1))
  MKERNEL_GEMM_TALL_TAIL=$tall gc_run "grouped${i}_t$tall" 540 60 30 0 "^\||engine|target|Error|error" \
    python3 bench/grouped_bench.py --build /tmp/bc --out "$GC_L/g_t$tall" --shapes "$S" --rounds 2
done
gc_run plain 580 40 15 1 "^\||engine" /tmp/bc/bench/bench_gemm_bench --shapes 8192x8192x8192,8192x8192x1024 --reps 10
gc_tar
