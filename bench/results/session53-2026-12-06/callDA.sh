#!/usr/bin/env bash
# Session 53, call DA: the engine and cuBLAS side by side under ncu (clocks locked by ncu, so
# no power cap and no clock difference between them): duration, cycles, tensor-pipe activity,
# bytes from L2 into the SMs, L2 reads and writes, DRAM reads and writes, at the small-K shapes
# issue 12 still misses (8192x8192x1024, 16384x8192x1024) and at 8192^3 (where the two are
# level). Question: does the engine read more from DRAM than cuBLAS (L2 misses that lengthen the
# loads' latency, so a 4-stage ring at the same bytes a FLOP delivers less), or the same? Then
# the carried epilogue as CTA pairs (multicast: cuBLAS's kernel here is a 2-CTA cluster) at
# 8192x8192x1024 the same way, and a timed run of the shapes.
set -u
source scripts/gpu_call.sh
gc_init DA
# First (seconds): the conversions' issue rate (bench/cvt_rate.cu), whether converting a tile's
# 32768 accumulators is what the ~1000-cycle epilogue costs.
gc_nvcc bench/cvt_rate.cu /tmp/cvt_rate && gc_run cvt 60 30 5 1 "^\\|" /tmp/cvt_rate --commit "$(cat COMMIT_SNAP)"
GC_BUILD_S=300 gc_build /tmp/bd "gpu/test_gemm_dynamic.cu" bench_gemm_bench
gc_tar
B=/tmp/bd/bench/bench_gemm_bench
M=gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__cycles_elapsed.avg.per_second
M=$M,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum
M=$M,lts__t_sectors_op_write.sum,dram__bytes_read.sum,dram__bytes_write.sum
M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed
M=$M,launch__grid_size,launch__cluster_dim_x,launch__cluster_dim_y,smsp__cycles_active.avg
P="gemmKernel|nvjet|xmma|cutlass|Kernel|gpu__|sm__|l1tex__|lts__|dram__|launch__|rror"
n=0
for S in 8192x8192x1024 16384x8192x1024 8192x8192x8192; do
  n=$((n + 1))
  gc_run ncu_eng$n $((220 + 60 * n)) 50 15 0 "$P" ncu --kernel-name regex:gemmKernel \
    --launch-skip 2 --launch-count 1 --metrics "$M" $B --shapes $S --reps 2
  gc_run ncu_cub$n $((250 + 60 * n)) 50 15 0 "$P" ncu --kernel-name "regex:nvjet|xmma|cutlass" \
    --launch-skip 1 --launch-count 1 --metrics "$M" $B --shapes $S --reps 2
done
gc_run ncu_pairs 460 60 20 0 "$P" ncu --kernel-name regex:gemmKernel --launch-count 10 \
  --metrics "$M" $B --shapes 8192x8192x1024 --reps 1 --carry --clusters
gc_run timed 495 30 8 1 "x.*(engine  |carried)|geomean" $B \
  --shapes 8192x8192x1024,16384x8192x1024,8192x8192x8192 --reps 15 --carry --clusters \
  --commit "$(cat COMMIT_SNAP)"
gc_tar
# The grouped GEMM (issue 13's experts) on claimed tiles against its static walk (the plain GEMM
# gained 1.3-4% from claims; grouped GEMMs never claimed): the grouped shapes.
gc_run grouped32 540 40 10 1 "grouped|x.*engine  " $B --groups 32 --claim \
  --shapes 131072x7168x2048,131072x2048x7168 --reps 8 --commit "$(cat COMMIT_SNAP)"
gc_run grouped16 560 20 8 1 "grouped|x.*engine  " $B --groups 16 --claim \
  --shapes 131072x1408x2048 --reps 8 --commit "$(cat COMMIT_SNAP)"
gc_tar
