#!/usr/bin/env bash
# For a next session: what bounds a fused reduce comm CTA at ~10-15 GB/s (issue 12: one CTA a
# rank at ~45 GB/s would let fused GEMM + AllReduce beat sequential on one shared GPU;
# bench/results/session22-2026-12-03/README.md). 4 ranks sharing the GPU, the reduce tail on,
# with MKERNEL_FUSED_TRACE: the comm CTAs' main-loop end at 1, 2, 4 comm CTAs; then with the
# tile flags read at GPU scope (MKERNEL_FUSED_DEBUG=8: a system-scope acquire costs ~1 us, 8 a
# tile), and with the stores (1), loads (2) or sums (4) skipped (results wrong) to see which
# part sets the rate. Run from a fresh snapshot's root; builds what it needs.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsR; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP 2>/dev/null || git rev-parse --short HEAD)"
cmake -S . -B /tmp/bf -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1
cmake --build /tmp/bf -j16 --target bench_fused_bench > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log
export LD_LIBRARY_PATH=/tmp/bf/src MKERNEL_TIMEOUT_MS=20000
B=/tmp/bf/bench/bench_fused_bench
S=ar:8192x8192x8192,rs:8192x8192x8192,ar:8192x8192x1024
run() {  # name, env...
  local n=$1; shift
  left=$(( 590 - $(el) )); [ $left -lt 20 ] && return; [ $left -gt 90 ] && left=90
  env "$@" timeout $left $B --ranks 4 --reps 3 --warmup 1 --shapes $S --out $L/$n.json > $L/$n.log 2>&1
  echo "$n rc=$? at $(el)s"; grep "^| gemm_" $L/$n.log
  grep "fused trace.*rank 0" $L/$n.log | tail -3
}
run auto MKERNEL_FUSED_TRACE=1
for c in 1 2 4; do run c$c MKERNEL_FUSED_TRACE=1 MKERNEL_FUSED_AUTO=1 MKERNEL_FUSED_COMM_SMS=$c; done
for d in 8 1 2 4; do
  run c2_d$d MKERNEL_FUSED_TRACE=1 MKERNEL_FUSED_AUTO=1 MKERNEL_FUSED_COMM_SMS=2 MKERNEL_FUSED_DEBUG=$d
done
tar -czf $OUT/logsR.tgz -C $OUT logsR
