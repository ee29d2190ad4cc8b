#!/usr/bin/env bash
# Session 36, call D: groups of 2 send and 2 land CTAs per peer by default. The layer across 2
# virtual nodes (2 processes under MPS) at H 7168, T 2048: the AllToAll path (sequential)
# against auto (the fused kernel with the new default) and fused@2 (one of each).
set -u
source scripts/gpu_call.sh
gc_init D
GC_BUILD_S=170 gc_build /tmp/bn "gpu/test_moe_vnodes.cu" mkernel
gc_run ffn2n 225 60 25 0 "^H=|rror|Traceback" python3 bench/moe_bench.py ffn \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/ffn2n" --mps --nproc 2 --nodes 2 \
  --algos sequential,auto,fused@2 --no-graph --shapes 7168:2048:256:8:2048 --reps 3 \
  --warmup 1 --budget 40
echo quit | timeout 30 nvidia-cuda-mps-control
gc_tar
