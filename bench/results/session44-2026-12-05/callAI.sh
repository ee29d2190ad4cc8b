#!/usr/bin/env bash
# Session 44, call AI: bench_wgmma_rate (the wgmma forms' issue rate alone), compiled with nvcc
# alone (it needs no library; the call has ~250 s of device budget, too little for the
# README's full build).
set -u
source scripts/gpu_call.sh
gc_init AI
timeout 150 nvcc -Iinclude -Isrc -I. -Ibench -gencode=arch=compute_90a,code=sm_90a \
  --expt-relaxed-constexpr -O3 -DNDEBUG -std=c++17 bench/wgmma_rate.cu -o /tmp/wgmma_rate \
  >"$GC_L/build.log" 2>&1
echo "build rc=$? at $(gc_el)s"
# A wgmma that ptxas serialises (its warning names it) would invalidate the rates.
grep -m5 -iE "error|serializ" "$GC_L/build.log"
gc_run wgmma_rate 200 60 10 1 "m64n|skipped|rror" /tmp/wgmma_rate --commit "$(cat COMMIT_SNAP)"
gc_tar
