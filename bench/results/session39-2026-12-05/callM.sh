#!/usr/bin/env bash
# Session 39, call M: (1) the parameterised suites across virtual nodes that session 38's call H
# missed (gtest names them Prefix/Suite.Test/param): the GEMM + collective and ring attention
# kernels across virtual nodes and the fused calls' vnode matrix, after session 37's
# least-share verdicts; (2) ring attention 32K, claimed tiles against the static schedule
# (MKERNEL_RING_TILE_CLAIM 0, 1), 4 processes under MPS.
set -u
source scripts/gpu_call.sh
gc_init M
GC_BUILD_S=220 gc_build /tmp/bn \
  "gpu/test_fused_xnode.cu;gpu/test_ring_attn_xnode.cu;gpu/test_fused_matrix_vnodes.cu" \
  mk_gpu_tests mkernel
gc_tests /tmp/bn 'FusedXnode/*:RingAttnXnode/*:FusedMatrix/FusedMatrixVnodes.*:FusedMatrixVnodesRandom.*' 300 110
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
for tc in 0 1; do
  MKERNEL_RING_TILE_CLAIM=$tc gc_run "ring32_tc$tc" $((300 + 38 * (tc + 1))) 37 25 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal yes --target-ms 10 --out "$GC_L/ring32_tc$tc" \
    --seqs 32768 --algos auto --backends flash --reps 3 --budget 30
done
gc_mps_stop
gc_tar
