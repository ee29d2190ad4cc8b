#!/usr/bin/env bash
# Session 46, call AP: session 45's call AN (bench_l2_feed with the pairs' handshake on a
# consumer thread and the engine's own stages; the cooperative CTA pairs traced with the deep
# ring beside the unpaired deep ring, with the ring wait counters) plus the first half of its
# call AO (the stand-alone GEMM tests at this commit), in one device start. Call AQ, on the
# warm machine, runs the sanitizers and the default list.
set -u
source scripts/gpu_call.sh
gc_init AP
gc_nvcc bench/l2_feed.cu /tmp/l2_feed
gc_run l2_feed 70 50 10 1 "block 48|multicast|skipped|rror" /tmp/l2_feed --blocks 1024 \
  --commit "$(cat COMMIT_SNAP)"
GC_BUILD_S=280 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_trace.cu" mk_gpu_tests \
  bench_gemm_bench
gc_tests /tmp/bn 'Gemm*' 420 70
gc_run gemm_pairs_traced 590 110 30 1 "x.*(engine  |pipeline|pairs|trace)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x4096 \
  --reps 8 --pipelines --clusters --trace --commit "$(cat COMMIT_SNAP)"
gc_tar
