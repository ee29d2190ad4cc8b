#!/usr/bin/env bash
# Session 39, call L (after K, on the machine K left warm: /tmp/bn built): ring attention 16K and
# 32K, causal and not, static schedule against claimed tiles (MKERNEL_RING_TILE_CLAIM) side by
# side, without the trace; then session 33's bench_share_bench, never run: do k kernels side by
# side on SMs / k each lose per-SM throughput in one process too (no MPS, no communication)?
set -u
source scripts/gpu_call.sh
gc_init L
[ -x /tmp/bn/src/libmkernel.so ] || GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_ring_attention.cu" mkernel bench_share_bench
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
for tc in 0 1; do
  MKERNEL_RING_TILE_CLAIM=$tc gc_run "ring_tc$tc" $((150 * (tc + 1))) 140 40 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal both --target-ms 8 --out "$GC_L/ring_tc$tc" \
    --seqs 16384,32768 --algos auto --reps 3 --budget 120
done
gc_mps_stop
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
gc_run share 590 150 30 0 "^\|" /tmp/bn/bench/bench_share_bench --ranks 1,2,4 \
  --work attn,gemm --seq 32768 --gemm 8192x8192x8192 --reps 3 --commit "$(cat COMMIT_SNAP)" \
  --out "$GC_L/share.json"
gc_tar
