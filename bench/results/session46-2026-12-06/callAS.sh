#!/usr/bin/env bash
# Session 46, call AS: what cuBLAS's own kernel at 8192 x 8192 x 1024 (bf16, through
# torch.matmul) moves from L2 into its SMs, in bytes per SM cycle, against the engine's known
# 768 KB a tile (48 KB a k-step): whether cuBLAS, too, runs at the ~37-44 B/clk per SM that
# bench_l2_feed measured with every SM loading (calls AL, AP), so that only fewer bytes per
# FLOP (a larger tile) can close the small-K gap.
set -u
source scripts/gpu_call.sh
gc_init AS
cat > /tmp/mm.py <<'PY'
import torch
a = torch.randn(8192, 1024, device="cuda", dtype=torch.bfloat16)
b = torch.randn(1024, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(4):
    c = a @ b
torch.cuda.synchronize()
PY
M=gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__cycles_elapsed.avg.per_second
M=$M,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum
M=$M,lts__t_sectors_op_write.sum,dram__bytes_read.sum,dram__bytes_write.sum
M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed
M=$M,launch__grid_size,launch__cluster_dim_x,launch__cluster_dim_y,smsp__cycles_active.avg
gc_run ncu_cublas 200 180 20 0 "nvjet|sm90|Kernel|gpu__|sm__|l1tex__|lts__|dram__|launch__|rror" \
  ncu --launch-skip 2 --launch-count 1 --metrics "$M" python3 /tmp/mm.py
gc_tar
