#!/usr/bin/env bash
# Session 32, call C: calls A and B ran the whole suite under MPS (session 27 ran it without);
# every failure was a 3+ rank comm of one process whose ranks each launch kernels on their own
# stream (the sequential paths of the fused calls, the mixed random tests), timing out with a
# peer "that did not join". Hypothesis: under MPS a client gets fewer hardware work queues, so
# rank streams share a queue and a rank's kernel waits behind a peer's spinning one. Same tests
# without MPS, then one of them under MPS as is, with CUDA_DEVICE_MAX_CONNECTIONS=32, and
# without MPS at CUDA_DEVICE_MAX_CONNECTIONS=1 (every stream on one queue).
set -u
source scripts/gpu_call.sh
gc_init C
GC_BUILD_S=240 gc_build /tmp/bc "gpu/test_fused_matrix.cu;gpu/test_fused_xnode.cu;gpu/test_ring_attention_procs.cu" mk_gpu_tests mkernel
F='FusedMatrixGraph.*:FusedMatrixRandom.*:FusedXnodeRandom.*:RingAttnVnodes.*:FusedMatrix/FusedMatrixOneThread.Run/*n3*:FusedMatrix/FusedMatrixOneThread.Run/*n4*'
gc_run nomps 330 90 20 0 "^\[  (PASSED|FAILED)|^\[  FAILED  \] [A-Z]" \
  /tmp/bc/tests/mk_gpu_tests --gtest_filter="$F"
ONE='FusedMatrix/FusedMatrixOneThread.Run/GemmAllReduce_n3_384x256x128_NK_f16_to_bf16_bias_auto'
TWO='FusedMatrix/FusedMatrixOneThread.Run/GemmAllReduce_n2_256x256x128_NK_bf16_to_f32_bias_auto'
MKERNEL_TIMEOUT_MS=4000 CUDA_DEVICE_MAX_CONNECTIONS=1 gc_run conn1 360 25 10 0 \
  "^\[  (PASSED|FAILED)|^\[  FAILED  \] [A-Z]|timed out" \
  /tmp/bc/tests/mk_gpu_tests --gtest_filter="$ONE:$TWO"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
timeout 30 nvidia-cuda-mps-control -d && echo "MPS started"
MKERNEL_TIMEOUT_MS=4000 gc_run mps 390 25 10 0 "^\[  (PASSED|FAILED)|^\[  FAILED  \] [A-Z]|timed out" \
  /tmp/bc/tests/mk_gpu_tests --gtest_filter="$ONE:$TWO"
MKERNEL_TIMEOUT_MS=4000 CUDA_DEVICE_MAX_CONNECTIONS=32 gc_run mps32 420 25 10 0 \
  "^\[  (PASSED|FAILED)|^\[  FAILED  \] [A-Z]|timed out" \
  /tmp/bc/tests/mk_gpu_tests --gtest_filter="$ONE:$TWO"
echo quit | nvidia-cuda-mps-control
gc_tar
