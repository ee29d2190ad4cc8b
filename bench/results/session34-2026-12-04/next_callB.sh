#!/usr/bin/env bash
# Second call (warm machine, /tmp/bn from next_callA.sh): session 33's next_callA benches.
# bench_share_bench: do k kernels side by side on SMs / k each lose per-SM throughput in one
# process too (no MPS, no communication), for the attention engine and the GEMM engine; then
# ring attention's sequential kernel held to the rank's share against the fused kernel.
set -u
source scripts/gpu_call.sh
gc_init NB
GC_BUILD_S=200 gc_build /tmp/bn \
  "gpu/test_ring_attention_procs.cu;gpu/test_ring_attention.cu;gpu/test_moe_procs.cu" \
  mkernel bench_share_bench
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_run share 400 150 30 1 "^\|" /tmp/bn/bench/bench_share_bench --ranks 1,2,4 \
  --work attn,gemm --seq 65536 --gemm 8192x8192x8192 --reps 3 --commit "$MK_BENCH_COMMIT"
MKERNEL_SEQ_GEMM_SMS=-1 gc_run capped 585 150 20 0 "^\| [0-9]" python3 bench/attn_bench.py ring \
  --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 --layout zigzag --head-dims 128 --causal no \
  --target-ms 8 --out "$GC_L/capped" --seqs 65536 --algos sequential,fused --no-single-rank \
  --reps 3 --budget 40
gc_tar
