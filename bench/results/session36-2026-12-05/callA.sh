#!/usr/bin/env bash
# Session 36, call A: the reworked MoE kernel across nodes (land CTAs copy chunks out of the
# window with many loads in flight and ack at once; unpack CTAs, many, unpack and then join
# the GEMMs), its GPU tests, then issue 13's MoE bench across 2 virtual nodes (2 processes
# under MPS) with MKERNEL_FUSED_TRACE=1: the AllToAll path (auto) against the fused kernel.
set -u
source scripts/gpu_call.sh
gc_init A
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_moe_vnodes.cu" mk_gpu_tests mkernel
gc_tests /tmp/bn 'MoeVnodesFused.*:MoeVnodes.TwoByTwo:MoeVnodesOverflow.*' 380 90
S="7168:2048:256:8:2048,2048:1408:64:6:4096"
P="^H=|rror|Traceback|trace\]|^  (send|land|unpack|compute)"
gc_run ffn2n 490 110 40 0 "$P" env MKERNEL_FUSED_TRACE=1 python3 bench/moe_bench.py ffn \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/ffn2n" --mps --nproc 2 --nodes 2 \
  --algos auto,fused --no-graph --shapes "$S" --reps 2 --warmup 1 --budget 100
gc_run disp2n 590 100 30 0 "$P" env MKERNEL_FUSED_TRACE=1 python3 bench/moe_bench.py dispatch \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/disp2n" --mps --nproc 2 --nodes 2 \
  --algos auto,fused --no-graph --shapes "$S" --reps 2 --warmup 1 --budget 100
echo quit | timeout 30 nvidia-cuda-mps-control
gc_tar
