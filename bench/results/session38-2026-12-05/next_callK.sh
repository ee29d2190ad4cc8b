#!/usr/bin/env bash
# For the next session with a device. (1) The parameterised suites call H's filter missed
# (gtest names them Prefix/Suite.Test/param): the GEMM + collective and ring attention kernels
# across virtual nodes and the fused calls' vnode matrix, after session 37's least-share
# verdicts (fused_launch.cu's budget across nodes, ring attention's eligibility); (2) session
# 33's bench_share_bench, never run: do k kernels side by side on SMs / k each lose per-SM
# throughput in one process too (no MPS, no communication)? Session 38 found ring attention's
# 16K causal gap to the 1-rank kernel (0.87) neither in the staging barrier nor in the host's
# work, and half grids slower (2.48 against 2.09 ms); a CPU model of the static tile schedule
# puts about 5 of its 13 % in quantisation (512 tiles a rank on 132 CTAs) and per-source block
# rounding; (3), run before (2), traces the ring's kernels per rank at 16K causal.
set -u
source scripts/gpu_call.sh
gc_init K
GC_BUILD_S=240 gc_build /tmp/bn \
  "gpu/test_fused_xnode.cu;gpu/test_ring_attn_xnode.cu;gpu/test_ring_attention.cu;gpu/test_fused_matrix_vnodes.cu" \
  mk_gpu_tests mkernel bench_share_bench
gc_tests /tmp/bn 'FusedXnode/*:RingAttnXnode/*:RingAttn/RingAttnThreads.*:FusedMatrix/FusedMatrixVnodes.*:FusedMatrixVnodesRandom.*' 380 200
# (3) The ring's timeline at 16K causal (MKERNEL_FUSED_TRACE=1, session 38): per rank and call,
# when the stage kernel waited, when the attention CTAs started and ended (first / median /
# last) and the absolute start, so that the four ranks' kernels can be lined up (do they run
# one after another with overlapping tails, and how long is each tail?).
gc_mps_start
MKERNEL_FUSED_TRACE=1 gc_run ring_trace 450 60 25 0 "^\| [0-9]|rror" \
  python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
  --layout zigzag --head-dims 128 --causal yes --target-ms 4 --out "$GC_L/ring_trace" \
  --seqs 16384 --algos auto --backends flash --reps 2 --warmup 1 --budget 40
gc_mps_stop
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
gc_run share 590 130 30 0 "^\|" /tmp/bn/bench/bench_share_bench --ranks 1,2,4 \
  --work attn,gemm --seq 32768 --gemm 8192x8192x8192 --reps 3 --commit "$(cat COMMIT_SNAP)" \
  --out "$GC_L/share.json"
gc_tar
