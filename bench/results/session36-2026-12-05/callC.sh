#!/usr/bin/env bash
# Session 36, call C: one send and one land CTA per peer by default, ncclFusedAuto taking the
# fused layer across nodes. The vnode MoE suites (the fused kernel against the AllToAll path,
# now ncclFusedSequential), then the MoE bench across 2 virtual nodes (2 processes under MPS):
# the layer with the AllToAll path (sequential), auto (the fused kernel) and the fused kernel
# with groups of 2 (fused@4), at the small then the large shapes.
set -u
source scripts/gpu_call.sh
gc_init C
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_moe_vnodes.cu" mk_gpu_tests mkernel
gc_tests /tmp/bn 'MoeVnodesFused.*:MoeVnodes.*:MoeVnodesOverflow.*:MoeProcsGraph.Vnodes2x2' 330 80
S="7168:2048:256:8:2048,2048:1408:64:6:4096"
gc_run ffn2n 420 90 40 0 "^H=|rror|Traceback" python3 bench/moe_bench.py ffn \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/ffn2n" --mps --nproc 2 --nodes 2 \
  --algos sequential,auto,fused@4 --no-graph --shapes "$S" --reps 3 --warmup 1 --budget 70
L="7168:2048:256:8:8192,2048:1408:64:6:16384"
gc_run ffn2nL 590 170 40 0 "^H=|rror|Traceback" python3 bench/moe_bench.py ffn \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/ffn2nL" --mps --nproc 2 --nodes 2 \
  --algos sequential,auto --no-graph --shapes "$L" --reps 2 --warmup 1 --budget 120
echo quit | timeout 30 nvidia-cuda-mps-control
gc_tar
