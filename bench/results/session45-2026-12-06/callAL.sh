#!/usr/bin/env bash
# Session 45, call AL: bench_l2_feed (L2 -> shared memory with bulk copies, no compute: bytes in
# flight per SM x how many SMs load x multicast CTA pairs); nvcc alone (~770 s of device budget
# left, much of it lost to failed starts).
set -u
source scripts/gpu_call.sh
gc_init AL
timeout 120 nvcc -Iinclude -Isrc -I. -Ibench -gencode=arch=compute_90a,code=sm_90a \
  --expt-relaxed-constexpr -O3 -DNDEBUG -std=c++17 bench/l2_feed.cu -o /tmp/l2_feed \
  >"$GC_L/feed_build.log" 2>&1
echo "l2_feed build rc=$? at $(gc_el)s"
grep -m5 -E "error" "$GC_L/feed_build.log"
gc_run l2_feed 110 90 10 1 "block|skipped|rror" /tmp/l2_feed --commit "$(cat COMMIT_SNAP)"
gc_run l2_feed_8mib 160 45 10 1 "block 48|skipped|rror" /tmp/l2_feed --mib 8 --commit "$(cat COMMIT_SNAP)"
gc_tar
