#!/usr/bin/env bash
# Second call (warm machine, /tmp/bn from next_callA.sh). First the staged direct reads of the
# sequential ring path (MKERNEL_RING_SEQ_DIRECT=1, session 34, opt-in): issue 14's ring bench
# (auto/torch, auto/sequential, auto/1-rank at 16K-64K, causal and not) with the sequential
# path reading the peers' slices in place; compare with session 33's call B (gathers). Then
# bench_share_bench (session 33's next_callA): do k kernels side by side on SMs / k each lose
# per-SM throughput in one process too (no MPS, no communication)?
set -u
source scripts/gpu_call.sh
gc_init NB
GC_BUILD_S=200 gc_build /tmp/bn \
  "gpu/test_ring_attention_procs.cu;gpu/test_ring_attention.cu;gpu/test_moe_procs.cu;gpu/test_comm.cc;gpu/test_gemm_fused.cu" \
  mkernel bench_share_bench
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
MKERNEL_RING_SEQ_DIRECT=1 gc_run staged 420 330 60 0 "^\| [0-9]|Targets|mismatch" \
  python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
  --layout zigzag --head-dims 128 --causal both --target-ms 8 --out "$GC_L/staged" \
  --seqs 16384,32768,65536 --reps 3 --budget 240
gc_run share 585 150 30 1 "^\|" /tmp/bn/bench/bench_share_bench --ranks 1,2,4 \
  --work attn,gemm --seq 65536 --gemm 8192x8192x8192 --reps 3 --commit "$MK_BENCH_COMMIT"
gc_tar
