#!/usr/bin/env bash
# Session 31, call G (call F again after its two findings: the cases plan now expects auto to run
# the fused layer, and the MoE fused kernels size their grids from the most ranks any comm of
# the process put on the GPU, so that the PyTorch test's subgroup pairs do not take the GPU in
# 4 x 66 CTAs). Call F: ncclFusedAuto now runs the fused layer on ranks that are processes of one
# node (call E: 1.02-1.41x the AllToAll path at every shape). Every processes MoE gtest (the
# cases plan's layer calls with [N,K] weights now take the fused kernel under auto; overflow;
# graphs; the fused plans), then the PyTorch MoE tests (4 processes under torchrun, auto).
set -u
source scripts/gpu_call.sh
gc_init G
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
timeout 30 nvidia-cuda-mps-control -d && echo "MPS started"
GC_BUILD_S=200 gc_build /tmp/bg "gpu/test_moe_procs.cu" mk_gpu_tests mkernel
gc_run procs 225 40 20 0 "^\[  (PASSED|FAILED)|^\[  FAILED  \] [A-Z]|FAIL " \
  /tmp/bg/tests/mk_gpu_tests --gtest_filter='MoeProcs*'
MK_TORCH_BUDGET=75 MK_TORCH_TIMEOUT=75 gc_run torch_moe 270 80 40 0 "PASS|FAIL|passed|failed" \
  bash scripts/run_torch_tests.sh /tmp/bg fused_moe
echo quit | nvidia-cuda-mps-control
gc_tar
