#!/usr/bin/env bash
# After next_callF.sh: the rest of session 36's next_callE.sh (which did not run): the vnode
# suites at 2x4 and 4x2, the layer across 2 virtual nodes at the two large shapes and with
# groups of 2 comm CTAs against one of each, then the PyTorch MoE tests on 2 virtual nodes.
set -u
source scripts/gpu_call.sh
gc_init G
GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_moe_vnodes.cu" mk_gpu_tests mkernel
gc_tests /tmp/bn 'MoeVnodesFused.TwoByFour:MoeVnodesFused.FourByTwo:MoeVnodesFused.CrossNodeBytes2x2:MoeVnodes.FourByTwo' 300 60
S="7168:2048:256:8:8192,2048:1408:64:6:16384,7168:2048:256:8:2048"
gc_run ffn2n 470 170 40 0 "^H=|rror|Traceback" python3 bench/moe_bench.py ffn \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/ffn2n" --mps --nproc 2 --nodes 2 \
  --algos sequential,auto,fused@2 --no-graph --shapes "$S" --reps 2 --warmup 1 --budget 150
echo quit | timeout 30 nvidia-cuda-mps-control
gc_run torch_moe 590 120 60 0 "passed|failed|FAIL|rror" bash scripts/run_torch_tests.sh /tmp/bn \
  fused_moe_vnodes
gc_tar
