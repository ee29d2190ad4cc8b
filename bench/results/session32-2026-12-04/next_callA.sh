#!/usr/bin/env bash
# For the next session's first call: what session 32 did not reach of the README's GPU tests
# (the ring-attention suites gtest orders last), without MPS, and everything committed after
# call D touches (the queue hint: the init warning under MPS; RtErr is host-only), then
# queue_probe.cu's many-streams mode with and without MPS (how many streams with pending
# kernels a process runs side by side).
set -u
source scripts/gpu_call.sh
gc_init NA
GC_BUILD_S=260 gc_build /tmp/bn "gpu/test_ring_attention*.cu;gpu/test_ring_attn*.cu;gpu/test_fused_gemm_coll.cu" \
  mk_gpu_tests mkernel
gc_run ring 480 200 30 0 "^\[  (PASSED|FAILED)|^\[  FAILED  \] [A-Z]|tests? ran" \
  /tmp/bn/tests/mk_gpu_tests --gtest_filter='RingAttn*:*/RingAttn*:FusedGemmCollSplit.*'
P=bench/results/session32-2026-12-04/queue_probe.cu
nvcc -O2 -arch=sm_90 $P -o /tmp/qp > $GC_L/probe_build.log 2>&1 && echo "probe built"
gc_run probe 500 15 3 0 "." /tmp/qp 16 many
gc_mps_start
gc_run probe_mps 520 15 3 0 "." /tmp/qp 16 many
CUDA_DEVICE_MAX_CONNECTIONS=32 gc_run probe_mps32 540 15 3 0 "." /tmp/qp 32 many
gc_mps_stop
gc_tar
