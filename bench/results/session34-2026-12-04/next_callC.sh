#!/usr/bin/env bash
# Third call (warm machine): ring attention's sequential kernel held to the rank's share
# (MKERNEL_SEQ_GEMM_SMS=-1) against the fused kernel at 64K (session 33's call G), and the
# PyTorch ring-attention tests with the staged reads on (MKERNEL_RING_SEQ_DIRECT=1).
set -u
source scripts/gpu_call.sh
gc_init NC
GC_BUILD_S=200 gc_build /tmp/bn \
  "gpu/test_ring_attention_procs.cu;gpu/test_ring_attention.cu;gpu/test_moe_procs.cu;gpu/test_comm.cc;gpu/test_gemm_fused.cu" \
  mkernel
MKERNEL_SEQ_GEMM_SMS=-1 gc_run capped 300 200 20 0 "^\| [0-9]" python3 bench/attn_bench.py ring \
  --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 --layout zigzag --head-dims 128 --causal no \
  --target-ms 8 --out "$GC_L/capped" --seqs 65536 --algos sequential,fused --no-single-rank \
  --reps 3 --budget 40
MKERNEL_RING_SEQ_DIRECT=1 MK_TORCH_BUDGET=240 gc_run torch_ring 585 270 60 0 "PASS|FAIL|passed|failed" \
  bash scripts/run_torch_tests.sh /tmp/bn ring_attention
gc_tar
