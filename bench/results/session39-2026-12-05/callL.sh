#!/usr/bin/env bash
# Session 39, call L: ring attention 16K (causal and not), 4 processes under MPS, the static
# schedule against claimed tiles (MKERNEL_RING_TILE_CLAIM) untraced, in the order 0, 1, 0 (the
# machine's drift between runs shows in the two static runs). Call K's traced runs: with claimed
# tiles each rank's kernel ended evenly but the traced call took 3.42 ms against 2.52.
set -u
source scripts/gpu_call.sh
gc_init L
[ -f /tmp/bn/src/libmkernel.so ] || GC_BUILD_S=200 gc_build /tmp/bn "gpu/test_ring_attention.cu" mkernel
export LD_LIBRARY_PATH=/tmp/bn/src
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
i=0
for tc in 0 1 0; do
  i=$((i + 1))
  MKERNEL_RING_TILE_CLAIM=$tc gc_run "ring${i}_tc$tc" $((220 + 55 * i)) 54 30 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal both --target-ms 6 --out "$GC_L/ring${i}_tc$tc" \
    --seqs 16384 --algos auto --backends flash --reps 3 --budget 45
done
gc_mps_stop
gc_tar
