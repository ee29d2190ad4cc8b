#!/usr/bin/env bash
# Session 60 call B. Call A (H100) put the grouped carried epilogue (MKERNEL_GEMM_GROUP_CARRY=1)
# ahead of the grouped default (tiles) at K 7168 -> 2048 (+1.7%) and 2048 -> 7168 (+2.3%) in
# grouped_bench, and ahead at all three shapes in bench --pipelines (1.013-1.060), but behind at
# 16 x 8192, 2048 -> 1408 in grouped_bench (597 against 661 TFLOP/s). This call settles that
# shape before the default changes: grouped_bench with the carry off and on, interleaved, three
# times each, at issue 13's three shapes and the small model's GEMM2 (64 x 1024 rows, 1408 ->
# 2048). Bench only (no test binary: call A ran every GemmGrouped test, 7/7).
set -u
source scripts/gpu_call.sh
gc_init B
GC_BUILD_S=310 gc_build /tmp/bf "none" bench_gemm_bench
gc_tar
T=$(gc_el)
S=32:4096:7168:2048,16:8192:2048:1408,32:4096:2048:7168,64:1024:1408:2048
for pass in 1 2; do
  for c in 0 1; do
    gc_run "c${c}p${pass}" $((T + 35 * (2 * pass + c - 1))) 35 10 0 "^\||rror" \
      env MKERNEL_GEMM_GROUP_CARRY=$c python3 bench/grouped_bench.py --build /tmp/bf \
      --shapes $S --out "$GC_L/c${c}p${pass}" --rounds 2 --reps 10
  done
done
gc_tar
