#!/usr/bin/env bash
# For the next session with a device: what session 36 could not run. The vnode MoE suites at
# the current main (the AllToAll-path suites now pass ncclFusedSequential), the layer across 2
# virtual nodes with the new default (groups of 2 send and 2 land CTAs per peer) at the four
# shapes against the AllToAll path, then the PyTorch MoE tests on 2 virtual nodes of 2 ranks.
set -u
source scripts/gpu_call.sh
gc_init E
GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_moe_vnodes.cu" mk_gpu_tests mkernel
gc_tests /tmp/bn 'MoeVnodesFused.*:MoeVnodes.*:MoeVnodesOverflow.*:MoeProcsGraph.Vnodes2x2' 300 60
S="7168:2048:256:8:2048,2048:1408:64:6:4096,7168:2048:256:8:8192,2048:1408:64:6:16384"
gc_run ffn2n 470 170 40 0 "^H=|rror|Traceback" python3 bench/moe_bench.py ffn \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/ffn2n" --mps --nproc 2 --nodes 2 \
  --algos sequential,auto,fused@2 --no-graph --shapes "$S" --reps 2 --warmup 1 --budget 150
echo quit | timeout 30 nvidia-cuda-mps-control
gc_run torch_moe 590 120 60 0 "passed|failed|FAIL|rror" bash scripts/run_torch_tests.sh /tmp/bn \
  fused_moe_vnodes
gc_tar
