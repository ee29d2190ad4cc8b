#!/usr/bin/env bash
# Session 38, call H: the GPU check of session 37's verdict change (Topo::leastShare in the
# GEMM + collective budget across nodes, ring attention's fused eligibility, the fused MoE
# fuse-or-not), which calls F and G covered for MoE only: the GEMM + collective and ring
# attention suites across virtual nodes (threads, then processes under MPS). Then ring
# attention at 16K (issue 14's miss: auto / 1-rank 0.87 causal) timed eagerly and, new, in CUDA
# graphs (attn_bench.py ring --graphs: every variant and the 1-rank kernel), so that the
# per-call host overhead is told apart from the GPU's; the PyTorch ring attention and MoE tests
# (not run since sessions 34-37 changed their paths); and session 33's bench_share_bench if
# time is left.
set -u
source scripts/gpu_call.sh
gc_init H
GC_BUILD_S=240 gc_build /tmp/bn \
  "gpu/test_fused_xnode.cu;gpu/test_ring_attn_xnode.cu;gpu/test_ring_attention.cu;gpu/test_fused_matrix_vnodes.cu" \
  mk_gpu_tests mkernel bench_share_bench
gc_tests /tmp/bn 'FusedXnode.*:FusedXnodeChoice.*:FusedXnodeRandom.*:FusedXnodeAbort.*:RingAttnXnode.*:RingAttnXnodeChoice.*:RingAttnXnodeAbort.*:RingAttnThreads.*:FusedMatrixVnodes.*:FusedMatrixVnodesGraph.*' 290 110
mv "$GC_L/tests.log.gz" "$GC_L/tests_threads.log.gz"
gc_mps_start
gc_tests /tmp/bn 'FusedXnodeProcs.*:RingAttnXnodeProcs.*' 320 30
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz"
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
for mode in eager graphs; do
  extra=""
  [ "$mode" = graphs ] && extra="--graphs"
  # shellcheck disable=SC2086
  gc_run "ring_$mode" $([ "$mode" = eager ] && echo 385 || echo 450) 65 25 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal both --target-ms 8 --out "$GC_L/ring_$mode" \
    --seqs 16384 --algos auto --reps 3 --budget 50 $extra
done
gc_mps_stop
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
MK_TORCH_BUDGET=100 gc_run torch 555 105 50 0 "PASS|FAIL|passed|failed" \
  bash scripts/run_torch_tests.sh /tmp/bn ring_attention fused_moe
gc_run share 592 40 20 0 "^\|" /tmp/bn/bench/bench_share_bench --ranks 1,4 \
  --work attn,gemm --seq 32768 --gemm 8192x8192x8192 --reps 3 --commit "$MK_BENCH_COMMIT" \
  --out "$GC_L/share.json"
gc_tar
