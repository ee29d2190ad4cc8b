#!/usr/bin/env bash
# Session 32, call B (right after call A on the warm machine, reusing /tmp/bw): the README's GPU
# tests whole, second half (every other suite), under MPS, then the demo.
set -u
source scripts/gpu_call.sh
gc_init B
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
timeout 30 nvidia-cuda-mps-control -d && echo "MPS started"
if [ ! -x /tmp/bw/tests/mk_gpu_tests ]; then
  GC_BUILD_S=300 gc_build /tmp/bw "gpu/*.cc;gpu/*.cu" mk_gpu_tests mkernel mkernel_demo
fi
export LD_LIBRARY_PATH=/tmp/bw/src MKERNEL_TIMEOUT_MS=20000
P='*Coll*:*Hier*:*PeerMem*:*Comm*:*Net*:*Dev*'
gc_run shard1 480 460 30 0 "^\[  (PASSED|FAILED)|^\[  FAILED  \] [A-Z]|tests? ran" \
  /tmp/bw/tests/mk_gpu_tests --gtest_filter="-$P"
gc_run shard2 560 120 20 0 "^\[  (PASSED|FAILED)|^\[  FAILED  \] [A-Z]|tests? ran" \
  /tmp/bw/tests/mk_gpu_tests --gtest_filter='*GemmColl*'
gc_run demo 590 25 10 0 "." /tmp/bw/examples/mkernel_demo 4
gzip -f $GC_L/shard1.log $GC_L/shard2.log
echo quit | nvidia-cuda-mps-control
gc_tar
