#!/usr/bin/env bash
# For the next session with a device (none was lent in session 37): session 37's change, written
# without a GPU. Every combine of the MoE layer now takes the experts' outputs rounded to the
# input type (fused/ops/moe/combine_dev.cuh), and the AllToAll path and the fused kernel across
# nodes carry the return rows in that type (half the bytes of fp32). This call runs every
# layout's layer suites (threads: the clique's sequential and fused paths and the vnode suites,
# which compare the fused kernel across nodes byte for byte with the AllToAll path; processes
# under MPS), then the layer across 2 virtual nodes against the AllToAll path at two shapes.
# next_callG.sh has the rest (session 36's next_callE.sh, which did not run either).
set -u
source scripts/gpu_call.sh
gc_init F
GC_BUILD_S=300 gc_build /tmp/bn \
  "gpu/test_moe_vnodes.cu;gpu/test_moe_ffn.cu;gpu/test_moe_ffn_fused.cu;gpu/test_moe_procs.cu" \
  mk_gpu_tests mkernel
# Several ranks of one process: without MPS.
gc_tests /tmp/bn '*MoeFfn*:MoeVnodesFused.TwoByTwo:MoeVnodesFused.GroupsOfThree2x2:MoeVnodesFused.Overflow2x2:MoeVnodesFused.Graph2x2:MoeVnodes.TwoByTwo:MoeVnodesOverflow.*:MoeProcsGraph.Vnodes2x2' 420 130
mv "$GC_L/tests.log.gz" "$GC_L/tests_threads.log.gz"
# Ranks as processes: under MPS.
gc_mps_start
gc_tests /tmp/bn 'MoeProcs.TwoProcesses:MoeProcsFused.TwoAndFourProcesses' 480 60
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz"
gc_mps_stop
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
S="7168:2048:256:8:2048,2048:1408:64:6:4096"
gc_run ffn2n 590 110 40 0 "^H=|rror|Traceback" python3 bench/moe_bench.py ffn \
  --lib /tmp/bn/src/libmkernel.so --out "$GC_L/ffn2n" --mps --nproc 2 --nodes 2 \
  --algos sequential,auto --no-graph --shapes "$S" --reps 2 --warmup 1 --budget 100
echo quit | timeout 30 nvidia-cuda-mps-control
gc_tar
