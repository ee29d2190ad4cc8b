#!/usr/bin/env bash
# Session 35, call D: RingAttnProcs n3staged with its budget check (call C: every element
# checked out, the grid check was wrong), then session 34's next_callB staged ring bench
# (MKERNEL_RING_SEQ_DIRECT=1: the sequential path reads the peers' slices in place).
set -u
source scripts/gpu_call.sh
gc_init D
GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_ring_attention_procs.cu" mk_gpu_tests mkernel
gc_mps_start
gc_tests /tmp/bn 'RingAttn/RingAttnProcs.EveryElement/n3staged' 300 50
gc_mps_stop
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
MKERNEL_RING_SEQ_DIRECT=1 gc_run staged 585 280 60 0 "^\| [0-9]|Targets|mismatch" \
  python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
  --layout zigzag --head-dims 128 --causal both --target-ms 8 --out "$GC_L/staged" \
  --seqs 16384,32768,65536 --reps 3 --budget 230
echo quit | timeout 30 nvidia-cuda-mps-control
gc_tar
