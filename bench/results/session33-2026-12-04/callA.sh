#!/usr/bin/env bash
# Session 33, call A: the fused ring kernel's direct reads (processes layout: the attention
# reads the peers' data regions in place; MKERNEL_RING_DIRECT, default 1) and the fused ring
# kernel's head-dim-128 variant 1. Every ring-attention gtest without MPS (the suites session
# 32 did not reach, and RingAttnProcs in the direct, copy and mixed modes) plus the split
# GEMM + collective test, then ring attention with 4 processes sharing the GPU under MPS:
# auto (the sequential path), fused (direct reads) and sequential side by side, and the
# fused kernel in its copy mode (MKERNEL_RING_DIRECT=0) at 16K.
set -u
source scripts/gpu_call.sh
gc_init A
GC_BUILD_S=300 gc_build /tmp/ba "gpu/test_ring_att*.cu;gpu/test_fused_gemm_coll.cu" \
  mk_gpu_tests mkernel
gc_tests /tmp/ba '*RingAttn*:FusedGemmCollSplit.*' 380 90
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_run ring 530 140 60 0 "^\| [0-9]" python3 bench/attn_bench.py ring \
  --lib /tmp/ba/src/libmkernel.so --out "$GC_L/ring" --mps --ranks 4 --layout zigzag \
  --seqs 16384,32768,65536 --head-dims 128 --causal both --reps 6 --target-ms 8 --budget 120
MKERNEL_RING_DIRECT=0 gc_run ringcopy 575 40 20 0 "^\| [0-9]" python3 bench/attn_bench.py ring \
  --lib /tmp/ba/src/libmkernel.so --out "$GC_L/ringcopy" --mps --ranks 4 --layout zigzag \
  --seqs 16384 --head-dims 128 --causal both --algos fused --no-single-rank --reps 4 \
  --target-ms 8 --budget 30
gc_tar
