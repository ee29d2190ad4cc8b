#!/usr/bin/env bash
# Session 33, call B: direct reads without a comm CTA (an idle producer-WG warp relays the
# flags) and in rank order (MKERNEL_RING_DIRECT=1, the default) or ring order (2). Every
# ring-attention gtest without MPS, the threads suites of the fused GEMM + collectives and of
# MoE (session 32's unrun final refactor, fusedOwnShare), then the ring bench under MPS:
# auto / fused (mode 1) / sequential, and fused in modes 2 and 0 alone.
set -u
source scripts/gpu_call.sh
gc_init B
GC_BUILD_S=280 gc_build /tmp/bb \
  "gpu/test_ring_att*.cu;gpu/test_fused_gemm_coll.cu;gpu/test_fused_matrix_threads.cu;gpu/test_fused_matrix.cu;gpu/test_moe_*.cu" \
  mk_gpu_tests mkernel
gc_tests /tmp/bb '*RingAttn*:FusedGemmCollSplit.*' 340 80
mv "$GC_L/tests.log.gz" "$GC_L/tests_ring.log.gz"
gc_tests /tmp/bb 'FusedMatrixOneThread*:FusedMatrixThreadPerRank*:FusedMatrixGroup*:*Moe*Threads*' 440 100
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
R="python3 bench/attn_bench.py ring --lib /tmp/bb/src/libmkernel.so --mps --ranks 4 --layout zigzag --head-dims 128 --causal both --target-ms 8"
gc_run ring 515 75 40 0 "^\| [0-9]" $R --out "$GC_L/ring" --seqs 16384,32768,65536 --reps 5 --budget 60
MKERNEL_RING_DIRECT=2 gc_run ring2 550 35 15 0 "^\| [0-9]" $R --out "$GC_L/ring2" \
  --seqs 16384,65536 --algos fused --no-single-rank --reps 4 --budget 25
MKERNEL_RING_DIRECT=0 gc_run ring0 575 25 10 0 "^\| [0-9]" $R --out "$GC_L/ring0" \
  --seqs 65536 --algos fused --no-single-rank --reps 3 --budget 15
gc_tar
