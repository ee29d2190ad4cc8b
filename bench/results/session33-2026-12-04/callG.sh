#!/usr/bin/env bash
# Session 33, call G: NOT RUN (the device refused a new machine: too little time left). It
# tests the review's mends (direct reads only where every rank shares this GPU, the end
# kernel preloaded, RingAttnProcs n4orders: odd ranks in ring order), then a diagnosis for the next session: ring attention's sequential kernel held
# to the rank's SM share (MKERNEL_SEQ_GEMM_SMS=-1, as the fused kernel's grid) against the
# fused kernel's direct reads, 4 processes, 64K non-causal. If the capped sequential kernel
# loses what the fused one loses against the whole-GPU sequential path (call B: 71.64 against
# 61.69 ms), the loss is four concurrent quarter-GPU kernels, not the fused kernel's reads.
set -u
source scripts/gpu_call.sh
gc_init G
GC_BUILD_S=135 gc_build /tmp/bg "gpu/test_ring_attention_procs.cu" mk_gpu_tests mkernel
gc_tests /tmp/bg '*RingAttnProcs*' 150 14
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
MKERNEL_SEQ_GEMM_SMS=-1 gc_run capped 178 30 15 0 "^\| [0-9]" python3 bench/attn_bench.py ring \
  --lib /tmp/bg/src/libmkernel.so --mps --ranks 4 --layout zigzag --head-dims 128 --causal no \
  --target-ms 8 --out "$GC_L/capped" --seqs 65536 --algos sequential,fused --no-single-rank \
  --reps 2 --warmup 1 --budget 20
gc_tar
