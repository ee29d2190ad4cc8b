#!/usr/bin/env bash
# Session 26, call C (the budget's last ~600 s, with the machine's start): the README's
# Release build of the library, fused_bench and a subset of GPU test files; the collective
# tests that cover the zero-copy ReduceScatter / AllGather on plain buffers, the in-node auto
# rule's test and the fused matrix; then fused_bench at the auto rule's bounds.
set -u
source scripts/gpu_call.sh
gc_init C
T="gpu/test_fused_gemm_coll.cu;gpu/test_fused_matrix.cu;gpu/test_coll_window.cc"
T="$T;gpu/test_coll_reduce.cc;gpu/test_coll_threads.cc"
GC_BUILD_S=270 gc_build /tmp/bc "$T" mk_gpu_tests bench_fused_bench
gc_tests /tmp/bc 'CollWindow.*:Ops/CollReduce.*:*CollThread*:FusedGemmColl*' 330 90
mv "$GC_L/tests.log.gz" "$GC_L/tests1.log.gz"
S=rs:8192x8192x8192,rs:8192x8192x4096,rs:8192x8192x1024,ar:8192x8192x4096,ar:4096x8192x4096
gc_fused_bench /tmp/bc fb 372 "--ranks 4 --reps 5 --warmup 1 --shapes $S"
gc_tests /tmp/bc 'FusedMatrix*' 400 30
