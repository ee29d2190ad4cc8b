#!/usr/bin/env bash
# Session 30, call D: call C's tall-tail kernel ran every tile as two m64n128 wgmmas a k16 step
# and lost more than the tall tiles saved (0.84 of torch against 0.89-0.94 off). Now a tall tile
# is computed transposed (D^T = B_tail . A^T) with the same m64n256k16 wgmma, so wide tiles keep
# their loop; B [N,K] only. The same steps as call B.
set -u
source scripts/gpu_call.sh
gc_init D
T="gpu/test_gemm*.cu;gpu/test_moe_*.cu"
GC_BUILD_S=300 gc_build /tmp/bd "$T" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bd 'Gemm*:*Moe*' 360 150
S="16:8192:2048:1408,64:2048:2048:1408,32:4096:7168:2048"
i=0
for tall in 0 1 0 1; do
  i=$((i + 1))
  MKERNEL_GEMM_TALL_TAIL=$tall gc_run "grouped${i}_t$tall" 540 60 30 0 "^\||engine|target|Error|error" \
    python3 bench/grouped_bench.py --build /tmp/bd --out "$GC_L/g_t$tall" --shapes "$S" --rounds 2
done
gc_run plain 580 40 15 1 "^\||engine" /tmp/bd/bench/bench_gemm_bench --shapes 8192x8192x8192,8192x8192x1024 --reps 10
gc_tar
