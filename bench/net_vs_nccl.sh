#!/usr/bin/env bash
# mkernel's inter-node path with one process per rank, against the real NCCL run the same
# way, on one GPU (issue 11, part 1). Every rank is its own process (bench_net_procs_bench
# forks them; each loads the library under test with dlopen), all on GPU 0 under CUDA MPS:
#   mkernel  MKERNEL_EMULATE_NODES=2 (virtual nodes, socket backend on lo):
#            2 nodes x 1 process, 2 nodes x 2 processes
#   NCCL     the real libnccl.so.2 (PyTorch's nvidia-nccl package), every process its own
#            "host" (NCCL_HOSTID), NCCL_NET=Socket, NCCL_SOCKET_IFNAME=lo: 2 hosts x 1, and
#            4 hosts x 1 as the comparison for 2 x 2 (NCCL refuses two ranks of one host on
#            one GPU, so its 4 ranks all talk over sockets)
# sendrecv and AllReduce (float sum), 8 B .. 64 KiB (latency) and 8 .. 256 MiB (bandwidth),
# each size checked element by element once, then timed as nccl-tests does. Then, as a
# diagnostic, the 2 x 1 latency sweep again with each process bound to one CPU (what
# `mpirun --bind-to core` does with two ranks), for both libraries, and once more for
# mkernel with the socket backend's helper-thread path (MKERNEL_SOCKET_INLINE=0), with
# every ack sent at once (MKERNEL_PROXY_ACK_HOLD_US=0) and with one sendmsg per socket
# message (MKERNEL_SOCKET_TX_COALESCE=0: a put above 4 KiB is two system calls again), and
# 2 x 1 and 2 x 2 with puts of 9..64 bytes in the proxy command (MKERNEL_PROXY_INLINE_CMD=2,
# opt-in: the command plus a continuation slot instead of a staging slot), latency sizes only.
# Targets: latency <= 1.0x NCCL's up to 64 KiB, bus bandwidth >= 1.0x from 8 MiB.
#
# usage: bench/net_vs_nccl.sh <build-dir> <out-dir> [--dry-run] [--quick] [--no-bound] [--rounds N]
#   <build-dir>  a build with -DMK_BUILD_BENCH=ON: src/libmkernel.so and
#                bench/bench_net_procs_bench (cmake --build <dir> --target mkernel bench_net_procs_bench)
#   <out-dir>    gets net_vs_nccl.json, net_vs_nccl.md, runs/*.json and logs/*.log
#   --dry-run    print the environment and commands, run nothing (works without a GPU)
#   --quick      fewer sizes and iterations (a smoke test, ~1 minute)
#   --no-bound   skip the one-CPU-per-process diagnostic
#   --rounds N   run the compared pairs (mkernel and NCCL, 2 x 1 and 2 x 2) N times, the two
#                sides interleaved, and compare each side's best round per size (the lowest
#                time; its busbw): both libraries alike, so that one slow round of either
#                (the real NCCL's 8-byte time varied 2x between runs on the H200) does not
#                decide a row. Default 1.
# environment: MK_REAL_NCCL=/path/libnccl.so.2 (default: <build>/nccl-tests/env.sh, then
#   python3 -c 'import nvidia.nccl'), MK_NVN_BUDGET=450 (seconds for all runs; later runs are
#   skipped, and reported, once less than 30 s remain), CUDA_VISIBLE_DEVICES (default 0),
#   MK_NVN_WARMUP_FIRST=0 (extra untimed calls of each op's first size, both libraries; the
#   report's "Slow starts" section lists rows whose first half of timed calls was slow).
# Exit status: 0 every run passed its checks and every target is met; 3 runs passed but a
# target is missed; 1 a run failed (its log and the reason are printed); 2 usage/setup error.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_TOOL=net_vs_nccl
# shellcheck source=bench/bench_common.sh
source "$REPO/bench/bench_common.sh"

[[ $# -ge 2 ]] || die "usage: $0 <build-dir> <out-dir> [--dry-run] [--quick] [--no-bound] [--rounds N]"
BUILD_IN=$1
OUT_IN=$2
shift 2
OPTS="$*"  # the options as given (the loop below consumes them)
DRY=0 QUICK=0 BOUND=1 ROUNDS=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --quick) QUICK=1 ;;
    --no-bound) BOUND=0 ;;
    --rounds)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]?$ ]] || die "--rounds needs a count from 1 to 99"
      ROUNDS=$2
      shift
      ;;
    *) die "unknown option $1" ;;
  esac
  shift
done
bench_setup "$BUILD_IN" "$OUT_IN" bench_net_procs_bench
BUDGET=${MK_NVN_BUDGET:-450}
WFIRST=${MK_NVN_WARMUP_FIRST:-0}
[[ $WFIRST =~ ^[0-9]+$ ]] || die "MK_NVN_WARMUP_FIRST must be a count"
find_real_nccl
start_mps

# ---- sizes -----------------------------------------------------------------------------------
# Latency iterations: a run of a few tens of calls is dominated by one slow wake-up of either
# side's proxy thread (session 11: mkernel 70.8 us per 8-byte sendrecv over 50 calls, 34.8 us
# over 1000 in session 12), so both libraries get enough calls for a steady state.
if [[ $QUICK == 1 ]]; then
  LAT="8,4096,65536" BW="8M,64M" LIT=500 BIT=4
else
  LAT="8,64,512,4096,32768,65536" BW="8M,32M,128M,256M" LIT=1000 BIT=10
fi

COMMON_ENV=(NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0)
MK_ENV=(MKERNEL_EMULATE_NODES=2 MKERNEL_TIMEOUT_MS=60000 MKERNEL_PROXY_STATS=1)
NC_ENV=(NCCL_NET=Socket NCCL_IB_DISABLE=1)
# Variables that would change what is measured; unset for every run.
CLEAN=(-u LD_PRELOAD -u NCCL_HOSTID -u NCCL_NET -u MKERNEL_NET -u NCCL_NET_PLUGIN -u MKERNEL_SOCKET_NCONNS
  -u MKERNEL_SOCKET_INLINE -u MKERNEL_PROXY_ACK_HOLD_US -u MKERNEL_SOCKET_TX_COALESCE
  -u MKERNEL_PROXY_INLINE_CMD)

# Two CPUs this process may use, for the bound diagnostic.
CPUS=$(python3 -c "import os; c=sorted(os.sched_getaffinity(0)); print(','.join(map(str, c[:2])) if len(c) >= 2 else '')")

# System facts that decide what a polling proxy costs: how long a 50 us sleep really lasts
# (a tick-based timer or a large inherited timer slack turns it into milliseconds), what a
# sched_yield costs, the CPU quota and its throttling (read again after the runs).
sysinfo() {
  python3 - <<'PYEOF'
import json, os, platform, statistics, time
d = {"kernel": platform.release(), "cpus_allowed": len(os.sched_getaffinity(0)),
     "loadavg": open("/proc/loadavg").read().split()[:3]}
def rd(p):
    try:
        return open(p).read().strip()
    except Exception:
        return None
d["timerslack_ns"] = rd("/proc/self/timerslack_ns")
d["clocksource"] = rd("/sys/devices/system/clocksource/clocksource0/current_clocksource")
d["cgroup_cpu_max"] = rd("/sys/fs/cgroup/cpu.max")
st = rd("/sys/fs/cgroup/cpu.stat")
if d["cgroup_cpu_max"] is None:  # cgroup v1
    q, per = rd("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), rd("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
    if q is not None:
        d["cgroup_cpu_max"] = "%s %s" % ("max" if q == "-1" else q, per)
    st = rd("/sys/fs/cgroup/cpu/cpu.stat")
d["cgroup_cpu_stat"] = dict(l.split() for l in (st or "").splitlines() if len(l.split()) == 2)
if "throttled_time" in d["cgroup_cpu_stat"]:  # v1: ns
    d["cgroup_cpu_stat"]["throttled_usec"] = str(int(d["cgroup_cpu_stat"]["throttled_time"]) // 1000)
xs = []
for _ in range(400):
    t = time.perf_counter(); time.sleep(50e-6); xs.append((time.perf_counter() - t) * 1e6)
d["sleep50us_median_us"] = round(statistics.median(xs), 1)
d["sleep50us_p90_us"] = round(sorted(xs)[int(len(xs) * 0.9)], 1)
t = time.perf_counter()
for _ in range(20000):
    os.sched_yield()
d["sched_yield_us"] = round((time.perf_counter() - t) / 20000 * 1e6, 3)
print(json.dumps(d))
PYEOF
}
if [[ $DRY == 0 ]]; then
  sysinfo >"$OUT/system_before.json" 2>/dev/null || echo '{}' >"$OUT/system_before.json"
  say "system: $(cat "$OUT/system_before.json")"
fi

T0=$SECONDS
FAILED=()
RUNS=()
EXTRA_ENV=()
# run <name> <label> <nprocs> <ranks/node> <lib> <kind: mk|nccl> [extra driver args...]
run() {
  local name=$1 label=$2 np=$3 rpn=$4 lib=$5 kind=$6
  shift 6
  local left=$((BUDGET - (SECONDS - T0)))
  local json=$OUT/runs/$name.json log=$OUT/logs/$name.log
  local envs=("${COMMON_ENV[@]}")
  local args=(--lib "$lib" --nprocs "$np" --ranks-per-node "$rpn" --label "$label"
    --lat-sizes "$LAT" --bw-sizes "$BW" --lat-iters "$LIT" --bw-iters "$BIT" --out "$json"
    --warmup-first "$WFIRST")
  envs+=("${EXTRA_ENV[@]+"${EXTRA_ENV[@]}"}")
  if [[ $kind == mk ]]; then
    envs+=("${MK_ENV[@]}")
  else
    envs+=("${NC_ENV[@]}")
    args+=(--rank-env "NCCL_HOSTID=mkbench-host-%r")
  fi
  args+=("$@")
  local tmo=$((left - 10))
  ((tmo > 240)) && tmo=240
  args+=(--timeout-s "$((tmo > 30 ? tmo - 20 : 10))")
  local cmd=(env "${CLEAN[@]}" "${envs[@]}" timeout -k 5 "$tmo" "$DRIVER" "${args[@]}")
  local rc=0
  run_logged "$name" "$label" "$json" "$log" "$left" "$tmo" \
    'net_procs_bench:|NCCL WARN|MK WARN|\[mkernel\].*WARN|error' "${cmd[@]}" || rc=$?
  ((RAN_LOGGED)) && RUNS+=("$name")
  return $rc
}

[[ $DRY == 1 ]] && {
  echo "# MPS: started by this script in a temp dir (CUDA_MPS_PIPE_DIRECTORY/CUDA_MPS_LOG_DIRECTORY) unless one runs"
  echo "# real NCCL: $NCCL"
}
run mk_2x1 "mkernel 2 nodes x 1 process" 2 1 "$LIB" mk --pingpong
run nccl_2x1 "NCCL 2 hosts x 1 process (socket)" 2 1 "$NCCL" nccl --pingpong
run mk_2x2 "mkernel 2 nodes x 2 processes" 4 2 "$LIB" mk
run nccl_4x1 "NCCL 4 hosts x 1 process (socket; comparison for 2 x 2)" 4 1 "$NCCL" nccl
# Further rounds of the compared pairs (the report keeps each side's best round per size).
for ((r = 2; r <= ROUNDS; r++)); do
  run "mk_2x1__r$r" "mkernel 2 nodes x 1 process, round $r" 2 1 "$LIB" mk
  run "nccl_2x1__r$r" "NCCL 2 hosts x 1 process (socket), round $r" 2 1 "$NCCL" nccl
  run "mk_2x2__r$r" "mkernel 2 nodes x 2 processes, round $r" 4 2 "$LIB" mk
  run "nccl_4x1__r$r" "NCCL 4 hosts x 1 process (socket), round $r" 4 1 "$NCCL" nccl
done
if [[ $BOUND == 1 ]]; then
  if [[ -z $CPUS ]]; then
    say "SKIP the bound diagnostic: fewer than 2 CPUs allowed"
  else
    BW_SAVE=$BW
    BW=""
    run mk_2x1_bound "mkernel 2 nodes x 1, each process on one CPU ($CPUS)" 2 1 "$LIB" mk --bind-cpus "$CPUS"
    run nccl_2x1_bound "NCCL 2 hosts x 1, each process on one CPU ($CPUS)" 2 1 "$NCCL" nccl --bind-cpus "$CPUS"
    BW=$BW_SAVE
  fi
fi
# The socket backend's former path (helper threads on every connection), for comparison.
BW_SAVE=$BW
BW=""
EXTRA_ENV=(MKERNEL_SOCKET_INLINE=0)
run mk_2x1_helpers "mkernel 2 nodes x 1, MKERNEL_SOCKET_INLINE=0 (socket helper threads)" 2 1 "$LIB" mk
# Every ack in a wire message of its own (no held acks), for comparison.
EXTRA_ENV=(MKERNEL_PROXY_ACK_HOLD_US=0)
run mk_2x1_nohold "mkernel 2 nodes x 1, MKERNEL_PROXY_ACK_HOLD_US=0 (acks not held)" 2 1 "$LIB" mk
# Header and data of a put in two sendmsg calls (the former path), for comparison.
EXTRA_ENV=(MKERNEL_SOCKET_TX_COALESCE=0)
run mk_2x1_nocoalesce "mkernel 2 nodes x 1, MKERNEL_SOCKET_TX_COALESCE=0 (one sendmsg per message)" 2 1 "$LIB" mk
# Puts of 9..64 bytes in the ring command (opt-in), for the A/B that may flip the default.
EXTRA_ENV=(MKERNEL_PROXY_INLINE_CMD=2)
run mk_2x1_inline64 "mkernel 2 nodes x 1, MKERNEL_PROXY_INLINE_CMD=2 (puts <= 64 B in the command)" 2 1 "$LIB" mk
run mk_2x2_inline64 "mkernel 2 nodes x 2, MKERNEL_PROXY_INLINE_CMD=2 (puts <= 64 B in the command)" 4 2 "$LIB" mk
EXTRA_ENV=()
BW=$BW_SAVE
[[ $DRY == 1 ]] && exit 0
stop_mps
sysinfo >"$OUT/system_after.json" 2>/dev/null || echo '{}' >"$OUT/system_after.json"

# ---- report ----------------------------------------------------------------------------------
COMMIT=$(bench_commit "$REPO")
DEVICE=$(bench_device)
CMDLINE="$0 $BUILD_IN $OUT_IN $OPTS"
python3 - "$OUT" "$COMMIT" "${DEVICE:-unknown}" "$CMDLINE" "$NCCL" "$NCCL_VERSION" "${FAILED[@]+"${FAILED[@]}"}" <<'EOF'
import datetime, glob, json, os, re, sys
out, commit, device, cmdline, ncclpath, nver = sys.argv[1:7]
failed = sys.argv[7:]
runs, rounds = {}, {}
for f in sorted(glob.glob(os.path.join(out, "runs", "*.json"))):
    try:
        r = json.load(open(f))
    except Exception as e:
        failed.append("%s: unreadable JSON (%s)" % (f, e))
        continue
    name = os.path.basename(f)[:-5]
    rounds.setdefault(name.split("__r")[0], []).append(r)
    if "__r" not in name:
        runs[name] = r
def best_of(rs):
    # Per (op, bytes): the round with the lowest time (its busbw with it); the same rule for
    # both libraries. "rounds" says how many rounds had the row.
    best, seen = {}, {}
    for r in rs:
        for x in r.get("results", []):
            k = (x["op"], x["bytes"])
            seen[k] = seen.get(k, 0) + 1
            if k not in best or x["time_us"] < best[k]["time_us"]:
                best[k] = x
    return [dict(best[k], rounds=seen[k]) for k in sorted(best)]
for name, rs in rounds.items():
    if len(rs) > 1 and name in runs:
        runs[name] = dict(runs[name], results=best_of(rs), rounds=len(rs))
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception:
        return {}
sys_before, sys_after = load("system_before.json"), load("system_after.json")
stats = {}
for f in sorted(glob.glob(os.path.join(out, "logs", "mk_*.log"))):
    lines = [l.strip() for l in open(f, errors="replace") if "[mkernel] proxy rank" in l]
    if lines:
        stats[os.path.basename(f)[:-4]] = lines[:16]

def table(r):
    return {(x["op"], x["bytes"]): x for x in r.get("results", [])}

pairs = [("2 nodes x 1", "mk_2x1", "nccl_2x1"), ("2 nodes x 2", "mk_2x2", "nccl_4x1"),
         ("2 x 1, one CPU per process (diagnostic, no target)", "mk_2x1_bound", "nccl_2x1_bound"),
         ("2 x 1, mkernel with MKERNEL_SOCKET_INLINE=0 (diagnostic, no target)", "mk_2x1_helpers",
          "nccl_2x1"),
         ("2 x 1, mkernel with MKERNEL_PROXY_ACK_HOLD_US=0 (diagnostic, no target)", "mk_2x1_nohold",
          "nccl_2x1"),
         ("2 x 1, mkernel with MKERNEL_SOCKET_TX_COALESCE=0 (diagnostic, no target)",
          "mk_2x1_nocoalesce", "nccl_2x1"),
         ("2 x 1, mkernel with MKERNEL_PROXY_INLINE_CMD=2 (diagnostic, no target)",
          "mk_2x1_inline64", "nccl_2x1"),
         ("2 x 2, mkernel with MKERNEL_PROXY_INLINE_CMD=2 (diagnostic, no target)",
          "mk_2x2_inline64", "nccl_4x1")]
md = ["# mkernel vs NCCL, one process per rank on one GPU (MPS)", "",
      "- command: `%s`" % cmdline, "- commit: %s" % commit, "- device: %s" % device,
      "- date: %s" % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
      "- real NCCL: %s (version %s), NCCL_NET=Socket, NCCL_SOCKET_IFNAME=lo, one NCCL_HOSTID per process" % (ncclpath, nver),
      "- mkernel: MKERNEL_EMULATE_NODES=2, socket backend on lo",
      "- targets: latency (time) <= 1.0x NCCL up to 64 KiB; busbw >= 1.0x NCCL from 8 MiB"]
nr = max([r.get("rounds", 1) for r in runs.values()] or [1])
if nr > 1:
    md.append("- rounds: the compared pairs ran %d times, mkernel and NCCL interleaved; each side's "
              "best round per size (lowest time, with its busbw) is shown" % nr)
md.append("")
for k in ("mk_2x1", "nccl_2x1"):
    pp = runs.get(k, {}).get("pingpong_us")
    if pp is None or pp == 0:
        continue
    if pp == -1:
        md.append("- GPU flag ping-pong between the two processes (%s run): TIMED OUT: their "
                  "kernels did not run concurrently (is MPS in effect?)" % k)
    elif pp == -2:
        md.append("- GPU flag ping-pong (%s run): skipped, CUDA IPC refused" % k)
    else:
        md.append("- GPU flag ping-pong between the two processes (%s run): %.2f us per round trip "
                  "(microseconds: MPS runs their kernels concurrently; milliseconds: time-sliced)"
                  % (k, pp))
if sys_before:
    thr = ""
    b, a = sys_before.get("cgroup_cpu_stat", {}), sys_after.get("cgroup_cpu_stat", {})
    if "nr_throttled" in b and "nr_throttled" in a:
        thr = ", CPU quota throttling during the runs: %d periods, %.1f ms" % (
            int(a["nr_throttled"]) - int(b["nr_throttled"]),
            (int(a.get("throttled_usec", 0)) - int(b.get("throttled_usec", 0))) / 1000.0)
    md.append("- system: kernel %s, %s CPUs allowed, load %s, a 50 us sleep takes %s us (median; "
              "p90 %s), sched_yield %s us, timer slack %s ns, cgroup cpu.max %s%s" % (
                  sys_before.get("kernel"), sys_before.get("cpus_allowed"),
                  "/".join(sys_before.get("loadavg", [])), sys_before.get("sleep50us_median_us"),
                  sys_before.get("sleep50us_p90_us"), sys_before.get("sched_yield_us"),
                  sys_before.get("timerslack_ns"), sys_before.get("cgroup_cpu_max"), thr))
md.append("")
comparisons, missed = [], []
for title, mk, nc in pairs:
    target = "diagnostic" not in title
    if mk not in runs or nc not in runs:
        if target or mk in runs or nc in runs:
            md += ["## %s" % title, "", "missing run(s) (failed or skipped): %s" %
                   ", ".join(x for x in (mk, nc) if x not in runs), ""]
        continue
    a, b = table(runs[mk]), table(runs[nc])
    md += ["## %s" % title, "", "| op | bytes | mkernel us | NCCL us | time ratio | mkernel busbw GB/s | NCCL busbw GB/s | busbw ratio | target |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for key in sorted(a, key=lambda k: (k[0], k[1])):
        if key not in b:
            continue
        x, y = a[key], b[key]
        tr = x["time_us"] / y["time_us"] if y["time_us"] > 0 else float("nan")
        br = x["busbw_gbs"] / y["busbw_gbs"] if y["busbw_gbs"] > 0 else float("nan")
        verdict = ""
        if target and key[1] <= 65536:
            ok = tr <= 1.0
            verdict = "latency %s" % ("met" if ok else "MISSED")
        elif target and key[1] >= 8 << 20:
            ok = br >= 1.0
            verdict = "bandwidth %s" % ("met" if ok else "MISSED")
        else:
            ok = True
        if not ok:
            missed.append("%s %s %d B: %s" % (title, key[0], key[1], verdict))
        comparisons.append(dict(layout=title, op=key[0], bytes=key[1], mkernel=x, nccl=y,
                                time_ratio=tr, busbw_ratio=br, verdict=verdict))
        md.append("| %s | %d | %.1f | %.1f | %.2f | %.3f | %.3f | %.2f | %s |" % (
            key[0], key[1], x["time_us"], y["time_us"], tr, x["busbw_gbs"], y["busbw_gbs"], br, verdict))
    md.append("")
# A slow start: the first half of a size's timed calls >= 1.5x its second half (every round
# of every run, before the best-of-rounds merge hides it).
slow = []
for name in sorted(rounds):
    for i, r in enumerate(rounds[name]):
        for x in r.get("results", []):
            h0, h1 = x.get("first_half_us", 0), x.get("second_half_us", 0)
            if h1 > 0 and h0 >= 1.5 * h1:
                slow.append("- %s (round %d of %d): %s %d B: first half %.1f us, second half %.1f us"
                            % (name, i + 1, len(rounds[name]), x["op"], x["bytes"], h0, h1))
md += ["## Slow starts (first half of the timed calls >= 1.5x the second half)", ""]
md += (slow or ["- none"]) + [""]
if stats:
    md += ["## mkernel proxy statistics (MKERNEL_PROXY_STATS=1, first lines per run)", "", "```"]
    for k, v in stats.items():
        md += ["%s:" % k] + ["  " + l for l in v]
    md += ["```", ""]
md += ["## Verdict", ""]
md += ["- FAILED: " + f for f in failed] or []
md += ["- target missed: " + m for m in missed]
if not failed and not missed:
    md.append("- every run passed its checks; every target met")
elif not failed:
    md.append("- every run passed its checks (0 wrong elements)")
doc = dict(command=cmdline, commit=commit, device=device,
           date=datetime.datetime.now(datetime.timezone.utc).isoformat(), real_nccl=ncclpath,
           real_nccl_version=nver, runs=runs, comparisons=comparisons, failed=failed,
           targets_missed=missed, proxy_stats=stats, system_before=sys_before,
           system_after=sys_after)
json.dump(doc, open(os.path.join(out, "net_vs_nccl.json"), "w"), indent=1)
open(os.path.join(out, "net_vs_nccl.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
sys.exit(1 if failed else (3 if missed else 0))
EOF
rc=$?
say "wrote $OUT/net_vs_nccl.md and $OUT/net_vs_nccl.json (rc=$rc; $((SECONDS - T0))s)"
exit $rc
