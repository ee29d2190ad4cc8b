#!/usr/bin/env bash
# Session 32, call A: the README's GPU tests whole, first part (the collectives, hierarchy, peer memory,
# comm, net and device-comm suites; the fused GemmColl ones run in call B), under MPS,
# then the PyTorch MoE tests. Covers session 31's commits that never ran on a GPU (8b97461,
# ab8d475, 34b4b55, fd32f1b's MoeProcs.EightProcessesFused, 418002b's commMostRanksOnDevice).
# Call B runs the rest on the same warm machine.
set -u
source scripts/gpu_call.sh
gc_init A
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
timeout 30 nvidia-cuda-mps-control -d && echo "MPS started"
GC_BUILD_S=300 gc_build /tmp/bw "gpu/*.cc;gpu/*.cu" mk_gpu_tests mkernel mkernel_demo
P='*Coll*:*Hier*:*PeerMem*:*Comm*:*Net*:*Dev*'
gc_run shard0 500 330 30 0 "^\[  (PASSED|FAILED)|^\[  FAILED  \] [A-Z]|tests? ran" \
  /tmp/bw/tests/mk_gpu_tests --gtest_filter="$P-*GemmColl*"
MK_TORCH_BUDGET=75 MK_TORCH_TIMEOUT=75 gc_run torch_moe 585 80 40 0 "PASS|FAIL|passed|failed" \
  bash scripts/run_torch_tests.sh /tmp/bw fused_moe
gzip -f $GC_L/shard0.log
echo quit | nvidia-cuda-mps-control
gc_tar
