#!/usr/bin/env bash
# Session 54 (copied from session 53), call DA (most decisive steps first; every step tars its logs):
# 1. bench/cvt_rate.cu (seconds): the fp32 -> 16-bit packed conversions' issue rate, whether
#    converting a tile's 32768 accumulators is what the ~1000-cycle epilogue costs.
# 2. The engine and cuBLAS under ncu (clocks locked by ncu: no power cap, no clock difference
#    between them): duration, cycles, tensor-pipe activity, bytes from L2 into the SMs, L2 and
#    DRAM reads and writes at 8192x8192x1024 and 16384x8192x1024 (issue 12's misses) and 8192^3
#    (level). Does the engine read more from DRAM than cuBLAS, or the same?
# 3. The grouped GEMM (issue 13's experts) on claimed tiles against its static walk at the
#    issue's grouped shapes, and the grouped tests with MKERNEL_GEMM_GROUP_CLAIM=1 (the automatic
#    claims for grouped GEMMs, default 0 until measured).
# 4. The carried epilogue as CTA pairs under ncu (cuBLAS's kernel here is a 2-CTA cluster), and a
#    timed run of the three shapes.
set -u
source scripts/gpu_call.sh
gc_init DA
gc_nvcc bench/cvt_rate.cu /tmp/cvt_rate && gc_run cvt 60 30 5 1 "^\\|" /tmp/cvt_rate --commit "$(cat COMMIT_SNAP)"
# The tests' binary after the first measurements (the device time left is short).
GC_BUILD_S=300 gc_build /tmp/bd "gpu/test_gemm_grouped.cu" bench_gemm_bench
gc_tar
T=$(gc_el)  # the steps' deadlines count from the build's end
B=/tmp/bd/bench/bench_gemm_bench
M=gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__cycles_elapsed.avg.per_second
M=$M,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum
M=$M,lts__t_sectors_op_write.sum,dram__bytes_read.sum,dram__bytes_write.sum
M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed
M=$M,launch__grid_size,launch__cluster_dim_x,launch__cluster_dim_y,smsp__cycles_active.avg
P="gemmKernel|nvjet|xmma|cutlass|Kernel|gpu__|sm__|l1tex__|lts__|dram__|launch__|rror"
ncu_pair() {  # N SHAPE UNTIL
  gc_run ncu_eng$1 $3 45 15 0 "$P" ncu --kernel-name regex:gemmKernel \
    --launch-skip 2 --launch-count 1 --metrics "$M" $B --shapes $2 --reps 2
  gc_run ncu_cub$1 $(($3 + 30)) 45 15 0 "$P" ncu --kernel-name "regex:nvjet|xmma|cutlass" \
    --launch-skip 1 --launch-count 1 --metrics "$M" $B --shapes $2 --reps 2
}
ncu_pair 1 8192x8192x1024 $((T + 45))
gc_run grouped32 $((T + 105)) 30 10 1 "grouped|x.*engine  " $B --groups 32 --claim \
  --shapes 131072x7168x2048,131072x2048x7168 --reps 6 --commit "$(cat COMMIT_SNAP)"
ncu_pair 2 16384x8192x1024 $((T + 150))
gc_run grouped16 $((T + 200)) 20 8 1 "grouped|x.*engine  " $B --groups 16 --claim \
  --shapes 131072x1408x2048 --reps 6 --commit "$(cat COMMIT_SNAP)"
timeout 90 cmake --build /tmp/bd -j"$(nproc)" --target mk_gpu_tests >"$GC_L/build_tests.log" 2>&1
echo "tests build rc=$? at $(gc_el)s"
(export MKERNEL_GEMM_GROUP_CLAIM=1; gc_tests /tmp/bd 'GemmGrouped.*' $((T + 320)) 30)
ncu_pair 3 8192x8192x8192 $((T + 365))
gc_run ncu_pairs $((T + 420)) 25 15 0 "$P" ncu --kernel-name regex:gemmKernel --launch-count 6 \
  --metrics "$M" $B --shapes 8192x8192x1024 --reps 1 --carry --clusters
gc_tar
