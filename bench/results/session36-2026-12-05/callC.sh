#!/usr/bin/env bash
# Session 36, call C: the MoE bench across 2 virtual nodes at the larger shapes (auto = the
# AllToAll path against the fused kernel), then the PyTorch MoE tests on 2 virtual nodes of 2
# ranks (their fused cases take the kernel across nodes) and on one node.
set -u
source scripts/gpu_call.sh
gc_init C
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_moe_vnodes.cu" mkernel
S="7168:2048:256:8:8192,2048:1408:64:6:16384"
gc_run ffn2nL 420 170 40 0 "^H=|rror|Traceback" python3 bench/moe_bench.py ffn \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/ffn2nL" --mps --nproc 2 --nodes 2 \
  --algos auto,fused --no-graph --shapes "$S" --reps 3 --warmup 1 --budget 150
echo quit | timeout 30 nvidia-cuda-mps-control
gc_run torch_moe 590 170 60 0 "passed|failed|FAIL|rror" bash scripts/run_torch_tests.sh /tmp/bn \
  fused_moe_vnodes fused_moe
gc_tar
