#!/usr/bin/env bash
# Session 55, call I. Call H found (H100, free clocks) cuBLAS's fastest kernels at K = 1024 to be
# ping-pong nvjet 176x128 / 168x128, 5 stages, cluster 1x2 (174 us at 8192x8192x1024 against the
# engine's 190 and the cooperative nvjets' 189-199), and torch._grouped_mm (CUTLASS cooperative
# 128x256x64, cluster 2x1, per torch's GroupMM.cu) 0.91-0.95 ahead of the engine's grouped GEMM.
# 1. The engine's existing variants at free clocks (--pipelines: ping-pong 3 and 4; --clusters:
#    CTA pairs) at 8192x8192x1024 and the grouped GEMM's total shapes.
# 2. torch._grouped_mm's kernel under ncu (name, grid, cluster, clock, L2 sectors), and the engine's
#    grouped kernel beside it.
set -u
source scripts/gpu_call.sh
gc_init I
GC_BUILD_S=260 gc_build /tmp/bd "gpu/test_gemm_grouped.cu" bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
C=$(cat COMMIT_SNAP)
P=bench/results/session55-2026-12-07/torch_gmm_probe.py
G=launch__grid_size,launch__block_size,launch__cluster_dim_x,launch__cluster_dim_y
G=$G,launch__shared_mem_per_block_dynamic,launch__registers_per_thread,gpu__time_duration.sum
G=$G,sm__cycles_elapsed.avg.per_second,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum
G=$G,lts__throughput.avg.pct_of_peak_sustained_elapsed
for s in "32 4096 2048 7168" "32 4096 7168 2048"; do
  gc_run "torch_${s// /_}" $((T + 30)) 25 10 0 "device_kernel|launch__|gpu__time|per_second|lts__|dram__" \
    ncu --clock-control none --kernel-name regex:device_kernel --launch-count 3 --metrics "$G" \
    python3 $P $s
done
gc_run eng_grouped $((T + 70)) 40 10 0 "xx" \
  ncu --clock-control none --kernel-name regex:gemmKernel --launch-count 40 \
  --metrics "$G" $B --groups 32 --shapes 131072x7168x2048 --reps 2
gc_run variants $((T + 300)) 220 30 1 "x.*engine  |pipeline|pair|cluster|ping" $B --pipelines --clusters \
  --shapes 8192x8192x1024,131072x7168x2048,131072x2048x7168 --reps 8 --commit "$C"
gc_tar
