#!/usr/bin/env bash
# Session 54, call G: what ~230 s of device time holds after six failed starts: the library and
# bench_gemm_bench, then the grouped variants at 32 x 4096 rows (2048 -> 7168, 7168 -> 2048) in one
# process, interleaved and checked against the grouped default; then 16 x 8192 if time is left.
set -u
source scripts/gpu_call.sh
gc_init G
GC_BUILD_S=190 gc_build /tmp/bd "gpu/test_gemm_grouped.cu" bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
C=$(cat COMMIT_SNAP)
gc_run g32 $((T + 45)) 45 10 1 "grouped|x.*engine  " $B --groups 32 --claim --groupm 32 --hint \
  --shapes 131072x7168x2048,131072x2048x7168 --reps 5 --commit "$C"
gc_run g16 $((T + 70)) 25 10 1 "grouped|x.*engine  " $B --groups 16 --claim --groupm 64 --hint \
  --shapes 131072x1408x2048 --reps 5 --commit "$C"
gc_tar
