#!/usr/bin/env bash
# Issue 13, the grouped GEMM at its three shapes: the raster band of grouped GEMMs
# (MKERNEL_GEMM_GROUP_BAND; it also reaches the units, ping-pong and wide variants, which take
# groupM 0) swept with every grouped pipeline side by side, twice, interleaved; then the 1-D
# raster (MKERNEL_GEMM_GROUP_RASTER 0); then grouped_bench.py (torch._grouped_mm) at the defaults.
set -u
source scripts/gpu_call.sh
gc_init B
GC_BUILD_S=300 gc_build /tmp/bd "gpu/test_gemm_grouped*.cu" bench_gemm_bench
gc_tar
B=/tmp/bd/bench/bench_gemm_bench
for pass in 1 2; do
  for band in 4 8 16 32; do
    gc_run "b${band}p${pass}" 420 30 10 1 "grouped|rror" env MKERNEL_GEMM_GROUP_BAND=$band \
      $B --reps 6 --pipelines --groups 32 --shapes 131072x7168x2048,131072x2048x7168
    gc_run "b${band}g16p${pass}" 420 30 10 1 "grouped|rror" env MKERNEL_GEMM_GROUP_BAND=$band \
      $B --reps 6 --pipelines --groups 16 --shapes 131072x1408x2048
  done
done
for band in 8 32; do
  gc_run "r0b${band}" 440 30 10 1 "grouped|rror" env MKERNEL_GEMM_GROUP_RASTER=0 \
    MKERNEL_GEMM_GROUP_BAND=$band $B --reps 6 --pipelines --groups 32 \
    --shapes 131072x7168x2048,131072x2048x7168
done
gc_run torch 560 110 30 0 "^\||rror" python3 bench/grouped_bench.py \
  --build /tmp/bd --out "$GC_L/torch" --rounds 2 --reps 10
gc_tar
