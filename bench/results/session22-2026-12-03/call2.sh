#!/usr/bin/env bash
# For a next session: why the in-node fused GEMM + AllReduce / ReduceScatter stopped hiding
# its communication. Session 5 (bench/results/session5-2026-12-01/README.md), 4 ranks sharing
# the GPU, 8192^3, 4 comm CTAs a rank: fused 7.97 ms against the engine's GEMM alone 7.87 and
# sequential 8.38 (hidden ~96%). Session 13 (fused_seq-1.log): the engine alone 5.88 ms (its
# small-K and epilogue work), fused 7.62, sequential 6.56: the fused kernel did not follow the
# engine's gains. Candidates: the fused compute role (deep ring, tile-by-tile D, a system-scope
# tile-done release per tile) against the plain engine; the split; the comm tail. This sweeps
# the comm CTAs with MKERNEL_FUSED_TRACE (per call: when the compute and comm CTAs finished)
# and, with the comm role's work switched off (MKERNEL_FUSED_DEBUG=7, results wrong), times the
# compute role alone. Run from a fresh snapshot's root; builds what it needs.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsF2; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP 2>/dev/null || git rev-parse --short HEAD)"
cmake -S . -B /tmp/bf -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1
cmake --build /tmp/bf -j16 --target bench_fused_bench > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log
export LD_LIBRARY_PATH=/tmp/bf/src
B=/tmp/bf/bench/bench_fused_bench
S=ar:8192x8192x8192,rs:8192x8192x8192,ar:8192x8192x1024
run() {  # name, env...
  local n=$1; shift
  left=$(( 590 - $(el) )); [ $left -lt 20 ] && return
  env "$@" timeout $left $B --ranks 4 --reps 3 --warmup 1 --shapes $S --out $L/$n.json > $L/$n.log 2>&1
  echo "$n rc=$? at $(el)s"; grep "^| gemm_" $L/$n.log
  grep "fused trace.*rank 0" $L/$n.log | tail -3
}
run auto MKERNEL_FUSED_TRACE=1
for c in 1 2 4 8; do run c$c MKERNEL_FUSED_TRACE=1 MKERNEL_FUSED_AUTO=1 MKERNEL_FUSED_COMM_SMS=$c; done
run c4_d7 MKERNEL_FUSED_TRACE=1 MKERNEL_FUSED_AUTO=1 MKERNEL_FUSED_COMM_SMS=4 MKERNEL_FUSED_DEBUG=7
tar -czf $OUT/logsF2.tgz -C $OUT logsF2
