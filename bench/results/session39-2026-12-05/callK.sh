#!/usr/bin/env bash
# Session 39, call K (device time ran short: most start attempts were refused), most important
# first: (1) under MPS, ring attention 16K causal with the static schedule and with claimed
# tiles (MKERNEL_RING_TILE_CLAIM), side by side, traced (MKERNEL_FUSED_TRACE=1): issue 14's gap
# to the 1-rank kernel; then RingAttnProcs/n4claim; (2) on threads, RingAttnThreads.* (with
# this session's LayoutsTileClaim) and the MoE layer suites (main's combine launchers,
# refactored in c618948 without a GPU).
set -u
source scripts/gpu_call.sh
gc_init K
GC_BUILD_S=200 gc_build /tmp/bn \
  "gpu/test_moe_vnodes.cu;gpu/test_moe_ffn.cu;gpu/test_moe_ffn_fused.cu;gpu/test_moe_procs.cu;gpu/test_ring_attention.cu;gpu/test_ring_attention_procs.cu" \
  mk_gpu_tests mkernel
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
for tc in 0 1; do
  MKERNEL_RING_TILE_CLAIM=$tc MKERNEL_FUSED_TRACE=1 gc_run "ring_tc$tc" $((200 + 45 * (tc + 1))) 44 25 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal yes --target-ms 4 --out "$GC_L/ring_tc$tc" \
    --seqs 16384 --algos auto --backends flash --reps 2 --warmup 1 --budget 33
done
gc_tests /tmp/bn 'RingAttn/RingAttnProcs.EveryElement/n4claim:MoeProcs.TwoProcesses:MoeProcsFused.TwoAndFourProcesses' 320 50
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz"
gc_mps_stop
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
gc_tests /tmp/bn 'RingAttn/RingAttnThreads.*:*MoeFfn*:MoeVnodesFused.TwoByTwo:MoeVnodes.TwoByTwo:MoeProcsGraph.Vnodes2x2' 410 90
mv "$GC_L/tests.log.gz" "$GC_L/tests_threads.log.gz"
gc_tar
