#!/usr/bin/env bash
# Session 55, call H: session 54's callH_next (issue 12's clock question: ncu with free clocks over
# every engine and cuBLAS launch at 8192 x 8192 x 1024 and 16384 x 8192 x 1024: duration, SM clock,
# L2 read sectors and throughput), then issue 13: which kernel, grid and block torch._grouped_mm
# runs at the three grouped shapes (call E found the engine 0.91-0.95 of it on this H100), and the
# engine's grouped kernel beside it at free clocks.
set -u
source scripts/gpu_call.sh
gc_init H
GC_BUILD_S=260 gc_build /tmp/bd "gpu/test_gemm_grouped.cu" bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
P=bench/results/session55-2026-12-07/torch_gmm_probe.py
G=launch__grid_size,launch__block_size,launch__cluster_dim_x,launch__cluster_dim_y
G=$G,launch__shared_mem_per_block_dynamic,launch__registers_per_thread,gpu__time_duration.sum
G=$G,sm__cycles_elapsed.avg.per_second,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum
for s in "32 4096 2048 7168" "32 4096 7168 2048" "16 8192 2048 1408"; do
  gc_run "torch_${s// /_}" $((T + 40)) 30 10 0 "Kernel|kernel|launch__|gpu__time|per_second|lts__|dram__" \
    ncu --clock-control none --launch-skip 2 --launch-count 1 --metrics "$G" python3 $P $s
done
gc_tar
gc_run eng_grouped $((T + 80)) 40 10 0 "gemmKernel|Grouped|launch__|gpu__time|per_second|lts__|dram__" \
  ncu --clock-control none --kernel-name "regex:[Gg]emm|[Gg]rouped" --launch-skip 4 --launch-count 2 \
  --metrics "$G" $B --groups 32 --shapes 131072x7168x2048 --reps 2
gc_tar
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,lts__t_sectors_srcunit_tex_op_read.sum
M=$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum
for s in 8192x8192x1024 16384x8192x1024; do
  gc_run "free_$s" $((T + 200)) 60 20 0 "gemmKernel|nvjet|gpu__time|per_second|lts__|dram__" \
    ncu --clock-control none --kernel-name "regex:gemmKernel|nvjet|xmma|cutlass" \
    --launch-count 90 --metrics "$M" $B --shapes $s --reps 2
done
gc_tar
