#!/usr/bin/env bash
# Session 39, call N (the machine of call M, warm): ring attention 16K causal and not, 4
# processes under MPS, claimed tiles (MKERNEL_RING_TILE_CLAIM=1) and the static schedule
# interleaved 1, 0, 1, 0, so that drift between runs does not favour one.
set -u
source scripts/gpu_call.sh
gc_init N
[ -f /tmp/bn/src/libmkernel.so ] || GC_BUILD_S=200 gc_build /tmp/bn "gpu/test_ring_attention.cu" mkernel
export LD_LIBRARY_PATH=/tmp/bn/src
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
i=0
for tc in 1 0 1 0; do
  i=$((i + 1))
  MKERNEL_RING_TILE_CLAIM=$tc gc_run "ring${i}_tc$tc" $((200 + 30 * i)) 29 20 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal both --target-ms 6 --out "$GC_L/ring${i}_tc$tc" \
    --seqs 16384 --algos auto --backends flash --reps 3 --budget 24
done
gc_mps_stop
gc_tar
