#!/usr/bin/env bash
# Session 38, call H: the GPU check of session 37's verdict change (Topo::leastShare in the
# GEMM + collective budget across nodes, ring attention's fused eligibility, the fused MoE
# fuse-or-not), which calls F and G covered for MoE only: the GEMM + collective and ring
# attention suites across virtual nodes (threads, then processes under MPS), then the PyTorch
# tests that ran last before sessions 34-37 changed their paths (fused_moe on one node, ring
# attention on one node and 2 virtual nodes, the fused GEMM calls on 2 virtual nodes), and
# session 33's bench_share_bench (never run): do k kernels side by side on SMs / k each lose
# per-SM throughput in one process too (no MPS, no communication)?
set -u
source scripts/gpu_call.sh
gc_init H
GC_BUILD_S=240 gc_build /tmp/bn \
  "gpu/test_fused_xnode.cu;gpu/test_ring_attn_xnode.cu;gpu/test_ring_attention.cu;gpu/test_fused_matrix_vnodes.cu" \
  mk_gpu_tests mkernel bench_share_bench
gc_tests /tmp/bn 'FusedXnode.*:FusedXnodeChoice.*:FusedXnodeRandom.*:FusedXnodeAbort.*:RingAttnXnode.*:RingAttnXnodeChoice.*:RingAttnXnodeAbort.*:RingAttnThreads.*:FusedMatrixVnodes.*:FusedMatrixVnodesGraph.*' 320 130
mv "$GC_L/tests.log.gz" "$GC_L/tests_threads.log.gz"
gc_mps_start
gc_tests /tmp/bn 'FusedXnodeProcs.*:RingAttnXnodeProcs.*' 360 40
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz"
gc_mps_stop
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
gc_run share 450 90 30 0 "^\|" /tmp/bn/bench/bench_share_bench --ranks 1,2,4 \
  --work attn,gemm --seq 32768 --gemm 8192x8192x8192 --reps 3 --commit "$(cat COMMIT_SNAP)" \
  --out "$GC_L/share.json"
MK_TORCH_BUDGET=130 gc_run torch 590 140 60 0 "PASS|FAIL|passed|failed" \
  bash scripts/run_torch_tests.sh /tmp/bn ring_attention fused_moe ring_attention_vnodes fused_gemm_vnodes
gc_tar
