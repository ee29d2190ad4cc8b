#!/usr/bin/env bash
# Session 31, call C: the fused ncclMoeDispatchGemm on ranks that are processes (rows landing in
# the ranks' windows) and the MoE state split per rank (MoeRankCtl). Under MPS: the new
# MoeProcsFused tests, moe_bench dispatch with 4 processes (fused against the AllToAll path),
# then every other MoE test (the clique kernels use the refactored state too).
set -u
source scripts/gpu_call.sh
gc_init C
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
timeout 30 nvidia-cuda-mps-control -d && echo "MPS started"
GC_BUILD_S=300 gc_build /tmp/bc "gpu/test_moe_*.cu" mk_gpu_tests mkernel
gc_run procs_fused 330 110 20 0 "^\[  (PASSED|FAILED)|FAIL|passed|fused kernels" \
  /tmp/bc/tests/mk_gpu_tests --gtest_filter='MoeProcsFused*'
gc_run moe_disp 440 100 40 0 "^\||rror|Traceback" python3 bench/moe_bench.py dispatch \
  --lib /tmp/bc/src/libmkernel.so --out "$GC_L/moe_disp" --mps --nproc 4 \
  --algos sequential,fused --no-graph --shapes 7168:2048:256:8:4096,2048:1408:64:6:4096 \
  --reps 6 --warmup 1 --budget 70
gc_run moe_rest 590 150 20 0 "^\[  (PASSED|FAILED)|^\[  FAILED  \] [A-Z]" \
  /tmp/bc/tests/mk_gpu_tests --gtest_filter='*Moe*-MoeProcsFused*'
echo quit | nvidia-cuda-mps-control
gc_tar
