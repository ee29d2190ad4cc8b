#!/usr/bin/env bash
# Session 45, call AM: bench_l2_feed with the pairs' handshake off the copy's critical path
# (call AL waited for the cluster round trip on every copy), then the engine's CTA pairs
# (multicast B, session 43) beside the default at 8192x8192xK: call AL put the cooperative
# kernel at the global L2 -> SM limit (~8 TB/s on 132 SMs), which multicast pairs relieve.
set -u
source scripts/gpu_call.sh
gc_init AM
timeout 120 nvcc -Iinclude -Isrc -I. -Ibench -gencode=arch=compute_90a,code=sm_90a \
  --expt-relaxed-constexpr -O3 -DNDEBUG -std=c++17 bench/l2_feed.cu -o /tmp/l2_feed \
  >"$GC_L/feed_build.log" 2>&1
echo "l2_feed build rc=$? at $(gc_el)s"
grep -m5 -E "error" "$GC_L/feed_build.log"
gc_run l2_feed 70 50 10 1 "multicast|skipped|rror" /tmp/l2_feed --blocks 1024 --commit "$(cat COMMIT_SNAP)"
GC_BUILD_S=200 gc_build /tmp/bn "gpu/test_gemm_trace.cu" bench_gemm_bench
gc_run gemm_pairs 300 90 30 1 "x.*(engine  |pipeline|pairs|rror)" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x4096 \
  --reps 8 --pipelines --clusters --commit "$(cat COMMIT_SNAP)"
gc_tar
