#!/usr/bin/env bash
# Session 39, call K, most important first: (1) GPU check of main's MoE combine launchers
# (refactored in c618948 without a GPU): the MoE layer suites on threads; (2) the parameterised
# suites session 38's call H missed (gtest names them Prefix/Suite.Test/param), with this
# session's RingAttnThreads.LayoutsTileClaim (MKERNEL_RING_TILE_CLAIM=1: the attention CTAs
# claim their tiles from a counter); (3) under MPS the MoE processes suites,
# RingAttnProcs/n4claim, and ring attention 16K causal traced (MKERNEL_FUSED_TRACE=1) with the
# static schedule and with claimed tiles, side by side (issue 14's gap to the 1-rank kernel:
# do the ranks' kernels' CTAs start staggered, and do claimed tiles even out their ends?).
set -u
source scripts/gpu_call.sh
gc_init K
GC_BUILD_S=240 gc_build /tmp/bn \
  "gpu/test_moe_vnodes.cu;gpu/test_moe_ffn.cu;gpu/test_moe_ffn_fused.cu;gpu/test_moe_procs.cu;gpu/test_fused_xnode.cu;gpu/test_ring_attn_xnode.cu;gpu/test_ring_attention.cu;gpu/test_ring_attention_procs.cu;gpu/test_fused_matrix_vnodes.cu" \
  mk_gpu_tests mkernel bench_share_bench
gc_tests /tmp/bn '*MoeFfn*:MoeVnodesFused.TwoByTwo:MoeVnodesFused.GroupsOfThree2x2:MoeVnodesFused.Overflow2x2:MoeVnodes.TwoByTwo:MoeVnodesOverflow.*:MoeProcsGraph.Vnodes2x2' 330 110
mv "$GC_L/tests.log.gz" "$GC_L/tests_moe.log.gz"
gc_tests /tmp/bn 'RingAttn/RingAttnThreads.*:FusedXnode/*:RingAttnXnode/*:FusedMatrix/FusedMatrixVnodes.*:FusedMatrixVnodesRandom.*' 440 120
mv "$GC_L/tests.log.gz" "$GC_L/tests_vnodes.log.gz"
gc_mps_start
gc_tests /tmp/bn 'RingAttn/RingAttnProcs.EveryElement/n4claim:MoeProcs.TwoProcesses:MoeProcsFused.TwoAndFourProcesses' 500 60
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz"
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
for tc in 0 1; do
  MKERNEL_RING_TILE_CLAIM=$tc MKERNEL_FUSED_TRACE=1 gc_run "ring_tc$tc" $((500 + 48 * (tc + 1))) 46 25 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal yes --target-ms 4 --out "$GC_L/ring_tc$tc" \
    --seqs 16384 --algos auto --backends flash --reps 2 --warmup 1 --budget 35
done
gc_mps_stop
gc_tar
