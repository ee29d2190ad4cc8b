#!/usr/bin/env bash
# Session 36, call D: groups of 2 send and 2 land CTAs per peer by default. The vnode MoE
# suites, then the layer across 2 virtual nodes (2 processes under MPS): the AllToAll path
# (sequential) against auto (the fused kernel, now with groups of 2) at the small shapes.
set -u
source scripts/gpu_call.sh
gc_init D
GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_moe_vnodes.cu" mk_gpu_tests mkernel
gc_tests /tmp/bn 'MoeVnodesFused.*:MoeVnodes.*' 280 60
S="7168:2048:256:8:2048,2048:1408:64:6:4096"
gc_run ffn2n 340 60 30 0 "^H=|rror|Traceback" python3 bench/moe_bench.py ffn \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/ffn2n" --mps --nproc 2 --nodes 2 \
  --algos sequential,auto,fused@2 --no-graph --shapes "$S" --reps 3 --warmup 1 --budget 45
echo quit | timeout 30 nvidia-cuda-mps-control
gc_tar
