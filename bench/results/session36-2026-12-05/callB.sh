#!/usr/bin/env bash
# Session 36, call B: the MoE kernel across nodes with send and land groups (chunks split by
# rows over a group's lanes), GEMM2's rows waited for once per destination, and the combine
# waiting once for the return rows; its GPU tests, then the MoE bench across 2 virtual nodes
# (2 processes under MPS): the AllToAll path (auto) against the fused kernel with one send and
# one land CTA (fused@2) and with the default groups (fused), side by side.
set -u
source scripts/gpu_call.sh
gc_init B
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_moe_vnodes.cu" mk_gpu_tests mkernel
gc_tests /tmp/bn 'MoeVnodesFused.*:MoeVnodes.TwoByTwo:MoeVnodesOverflow.*' 380 90
S="7168:2048:256:8:2048,2048:1408:64:6:4096"
P="^H=|rror|Traceback|trace\]|^  (send|land|unpack|compute)"
gc_run ffn2n 500 120 40 0 "$P" env MKERNEL_FUSED_TRACE=1 python3 bench/moe_bench.py ffn \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/ffn2n" --mps --nproc 2 --nodes 2 \
  --algos auto,fused@2,fused --no-graph --shapes "$S" --reps 2 --warmup 1 --budget 100
gc_run disp2n 590 90 30 0 "^H=|rror|Traceback" python3 bench/moe_bench.py dispatch \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/disp2n" --mps --nproc 2 --nodes 2 \
  --algos auto,fused@2,fused --no-graph --shapes "$S" --reps 3 --warmup 1 --budget 80
echo quit | timeout 30 nvidia-cuda-mps-control
gc_tar
