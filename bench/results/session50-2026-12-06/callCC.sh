#!/usr/bin/env bash
# Session 50, third call (after callCB.sh on the warm machine): the rest of the whole suite
# (collectives, communicators, device API, peer memory), then issue 12's K = 1024 question:
# traces (static walk, pipeline 0 = the carried epilogue) of 8192x8192xK at K = 1024, 2048 and
# 8192 in one run (the k-step in cycles by tile length), and the small-K shapes.
set -u
source scripts/gpu_call.sh
gc_init CC
if [ ! -x /tmp/bt/tests/mk_gpu_tests ]; then
  echo "no /tmp/bt: the machine was not kept; building"
  GC_BUILD_S=450 gc_build /tmp/bt "gpu/*.cc;gpu/*.cu" mk_gpu_tests bench_gemm_bench
else
  export LD_LIBRARY_PATH=/tmp/bt/src MKERNEL_TIMEOUT_MS=20000
  echo "reusing /tmp/bt"
fi
gc_tests /tmp/bt '-*Fused*:*Moe*:*Attn*:*GemmColl*:Gemm*' 480 480
mv "$GC_L/tests.log.gz" "$GC_L/tests_rest.log.gz"
gc_run trace 550 70 20 1 "x.*(engine  |trace)|rror" \
  /tmp/bt/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x8192 \
  --reps 5 --trace --commit "$(cat COMMIT_SNAP)"
gc_run small_k 592 40 15 1 "x.*(engine  )|rror" \
  /tmp/bt/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,16384x8192x1024 \
  --reps 20 --commit "$(cat COMMIT_SNAP)"
gc_tar
