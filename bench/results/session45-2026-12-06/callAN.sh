#!/usr/bin/env bash
# Session 45, call AN (not run this session: no device budget left; run it first next time):
# bench_l2_feed with the pairs' handshake on a second thread (its multicast rate without the
# issuing thread's cluster arrives), then the engine's cooperative CTA pairs traced (deep ring)
# beside the unpaired deep ring and the ping-pong pairs, with the wait counters: whether the
# pairs' consumers still starve (full waits) or their producers wait on the pair's releases
# (empty waits), and the trace GPU test with the pairs traced.
set -u
source scripts/gpu_call.sh
gc_init AN
gc_nvcc bench/l2_feed.cu /tmp/l2_feed
gc_run l2_feed 70 50 10 1 "block 48|multicast|skipped|rror" /tmp/l2_feed --blocks 1024 \
  --commit "$(cat COMMIT_SNAP)"
GC_BUILD_S=260 gc_build /tmp/bn "gpu/test_gemm_trace.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'GemmTrace*' 360 30
gc_run gemm_pairs_traced 480 110 30 1 "x.*(engine  |pipeline|pairs|trace)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x4096 \
  --reps 8 --pipelines --clusters --trace --commit "$(cat COMMIT_SNAP)"
gc_tar
