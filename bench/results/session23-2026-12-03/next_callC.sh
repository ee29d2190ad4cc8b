#!/usr/bin/env bash
# For the next session: the reduce helpers and the dynamic GEMM schedule of the in-node fused
# GEMM + AllReduce / ReduceScatter, side by side (4 ranks sharing the GPU): helpers off / on,
# on + MKERNEL_FUSED_DYN=1, off + DYN, alternating; the tile flags at system scope (bit 4 of
# MKERNEL_FUSED_DEBUG) against GPU scope; then on + DYN with MKERNEL_FUSED_TRACE.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsC; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
B=/tmp/bt/bench/bench_fused_bench
if [ ! -x $B ]; then
  cmake -S . -B /tmp/bt -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1
  timeout 300 cmake --build /tmp/bt -j16 --target bench_fused_bench > $L/build.log 2>&1
  echo "build rc=$? at $(el)s"
fi
export LD_LIBRARY_PATH=/tmp/bt/src MKERNEL_TIMEOUT_MS=20000
S=ar:8192x8192x8192,rs:8192x8192x8192,ar:8192x8192x1024,ar:4096x8192x8192
run() {  # name, env...
  local n=$1; shift
  left=$(( 580 - $(el) )); [ $left -lt 25 ] && return; [ $left -gt 80 ] && left=80
  env "$@" timeout $left $B --ranks 4 --reps 3 --warmup 1 --shapes $S --out $L/$n.json > $L/$n.log 2>&1
  echo "$n rc=$? at $(el)s"; grep -E "^\| gemm_|gates expired|FAIL|differs" $L/$n.log
  grep "fused trace.*rank 0" $L/$n.log | tail -3
}
for r in a b; do
  run h0$r MKERNEL_FUSED_HELPERS=0
  run h1$r MKERNEL_FUSED_HELPERS=1
  run h1d$r MKERNEL_FUSED_HELPERS=1 MKERNEL_FUSED_DYN=1
  run h0d$r MKERNEL_FUSED_HELPERS=0 MKERNEL_FUSED_DYN=1
done
# The clique's tile flags at system scope (bit 4) against GPU scope (the default since
# session 23's last commits), helpers on + DYN.
run h1d_sys MKERNEL_FUSED_HELPERS=1 MKERNEL_FUSED_DYN=1 MKERNEL_FUSED_DEBUG=16
run h1d_c MKERNEL_FUSED_HELPERS=1 MKERNEL_FUSED_DYN=1
run h1d_tr MKERNEL_FUSED_HELPERS=1 MKERNEL_FUSED_DYN=1 MKERNEL_FUSED_TRACE=1
tar -czf $OUT/logsC.tgz -C $OUT logsC
