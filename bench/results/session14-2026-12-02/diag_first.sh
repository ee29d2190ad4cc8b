#!/usr/bin/env bash
# First-size anomaly diagnostic (helper-lat13, read-only analyst; nothing in the repo changes).
# Usage on the H200 machine, from the repo root, after building bench_net_procs_bench + mkernel:
#   bash diag_first.sh [BUILD_DIR]        (default ../build-dev, as in call4.sh); results in $OUT/first
# ~10 runs of bench_net_procs_bench (2 processes, MPS, 2 virtual nodes), ~2 min in all.
# Per run it records: the timed sizes, the proxy statistics, the proxy threads' pinned CPU sets
# (NCCL_DEBUG INFO, subsystem PROXY: the line carries the proxy's tid), a 10 ms time series of
# every rank thread's CPU and run delay (/proc/<pid>/task/<tid>/schedstat field 2: time spent
# runnable but not running), hypervisor steal (/proc/stat), and GPU clocks / P-state.
set -u
B=${1:-$(cd .. && pwd)/build-dev}
O=${OUT:-/tmp}/first
mkdir -p "$O"
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-first CUDA_MPS_LOG_DIRECTORY=/tmp/mps-first-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d

{
  echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
  echo "cpus: $(nproc); base slice ns: $(cat /sys/kernel/debug/sched/base_slice_ns 2>/dev/null || echo '?')"
  python3 - <<'EOF'
import os, time
n = 200000
t = time.perf_counter()
for _ in range(n): time.monotonic_ns()
print("clock_gettime incl. python loop: %.3f us" % ((time.perf_counter() - t) / n * 1e6))
t = time.perf_counter()
for _ in range(n): os.sched_yield()
print("sched_yield: %.3f us" % ((time.perf_counter() - t) / n * 1e6))
EOF
} >"$O/sys.txt" 2>&1
cat "$O/sys.txt"

# Every ~10 ms: "ns tid cpu run_delay_ns" for every thread of every bench process, until $1 exists.
sampler() {
  while [ ! -e "$1" ]; do
    local t
    t=$(date +%s%N)
    for p in $(pgrep -f bench_net_procs_bench); do
      awk -v t="$t" '{ split(FILENAME, a, "/"); tid = a[5];
          if (a[6] == "schedstat") rd[tid] = $2; else cpu[tid] = $39 }
        END { for (k in rd) print t, k, cpu[k], rd[k] }' \
        /proc/"$p"/task/*/stat /proc/"$p"/task/*/schedstat 2>/dev/null
    done
    sleep 0.01
  done
}

run() {  # run <name> <bench args...>
  local n=$1
  shift
  rm -f "$O/$n.done"
  sampler "$O/$n.done" >"$O/$n.sched" &
  local sp=$!
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,pstate --format=csv,noheader -lms 100 \
    >"$O/$n.smi" 2>/dev/null &
  local np=$!
  local s0 s1
  s0=$(awk '/^cpu /{print $9}' /proc/stat)
  env NCCL_SOCKET_IFNAME=lo MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_STATS=1 NCCL_DEBUG=INFO \
    NCCL_DEBUG_SUBSYS=PROXY timeout 60 "$B/bench/bench_net_procs_bench" --lib "$B/src/libmkernel.so" \
    --nprocs 2 --ranks-per-node 1 --bw-sizes '' --lat-iters 500 "$@" >"$O/$n.log" 2>&1
  local rc=$?
  s1=$(awk '/^cpu /{print $9}' /proc/stat)
  touch "$O/$n.done"
  kill "$np" 2>/dev/null
  wait "$sp" 2>/dev/null
  echo "== $n ($*) rc=$rc, steal +$((s1 - s0)) ticks"
  grep -E "^  (sendrecv|allreduce) " "$O/$n.log" | awk '{printf "   %-9s %6s %8s us\n", $1, $2, $4}'
  grep -E "longest loop" "$O/$n.log" | sed 's/.*sleeps; /   proxy: /'
  grep -E "mkernel INFO proxy: (thread|no |hwloc)" "$O/$n.log" | sed -E 's/^[^:]*:[0-9]+:([0-9]+) .*INFO (.*)/   tid \1: \2/'
  # Threads that waited > 0.5 ms runnable within one 10 ms sample (who, when, on which CPUs).
  awk '{ if ($2 in p) { d = $4 - p[$2]; if (d > mx[$2]) { mx[$2] = d; at[$2] = $1 } }
         p[$2] = $4; c[$2] = c[$2] (index(c[$2], "," $3 ",") ? "" : "," $3 ",") }
       END { for (k in mx) if (mx[k] > 500000) {
               s = c[k]; gsub(/,+/, ",", s)
               printf "   tid %s: run-delay step %.2f ms at %.3f s, cpus%s\n", k, mx[k] / 1e6,
                      at[k] / 1e9 % 1000, s } }' "$O/$n.sched"
  awk -F', ' '{print $2" "$3" "$4}' "$O/$n.smi" | sort | uniq -c | sort -rn | head -3 | sed 's/^/   gpu: /'
}

# a: baseline (is the first of three equal sizes slow, how often)
for i in 1 2 3; do run a$i --ops sendrecv --lat-sizes 8,8,8; done
# b: another size first (order effect or an 8-byte effect?)
for i in 1 2; do run b$i --ops sendrecv --lat-sizes 4096,8,8; done
# c: 3000-call warm-up before the first timed loop (~90 ms of traffic: settles time/TCP/lap state)
for i in 1 2 3; do run c$i --ops sendrecv --lat-sizes 8,8 --warmup 3000; done
# d: AllReduce measured first (is "first measured" generic?)
for i in 1 2; do run d$i --ops allreduce,sendrecv --lat-sizes 8,8; done
echo quit | nvidia-cuda-mps-control
tar -czf "$OUT/first.tgz" -C "$(dirname "$O")" first 2>/dev/null
