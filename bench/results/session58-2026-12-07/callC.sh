#!/usr/bin/env bash
# The grouped ping-pong band (MKERNEL_GEMM_GROUP_PING_BAND, default 4 after call B's sweep):
# 1. the whole test binary built (call D reuses it); Gemm* (GemmGrouped runs pipelines 3 and 4
#    grouped, which now take bands of 4);
# 2. the band swept once more, with bands of 1 and 2 added (4 is the new default, 8 the old),
#    twice, interleaved, at issue 13's three grouped shapes, every grouped pipeline side by side.
set -u
source scripts/gpu_call.sh
gc_init C
GC_BUILD_S=400 gc_build /tmp/bt "gpu/*.cc;gpu/*.cu" mk_gpu_tests bench_gemm_bench
gc_tar
T=$(gc_el)
gc_tests /tmp/bt 'Gemm*' $((T + 80)) 80
B=/tmp/bt/bench/bench_gemm_bench
for pass in 1 2; do
  for band in 1 2 4 8; do
    gc_run "pb${band}p${pass}" 560 30 10 1 "grouped|rror" env MKERNEL_GEMM_GROUP_PING_BAND=$band \
      $B --reps 6 --pipelines --groups 32 --shapes 131072x7168x2048,131072x2048x7168
    gc_run "pb${band}g16p${pass}" 570 30 10 1 "grouped|rror" \
      env MKERNEL_GEMM_GROUP_PING_BAND=$band $B --reps 6 --pipelines --groups 16 \
      --shapes 131072x1408x2048
  done
done
gc_tar
