#!/usr/bin/env bash
# Session 46, call AT: bench_l2_feed's new ring sweep: the cooperative tile's stages loaded as
# the GEMM's ring runs them (each held for its k-step's tensor work, two out of the ring while
# one computes), the engine's 4 stages of 64-deep k-steps against 8 half-depth stages: whether
# the ring discipline, not the L2 feed, is what keeps the engine's feed below the copy rate
# (cuBLAS moves the same bytes ~15% faster: call AS).
set -u
source scripts/gpu_call.sh
gc_init AT
gc_nvcc bench/l2_feed.cu /tmp/l2_feed
gc_run l2_feed 150 120 10 1 "block 48|stage A128\+B256|ring|skipped|rror" /tmp/l2_feed \
  --blocks 1024 --commit "$(cat COMMIT_SNAP)"
gc_tar
