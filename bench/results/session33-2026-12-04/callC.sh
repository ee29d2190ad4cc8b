#!/usr/bin/env bash
# Session 33, call C (library as in call B, 1d1af17): tests/torch/test_ring_attention.py
# (torchrun, 4 processes: its fused cases run the direct reads), the fused GEMM + collectives'
# threads suites (session 32's final refactor, fusedOwnShare; call B's filter missed their
# instantiation prefix), then queue_probe.cu's many-streams mode with and without MPS.
set -u
source scripts/gpu_call.sh
gc_init C
GC_BUILD_S=240 gc_build /tmp/bc "gpu/test_fused_matrix_threads.cu;gpu/test_fused_matrix.cu" \
  mk_gpu_tests mkernel
gc_tests /tmp/bc '*/FusedMatrixOneThread*:*/FusedMatrixThreadPerRank*' 330 110
MK_TORCH_BUDGET=100 gc_run torch 445 110 40 0 "PASS|FAIL|passed|failed" \
  bash scripts/run_torch_tests.sh /tmp/bc ring_attention
P=bench/results/session32-2026-12-04/queue_probe.cu
nvcc -O2 -arch=sm_90 $P -o /tmp/qp > $GC_L/probe_build.log 2>&1 && echo "probe built"
gc_run probe 475 15 3 0 "." /tmp/qp 16 many
gc_mps_start
gc_run probe_mps 495 15 3 0 "." /tmp/qp 16 many
CUDA_DEVICE_MAX_CONNECTIONS=32 gc_run probe_mps32 515 15 3 0 "." /tmp/qp 32 many
gc_mps_stop
gc_tar
