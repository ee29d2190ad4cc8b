#!/usr/bin/env bash
# Session 31, call D: the fused layer (ncclMoeDispatchFfnCombine) on ranks that are processes
# too (rows land in, and expert outputs are read from, the windows). Under MPS: the
# MoeProcsFused tests (both calls), moe_bench ffn with 4 processes (fused against the AllToAll
# path), then every other MoE test.
set -u
source scripts/gpu_call.sh
gc_init D
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
timeout 30 nvidia-cuda-mps-control -d && echo "MPS started"
GC_BUILD_S=300 gc_build /tmp/bd "gpu/test_moe_*.cu" mk_gpu_tests mkernel
gc_run procs_fused 330 110 20 0 "^\[  (PASSED|FAILED)|FAIL|passed|fused kernels" \
  /tmp/bd/tests/mk_gpu_tests --gtest_filter='MoeProcsFused*'
gc_run moe_ffn 440 100 40 0 "^\||rror|Traceback" python3 bench/moe_bench.py ffn \
  --lib /tmp/bd/src/libmkernel.so --out "$GC_L/moe_ffn" --mps --nproc 4 \
  --algos sequential,fused --no-graph --shapes 7168:2048:256:8:4096,2048:1408:64:6:4096 \
  --reps 6 --warmup 1 --budget 70
gc_run moe_rest 590 150 20 0 "^\[  (PASSED|FAILED)|^\[  FAILED  \] [A-Z]" \
  /tmp/bd/tests/mk_gpu_tests --gtest_filter='*Moe*-MoeProcsFused*'
echo quit | nvidia-cuda-mps-control
gc_tar
