#!/usr/bin/env bash
# Prepared in session 48, not run (no device time left): the review mends of 3e274cf on the GPU
# (pipeline 0 keeps the lent stage where beta != 0; GemmDynamic.AutoClaimsBackToBack under
# MKERNEL_GEMM_AUTO_LEND 2 and 1), then the small-K shapes in three interleaved rounds of the
# default against MKERNEL_GEMM_AUTO_LEND=1 (the lent stage), so that run-to-run drift shows
# beside the ratio (calls BC and BE put the default at 0.926 and 0.948 of cuBLAS-best at
# 8192x8192x1024); then the default list with the carried epilogue forced.
set -u
source scripts/gpu_call.sh
gc_init BF
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_dynamic.cu;gpu/test_gemm_trace.cu;gpu/test_gemm_grouped.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 360 60
for r in 1 2 3; do
  gc_run "small_k_default_$r" $((400 + 40 * r)) 35 15 1 "x.*(engine  )|rror" \
    /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,16384x8192x1024 \
    --reps 20 --commit "$(cat COMMIT_SNAP)"
  MKERNEL_GEMM_AUTO_LEND=1 gc_run "small_k_lent_$r" $((420 + 40 * r)) 35 15 1 "x.*(engine  )|rror" \
    /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,16384x8192x1024 \
    --reps 20 --commit "$(cat COMMIT_SNAP)"
done
# The default list with the carried epilogue forced (static and claimed): pipeline 0 runs the
# deep ring above K = 4096, whose epilogue waits ~2 us a tile for its own stores (~2.5% of a
# tile at K = 8192); the list's minimum (8192x28672x8192) was 0.965-0.985 of cuBLAS-best.
gc_run list_carry 580 40 15 1 "x.*(engine  |carried)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 10 --carry --claim --commit "$(cat COMMIT_SNAP)"
gc_tar
