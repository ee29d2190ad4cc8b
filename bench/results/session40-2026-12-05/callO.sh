#!/usr/bin/env bash
# For the next session with a device: (1) the ring attention tests as changed after call N
# (e0c9597, 2e74d6e: Layouts pinned to the static schedule, LayoutsTileClaim with 3 CTAs a rank,
# launch-counter checks of which schedule ran, every RingAttnProcs case on the new default of
# claimed tiles), threads without MPS, processes under MPS; (2) the PyTorch ring attention
# tests on the new default; (3) ring attention 16K-64K, causal and not, claimed tiles against
# the static schedule on the H200 (session 39 measured them on an H100 only).
set -u
source scripts/gpu_call.sh
gc_init O
GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_ring_attention.cu;gpu/test_ring_attention_procs.cu;gpu/test_ring_attn_xnode.cu" \
  mk_gpu_tests mkernel
gc_tests /tmp/bn 'RingAttn/RingAttnThreads.*:RingAttnGraph*:RingAttnD64Variant*:RingAttnD128Variant*:RingAttnXnode*:RingAttnXnode/*' 330 80
mv "$GC_L/tests.log.gz" "$GC_L/tests_threads.log.gz"
gc_mps_start
gc_tests /tmp/bn 'RingAttn/RingAttnProcs.*:RingAttnProcsAbort.*' 400 65
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz"
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
for tc in 1 0; do
  MKERNEL_RING_TILE_CLAIM=$tc gc_run "ring_tc$tc" $((400 + 80 * (tc == 1 ? 1 : 2))) 78 40 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal both --target-ms 8 --out "$GC_L/ring_tc$tc" \
    --seqs 16384,32768,65536 --algos auto --reps 3 --budget 70
done
gc_mps_stop
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
MK_TORCH_BUDGET=30 gc_run torch 595 35 25 0 "PASS|FAIL|passed|failed" \
  bash scripts/run_torch_tests.sh /tmp/bn ring_attention
gc_tar
