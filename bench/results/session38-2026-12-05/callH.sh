#!/usr/bin/env bash
# Session 38, call H, most important first (the device came back rarely this session): (1) this
# session's ring attention staged reads in two regions (MKERNEL_RING_SEQ_DIRECT=2):
# RingAttnProcs n4two, n3staged and n4 (the back-to-back calls now mix fused, auto and
# sequential), with the processes suites across virtual nodes; (2) issue 14's 16K miss
# (auto / 1-rank 0.87 causal) side by side: ring bench with 1 (the default) and 2, eager;
# (3) the GPU check of session 37's verdict change (Topo::leastShare in the GEMM + collective
# budget across nodes, ring attention's fused eligibility), which calls F and G covered for
# MoE only: the GEMM + collective and ring attention suites across virtual nodes on threads;
# (4) the PyTorch ring attention tests if time is left.
set -u
source scripts/gpu_call.sh
gc_init H
GC_BUILD_S=240 gc_build /tmp/bn \
  "gpu/test_ring_attention_procs.cu;gpu/test_fused_xnode.cu;gpu/test_ring_attn_xnode.cu;gpu/test_ring_attention.cu;gpu/test_fused_matrix_vnodes.cu" \
  mk_gpu_tests mkernel
gc_mps_start
gc_tests /tmp/bn 'RingAttn/RingAttnProcs.EveryElement/n4two:RingAttn/RingAttnProcs.EveryElement/n3staged:RingAttn/RingAttnProcs.EveryElement/n4:FusedXnodeProcs.*:RingAttnXnodeProcs.*' 265 80
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz"
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
for sd in 1 2; do
  MKERNEL_RING_SEQ_DIRECT=$sd gc_run "ring_sd$sd" $((265 + 50 * sd)) 48 25 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal both --target-ms 8 --out "$GC_L/ring_sd$sd" \
    --seqs 16384 --algos auto --reps 3 --budget 35
done
gc_mps_stop
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
gc_tests /tmp/bn 'FusedXnode.*:FusedXnodeChoice.*:FusedXnodeRandom.*:FusedXnodeAbort.*:RingAttnXnode.*:RingAttnXnodeChoice.*:RingAttnXnodeAbort.*:RingAttnThreads.*:FusedMatrixVnodes.*:FusedMatrixVnodesGraph.*' 420 55
mv "$GC_L/tests.log.gz" "$GC_L/tests_threads.log.gz"
MK_TORCH_BUDGET=50 gc_run torch 480 55 45 0 "PASS|FAIL|passed|failed" \
  bash scripts/run_torch_tests.sh /tmp/bn ring_attention
gc_tar
