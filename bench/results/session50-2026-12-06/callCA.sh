#!/usr/bin/env bash
# Session 50, first of three calls on one warm machine (callCB.sh and callCC.sh reuse /tmp/bt):
# the whole GPU test binary built (the README's Release configure, every GPU test file), then
# the first part of the whole suite, `Gemm*` (pipeline 0 = gemm::autoPipeline since d552d63,
# host code not yet run on a GPU), and the default GEMM list once (issue 12's >= 0.97).
# The suite's parts: Gemm* (here), `*Fused*:*Moe*:*Attn*:*GemmColl*:-Gemm*` (callCB.sh) and
# `-*Fused*:*Moe*:*Attn*:*GemmColl*:Gemm*` (callCC.sh): disjoint, their union every test.
set -u
source scripts/gpu_call.sh
gc_init CA
GC_BUILD_S=450 gc_build /tmp/bt "gpu/*.cc;gpu/*.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bt 'Gemm*' 540 80
mv "$GC_L/tests.log.gz" "$GC_L/tests_gemm.log.gz"
gc_run list_default 590 45 25 1 "x.*(engine  )|geomean|rror" \
  /tmp/bt/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)"
gc_tar
