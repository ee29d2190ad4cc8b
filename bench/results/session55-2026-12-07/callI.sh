#!/usr/bin/env bash
# Session 55, call I: grouped GEMMs as CTA pairs (new: GemmArgs::cluster 2 for grouped GEMMs, each
# group's row tiles paired, the group's B tile loaded half by each CTA and multicast). Why: call E
# found torch._grouped_mm 1.06-1.09x the engine's grouped GEMM on this H100, and torch's source
# (GroupMM.cu) runs these shapes on CUTLASS's cooperative 128x256x64 kernel with 2x1 clusters:
# the engine's tile, paired.
# 1. GemmGrouped.* (CtaPairs new) - correctness first.
# 2. bench_gemm_bench --groups --clusters (--pipelines: the wide staging paired too), every
#    variant checked element by element against the grouped default.
# 3. grouped_bench.py (torch side by side) with MKERNEL_GEMM_CLUSTER=2, then the default.
# 4. torch._grouped_mm's kernel under ncu (name, grid, cluster, clock, L2 sectors).
# 5. Issue 12: the engine's own ping-pong pipelines (3, 4) and pairs at 8192x8192x1024 beside
#    cuBLAS-best today (call H: cuBLAS's fastest there is a ping-pong of 176-wide units).
set -u
source scripts/gpu_call.sh
gc_init I
GC_BUILD_S=330 gc_build /tmp/bd "gpu/test_gemm_grouped.cu" bench_gemm_bench mk_gpu_tests
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
C=$(cat COMMIT_SNAP)
gc_tests /tmp/bd 'GemmGrouped.*' $((T + 40)) 40
gc_run g32 $((T + 110)) 70 20 1 "grouped|x.*engine  |pair" $B --groups 32 --clusters --pipelines \
  --shapes 131072x7168x2048,131072x2048x7168 --reps 8 --commit "$C"
gc_run torch_pairs $((T + 150)) 40 20 0 "^\||rror" env MKERNEL_GEMM_CLUSTER=2 \
  python3 bench/grouped_bench.py --build /tmp/bd --out "$GC_L/torch_pairs" --rounds 1 --reps 10
gc_run torch_def $((T + 190)) 40 20 0 "^\||rror" python3 bench/grouped_bench.py \
  --build /tmp/bd --out "$GC_L/torch_def" --rounds 1 --reps 10
gc_run g16 $((T + 230)) 40 15 1 "grouped|x.*engine  |pair" $B --groups 16 --clusters \
  --shapes 131072x1408x2048 --reps 8 --commit "$C"
P=bench/results/session55-2026-12-07/torch_gmm_probe.py
G=launch__grid_size,launch__block_size,launch__cluster_dim_x,launch__cluster_dim_y
G=$G,launch__shared_mem_per_block_dynamic,launch__registers_per_thread,gpu__time_duration.sum
G=$G,sm__cycles_elapsed.avg.per_second,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum
for s in "32 4096 2048 7168" "32 4096 7168 2048"; do
  gc_run "torch_${s// /_}" $((T + 290)) 25 10 0 "device_kernel|launch__|gpu__time|per_second|lts__|dram__" \
    ncu --clock-control none --kernel-name regex:device_kernel --launch-count 2 --metrics "$G" \
    python3 $P $s
done
gc_run pp $((T + 350)) 50 20 1 "x.*engine  |ping|pair|pipeline" $B --pipelines --clusters \
  --shapes 8192x8192x1024 --reps 10 --commit "$C"
gc_tar
