#!/usr/bin/env bash
# Session 29, call C: MKERNEL_ATTN_D128_VARIANT=1 (176-key blocks) is the default. Every
# ring-attention gtest (threads, processes, virtual nodes, graphs, abort, both head-dim-128
# variants), the torch ring-attention test, then ring attention with 4 ranks sharing the GPU
# against torch and the 1-rank kernel (the sequential path runs the stand-alone kernel).
set -u
source scripts/gpu_call.sh
gc_init C
GC_BUILD_S=300 gc_build /tmp/bc "gpu/test_ring_att*.cu" mk_gpu_tests mkernel
gc_tests /tmp/bc '*RingAttn*' 340 130
MK_TORCH_BUDGET=100 gc_run torch 450 110 40 0 "PASS|FAIL|passed|failed" \
  bash scripts/run_torch_tests.sh /tmp/bc ring_attention
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_run ring 590 140 60 0 "^\| [0-9]" python3 bench/attn_bench.py ring \
  --lib /tmp/bc/src/libmkernel.so --out "$GC_L/ring" --mps --ranks 4 --layout zigzag \
  --seqs 16384,32768,65536 --head-dims 128 --causal both --reps 6 --target-ms 8 --budget 120
echo quit | nvidia-cuda-mps-control 2>/dev/null
gc_tar
