#!/usr/bin/env bash
# Session 50, first of three calls on one warm machine (callCB.sh and callCC.sh reuse /tmp/bt):
# the whole GPU test binary built (the README's Release configure, every GPU test file), then
# the first part of the whole suite, `Gemm*` (pipeline 0 = gemm::autoPipeline since d552d63,
# host code not yet run on a GPU), and issue 12's small-K question: the default engine against
# itself with the D stores off (bench_gemm_bench --nostore, GemmArgs::skipStores, a
# diagnostic): is the D stores' share of the L2 traffic (8% at K = 1024, 1% at 8192) what the
# small-K k-step loses?
# The suite's parts: Gemm* (here), `*Fused*:*Moe*:*Attn*:*GemmColl*:-Gemm*` (callCB.sh) and
# `-*Fused*:*Moe*:*Attn*:*GemmColl*:Gemm*` (callCC.sh): disjoint, their union every test.
set -u
source scripts/gpu_call.sh
gc_init CA
GC_BUILD_S=450 gc_build /tmp/bt "gpu/*.cc;gpu/*.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bt 'Gemm*' 500 80
mv "$GC_L/tests.log.gz" "$GC_L/tests_gemm.log.gz"
gc_run nostore 565 55 20 1 "x.*(engine  |stores off)|rror" \
  /tmp/bt/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x8192 \
  --reps 20 --nostore --commit "$(cat COMMIT_SNAP)"
gc_run list_default 592 45 25 1 "x.*(engine  )|geomean|rror" \
  /tmp/bt/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)"
gc_tar
