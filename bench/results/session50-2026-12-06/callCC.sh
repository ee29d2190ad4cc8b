#!/usr/bin/env bash
# Session 50, third call (after callCB.sh on the warm machine): the rest of the whole suite
# (collectives, communicators, device API, peer memory), then issue 12's K = 1024 question:
# traces (static walk, pipeline 0 = the carried epilogue) of 8192x8192xK at K = 1024, 2048 and
# 8192 in one run (the k-step in cycles by tile length), each also with the D stores off
# (bench_gemm_bench --nostore, a diagnostic), and the default list (issue 12's >= 0.97).
set -u
source scripts/gpu_call.sh
gc_init CC
gc_reuse /tmp/bt "gpu/*.cc;gpu/*.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bt '-*Fused*:*Moe*:*Attn*:*GemmColl*:Gemm*' 480 480
mv "$GC_L/tests.log.gz" "$GC_L/tests_rest.log.gz"
# --nostore: the default engine again with its store threads issuing no TMA stores
# (GemmArgs::skipStores), timed and traced: is the D stores' share of the L2 traffic (8% at
# K = 1024, 1% at 8192) what the small-K k-step loses?
gc_run trace 540 70 20 1 "x.*(engine  |trace|stores off)|rror" \
  /tmp/bt/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x8192 \
  --reps 5 --trace --nostore --commit "$(cat COMMIT_SNAP)"
gc_run list_default 592 45 25 1 "x.*(engine  )|geomean|rror" \
  /tmp/bt/bench/bench_gemm_bench --reps 10 --commit "$(cat COMMIT_SNAP)"
gc_tar
