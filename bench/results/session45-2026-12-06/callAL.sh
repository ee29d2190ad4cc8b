#!/usr/bin/env bash
# Session 45, call AL: bench_l2_feed (L2 -> shared memory with bulk copies, no compute: bytes in
# flight per SM x how many SMs load x multicast CTA pairs), nvcc alone; then the GEMM trace GPU
# test with its wait words bounded, and the traced small-K GEMMs again with every consumer
# thread counting its waits (call AK counted in thread 0 alone, which slowed the traced
# ping-pong).
set -u
source scripts/gpu_call.sh
gc_init AL
timeout 120 nvcc -Iinclude -Isrc -I. -Ibench -gencode=arch=compute_90a,code=sm_90a \
  --expt-relaxed-constexpr -O3 -DNDEBUG -std=c++17 bench/l2_feed.cu -o /tmp/l2_feed \
  >"$GC_L/feed_build.log" 2>&1
echo "l2_feed build rc=$? at $(gc_el)s"
grep -m5 -E "error" "$GC_L/feed_build.log"
gc_run l2_feed 100 80 10 1 "block|skipped|rror" /tmp/l2_feed --commit "$(cat COMMIT_SNAP)"
GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_gemm_trace.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'GemmTrace*' 360 30
gc_run gemm_waits 470 100 30 1 "x.*(engine  |pipeline|trace)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x4096 \
  --reps 10 --pipelines --trace --commit "$(cat COMMIT_SNAP)"
gc_tar
