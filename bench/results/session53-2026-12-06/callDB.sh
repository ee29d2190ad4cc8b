#!/usr/bin/env bash
# Session 53, call DB: callDA cut to what ~300 s of device time holds (eleven failed starts spent
# the rest): the conversions' issue rate, then the library and bench_gemm_bench, the engine and
# cuBLAS under ncu at 8192x8192x1024, and the grouped GEMM on claimed tiles. Every step tars its
# logs, so a cut call still returns what ran.
set -u
source scripts/gpu_call.sh
gc_init DB
gc_nvcc bench/cvt_rate.cu /tmp/cvt_rate && gc_run cvt 45 15 5 1 "^\\|" /tmp/cvt_rate --commit "$(cat COMMIT_SNAP)"
GC_BUILD_S=230 gc_build /tmp/bd "gpu/test_gemm_grouped.cu" bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
M=gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__cycles_elapsed.avg.per_second
M=$M,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum
M=$M,lts__t_sectors_op_write.sum,dram__bytes_read.sum,dram__bytes_write.sum
M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed
M=$M,launch__grid_size,launch__cluster_dim_x,smsp__cycles_active.avg
P="gemmKernel|nvjet|xmma|cutlass|Kernel|gpu__|sm__|l1tex__|lts__|dram__|launch__|rror"
gc_run ncu_eng1 $((T + 35)) 35 10 0 "$P" ncu --kernel-name regex:gemmKernel \
  --launch-skip 2 --launch-count 1 --metrics "$M" $B --shapes 8192x8192x1024 --reps 1
gc_run ncu_cub1 $((T + 70)) 35 10 0 "$P" ncu --kernel-name "regex:nvjet|xmma|cutlass" \
  --launch-skip 1 --launch-count 1 --metrics "$M" $B --shapes 8192x8192x1024 --reps 1
gc_run grouped32 $((T + 100)) 30 10 1 "grouped|x.*engine  " $B --groups 32 --claim \
  --shapes 131072x2048x7168,131072x7168x2048 --reps 4 --commit "$(cat COMMIT_SNAP)"
gc_tar
