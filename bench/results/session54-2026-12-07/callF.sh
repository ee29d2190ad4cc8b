#!/usr/bin/env bash
# Session 54, call F: call E cut to ~400 s (five failed starts spent the rest of the budget): the
# library and bench_gemm_bench, the grouped variants at 32 x 4096 (2048 -> 7168, 7168 -> 2048),
# grouped_bench.py against torch._grouped_mm with the grouped settings on, the 16 x 8192 variants,
# then grouped_bench.py with the defaults. No tests (GemmGrouped.BandsAndStoreHint not run).
set -u
source scripts/gpu_call.sh
gc_init F
GC_BUILD_S=260 gc_build /tmp/bd "gpu/test_gemm_grouped.cu" bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
C=$(cat COMMIT_SNAP)
gc_run g32 $((T + 50)) 50 10 1 "grouped|x.*engine  " $B --groups 32 --claim --groupm 32 --hint \
  --shapes 131072x7168x2048,131072x2048x7168 --reps 6 --commit "$C"
gc_run torch_on $((T + 140)) 90 30 0 "^\||rror" env MKERNEL_GEMM_GROUP_BAND=64 \
  MKERNEL_GEMM_GROUP_HINT=1 MKERNEL_GEMM_GROUP_CLAIM=1 python3 bench/grouped_bench.py \
  --build /tmp/bd --out "$GC_L/torch_on" --rounds 1 --reps 10
gc_run g16 $((T + 170)) 30 10 1 "grouped|x.*engine  " $B --groups 16 --claim --groupm 64 --hint \
  --shapes 131072x1408x2048 --reps 6 --commit "$C"
gc_run torch_off $((T + 260)) 90 30 0 "^\||rror" python3 bench/grouped_bench.py \
  --build /tmp/bd --out "$GC_L/torch_off" --rounds 1 --reps 10
gc_tar
