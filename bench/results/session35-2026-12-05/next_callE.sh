#!/usr/bin/env bash
# After next_callD.sh passed: issue 13's MoE bench across 2 virtual nodes (2 processes under
# MPS, against torch on the real NCCL as two hosts), the AllToAll path (auto) against the new
# fused kernel, the layer then the dispatch call.
set -u
source scripts/gpu_call.sh
gc_init NE
GC_BUILD_S=200 gc_build /tmp/bn "gpu/test_moe_vnodes.cu" mkernel
S="7168:2048:256:8:2048,7168:2048:256:8:8192,2048:1408:64:6:4096,2048:1408:64:6:16384"
gc_run ffn2n 330 300 60 0 "^\||rror|Traceback" python3 bench/moe_bench.py ffn \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/ffn2n" --mps --nproc 2 --nodes 2 \
  --algos auto,fused --no-graph --shapes "$S" --reps 6 --warmup 1 --budget 260
gc_run disp2n 585 250 60 0 "^\||rror|Traceback" python3 bench/moe_bench.py dispatch \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/disp2n" --mps --nproc 2 --nodes 2 \
  --algos auto,fused --no-graph --shapes "$S" --reps 6 --warmup 1 --budget 200
echo quit | timeout 30 nvidia-cuda-mps-control
gc_tar
