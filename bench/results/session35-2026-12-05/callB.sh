#!/usr/bin/env bash
# Session 35, call B: the reworked MoeVnodesFused.PeerNeverComes (call A: the host rendezvous
# caught the missing peer, which the test had not expected), then issue 13's MoE bench across
# 2 virtual nodes (2 processes under MPS, against torch on the real NCCL as two hosts): the
# AllToAll path (auto) against the new fused kernel, the layer then the dispatch call.
set -u
source scripts/gpu_call.sh
gc_init B
GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_moe_vnodes.cu" mk_gpu_tests mkernel
gc_tests /tmp/bn 'MoeVnodesFused.PeerNeverComes:MoeVnodesFused.Overflow2x2' 300 60
S="7168:2048:256:8:2048,7168:2048:256:8:8192,2048:1408:64:6:4096,2048:1408:64:6:16384"
gc_run ffn2n 450 230 60 0 "^\||rror|Traceback" python3 bench/moe_bench.py ffn \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/ffn2n" --mps --nproc 2 --nodes 2 \
  --algos auto,fused --no-graph --shapes "$S" --reps 6 --warmup 1 --budget 200
gc_run disp2n 585 130 50 0 "^\||rror|Traceback" python3 bench/moe_bench.py dispatch \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/disp2n" --mps --nproc 2 --nodes 2 \
  --algos auto,fused --no-graph --shapes "$S" --reps 6 --warmup 1 --budget 100
echo quit | timeout 30 nvidia-cuda-mps-control
gc_tar
