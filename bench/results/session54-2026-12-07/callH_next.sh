#!/usr/bin/env bash
# For the next session (not run in session 54): issue 12's clock question. Call DA found the
# engine as fast as cuBLAS under ncu's locked clocks (224 us at 8192 x 8192 x 1024) while it runs
# 0.946-0.951 of cuBLAS-best in timed runs. Here ncu leaves the clocks free (--clock-control none)
# and profiles every engine and cuBLAS launch of a short bench run: each kernel's duration, SM
# clock, L2 read sectors and L2 throughput, so the fastest cuBLAS candidate and the engine are
# compared at the clocks they really get. Then call E's grouped steps (copy them in after this).
set -u
source scripts/gpu_call.sh
gc_init H
GC_BUILD_S=260 gc_build /tmp/bd "gpu/test_gemm_grouped.cu" bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,lts__t_sectors_srcunit_tex_op_read.sum
M=$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum
for s in 8192x8192x1024 16384x8192x1024; do
  gc_run "free_$s" $((T + 120)) 60 20 0 "gemmKernel|nvjet|gpu__time|per_second|lts__|dram__" \
    ncu --clock-control none --kernel-name "regex:gemmKernel|nvjet|xmma|cutlass" \
    --launch-count 90 --metrics "$M" $B --shapes $s --reps 2
done
gc_tar
