#!/usr/bin/env bash
# Session 29, call B: head dim 128's 176-key blocks (MKERNEL_ATTN_D128_VARIANT=1, 2 stages).
# Tests: the variant suite, then every ring-attention test with the variant on for the
# stand-alone kernel (single rank, the sequential path; the fused ring kernel keeps variant 0).
# Bench: the kernel alone against cuDNN at head dim 128, variant 0 and 1 in turn (the parameter
# is read once per process), S 4K-32K, causal and not.
set -u
source scripts/gpu_call.sh
gc_init B
GC_BUILD_S=300 gc_build /tmp/bb "gpu/test_ring_attention.cu" mk_gpu_tests mkernel
gc_tests /tmp/bb 'RingAttnD128Variant.*:RingAttnD64Variant.Cases/v1' 300 80
mv "$GC_L/tests.log.gz" "$GC_L/tests_variant.log.gz"
MKERNEL_ATTN_D128_VARIANT=1 gc_tests /tmp/bb '*RingAttn*' 380 90
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
P="--seqs 4096,8192,16384,32768 --head-dims 128 --causal both --backends cudnn --reps 6 --target-ms 8"
i=0
for v in 0 1 0 1; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  gc_run "attn_v${v}_$i" 590 75 45 0 "^\| [0-9]" env MKERNEL_ATTN_D128_VARIANT=$v \
    python3 bench/attn_bench.py single --lib /tmp/bb/src/libmkernel.so --out "$GC_L/attn_v${v}_$i" $P
done
