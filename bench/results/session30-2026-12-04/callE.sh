#!/usr/bin/env bash
# Session 30, call E: call D's transposed tall tiles pass every test but run the grouped GEMM
# slower (0.76 of torch against 0.91-0.96 off). Where the time goes: ncu on the grouped kernel
# of bench_gemm_bench (16 groups x 8192 rows, 2048 -> 1408) with the tall tail off and on, the
# same metrics for both (duration, tensor-pipe activity, DRAM bytes, L2 hit rate, instructions,
# shared-memory store conflicts).
set -u
source scripts/gpu_call.sh
gc_init E
GC_BUILD_S=240 gc_build /tmp/be "gpu/test_gemm_grouped.cu" bench_gemm_bench
M="gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__cycles_active.avg,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active"
for tall in 0 1; do
  MKERNEL_GEMM_TALL_TAIL=$tall gc_run "ncu_t$tall" 400 120 20 0 "gemmKernel|duration|pct|bytes|inst|conflicts|cycles|grid|ERR|rror" \
    ncu --kernel-name-base mangled --kernel-name "regex:ELi257E" --launch-skip 2 --launch-count 1 \
    --metrics "$M" /tmp/be/bench/bench_gemm_bench --groups 16 --shapes 131072x1408x2048 --reps 3
done
gc_tar
