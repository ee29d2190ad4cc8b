#!/usr/bin/env python3
"""Before/after table of the collective, GEMM and net benchmarks (scripts/bench_compare.sh).

usage: bench_compare.py --raw DIR --out compare.md [--json compare.json] [--command C]
                        [--before-commit X] [--after-commit Y] [--device D] [--note N ...]
                        [--factor 3] [--floor 0.03]

DIR holds <bench>_<side>_r<round>.json (bench: coll, gemm or net; side: before or after),
as written by bench_coll_bench, bench_gemm_bench and bench_net_bench with --out, and
runs.tsv (bench, side, round, exit code, seconds). Every value both versions report is
compared: the median over the rounds of each side, after/before, and the round-to-round
spread of each side ((max - min) / median) as its noise. A row is flagged when its change
exceeds max(factor x noise, floor), noise being the larger of the row's two spreads and the
median spread of its group (same benchmark, table and metric): with two rounds a side one
row's spread can be near zero by chance. Rows measuring code that is the same on both sides
(cuBLAS, cudaMemcpy, plain TCP) are controls: if they move, the machine drifted.
Standard library only.
"""
import argparse
import datetime
import glob
import json
import math
import os
import re
import statistics
import sys

BENCHES = ("coll", "gemm", "net")
SIDES = ("before", "after")
TITLES = {
    "coll": "Collectives (bench_coll_bench)",
    "gemm": "GEMM engine (bench_gemm_bench)",
    "net": "Inter-node path over virtual nodes (bench_net_bench)",
}


def fmt_bytes(n):
    n = int(n)
    for shift, suffix in ((30, "G"), (20, "M"), (10, "K")):
        if n >= (1 << shift) and n % (1 << shift) == 0:
            return "%d%s" % (n >> shift, suffix)
    return str(n)


class Table:
    """Values keyed by (bench, group, row, metric), in the order they first appear."""

    def __init__(self):
        self.rows = {}
        self.problems = []  # (bench, side, round, text)

    def add(self, bench, side, rnd, group, row, metric, unit, better, value, control=False):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return
        if not math.isfinite(value) or value <= 0:
            return  # 0 means "not measured" in these benchmarks (e.g. a failed variant)
        key = (bench, group, row, metric)
        e = self.rows.setdefault(
            key, {"unit": unit, "better": better, "control": control, "before": {}, "after": {}}
        )
        e[side][rnd] = float(value)

    def problem(self, bench, side, rnd, text):
        self.problems.append((bench, side, rnd, text))


def extract_coll(t, side, rnd, d):
    def add(*a, **k):
        t.add("coll", side, rnd, *a, **k)

    single = (d.get("single_rank_allreduce_8B") or {}).get("mkernel") or {}
    if single.get("ran"):
        group = "one rank, 8 B float AllReduce"
        for key, label in (
            ("latency_call_median_us", "latency, call to completion, median"),
            ("latency_device_median_us", "latency, device side, median"),
            ("back_to_back_per_op_us", "per op, back to back"),
            ("graph_per_op_us", "per op inside a CUDA graph"),
            ("host_per_call_us", "host time per call, mean"),
            ("host_per_call_batch_median_us", "host time per call, median of batches"),
        ):
            add(group, label, "time", "us", "lower", single.get(key))
        if single.get("result_correct") is False:
            t.problem("coll", side, rnd, "one-rank AllReduce result wrong")
    elif single:
        t.problem("coll", side, rnd, "one-rank part did not run: %s" % single.get("error", "?"))
    sh = d.get("shared_gpu") or {}
    ranks = sh.get("ranks", "?")
    if sh and not sh.get("setup_ok", True):
        t.problem("coll", side, rnd, "shared-GPU setup failed: %s" % sh.get("setup_error", "?"))
    if "time_us" in sh:
        group = "%s ranks sharing the GPU, float AllReduce of %s bytes" % (
            ranks, fmt_bytes(sh.get("allreduce_bytes", 0)))
        add(group, "AllReduce", "time", "us", "lower", sh.get("time_us"))
        add(group, "cudaMemcpy D2D (control)", "bandwidth", "GB/s", "higher",
            sh.get("memcpy_d2d_rw_GBps"), control=True)
        if sh.get("wrong"):
            t.problem("coll", side, rnd, "big AllReduce: %s wrong values" % sh["wrong"])
    group = "sweep, %s ranks sharing the GPU (nccl-tests rows)" % ranks
    for r in sh.get("sweep") or []:
        row = "%s %s" % (r.get("coll", "?"), fmt_bytes(r.get("size_bytes", 0)))
        if r.get("error") or r.get("wrong"):
            t.problem("coll", side, rnd, "%s: %s" % (
                row, r.get("error") or "%s wrong values" % r.get("wrong")))
            continue
        add(group, row, "time", "us", "lower", r.get("time_us"))


def extract_gemm(t, side, rnd, d):
    layout = d.get("b_layout", "NK")
    group = "bf16 GEMM, B as [%s], median of %s reps" % (
        ",".join(layout) if len(layout) == 2 else layout, d.get("reps", "?"))
    for r in d.get("results") or []:
        row = "%sx%sx%s" % (r.get("M"), r.get("N"), r.get("K"))
        for key, metric, control in (
            ("engine_tflops", "engine", False),
            ("engine_sms_minus_16_tflops", "engine, SMs - 16", False),
            ("cublas_h0_tflops", "cuBLASLt heuristic #0 (control)", True),
            ("cublas_best_tflops", "cuBLASLt best (control)", True),
        ):
            t.add("gemm", side, rnd, group, row, metric, "TFLOP/s", "higher", r.get(key), control)
        diff = r.get("max_rel_diff_vs_cublas")
        if isinstance(diff, (int, float)) and not diff <= 1e-2:
            t.problem("gemm", side, rnd, "%s: max relative difference vs cuBLAS %g" % (row, diff))


def extract_net(t, side, rnd, d):
    group = "put bandwidth, 4 pairs across 2 virtual nodes (socket, loopback)"
    for r in d.get("bandwidth") or []:
        row = fmt_bytes(r.get("bytes", 0))
        for key, metric, control in (
            ("put_zero_copy_gbs", "put, zero-copy", False),
            ("put_staged_gbs", "put, staged", False),
            ("raw_tcp_gbs", "raw TCP (control)", True),
        ):
            t.add("net", side, rnd, group, row, metric, "GB/s", "higher", r.get(key), control)
    group = "one-way latency, rank 0 <-> rank 4 (ping-pong / 2)"
    for r in d.get("latency_us") or []:
        row = fmt_bytes(r.get("bytes", 0))
        for key, metric, control in (
            ("gpu_put", "GPU put", False),
            ("host_driven", "host-driven copy + TCP (control)", True),
            ("raw_tcp", "raw TCP (control)", True),
        ):
            t.add("net", side, rnd, group, row, metric, "us", "lower", r.get(key), control)


EXTRACT = {"coll": extract_coll, "gemm": extract_gemm, "net": extract_net}


def load(raw):
    t = Table()
    runs = {}  # (bench, side, round) -> dict
    tsv = os.path.join(raw, "runs.tsv")
    if os.path.exists(tsv):
        with open(tsv) as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) >= 5:
                    runs[(p[0], p[1], int(p[2]))] = {"rc": int(p[3]), "seconds": int(p[4])}
    pat = re.compile(r"^(coll|gemm|net)_(before|after)_r(\d+)\.json$")
    files = []
    for path in glob.glob(os.path.join(raw, "*.json")):
        m = pat.match(os.path.basename(path))
        if m:
            files.append((BENCHES.index(m.group(1)), SIDES.index(m.group(2)), int(m.group(3)),
                          path))
    # before r1 first, so row order follows the old version, new rows at the end
    files.sort(key=lambda x: (x[0], x[2], x[1]))
    for bi, si, rnd, path in files:
        bench, side = BENCHES[bi], SIDES[si]
        info = runs.setdefault((bench, side, rnd), {})
        info["json"] = os.path.basename(path)
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            t.problem(bench, side, rnd, "unreadable JSON %s: %s" % (os.path.basename(path), e))
            continue
        dev = d.get("device")
        info["device"] = dev.get("name") if isinstance(dev, dict) else dev
        info["git_commit"] = d.get("git_commit")
        info["date"] = d.get("date")
        for fl in d.get("failures") or []:
            t.problem(bench, side, rnd, "benchmark reported: %s" % fl)
        EXTRACT[bench](t, side, rnd, d)
    for (bench, side, rnd), info in runs.items():
        if info.get("rc") == -1:
            t.problem(bench, side, rnd, "not run: the script's deadline (MK_CMP_DEADLINE) came first")
        elif "json" not in info:
            t.problem(bench, side, rnd, "no JSON (exit code %s)" % info.get("rc", "?"))
        elif info.get("rc", 0) != 0:
            t.problem(bench, side, rnd, "exit code %s" % info["rc"])
    return t, runs


def spread(vals):
    if len(vals) < 2:
        return None
    return (max(vals) - min(vals)) / statistics.median(vals)


def group_noise(t):
    """Median spread over the rows of each (bench, group, metric): with two rounds a side, one
    row's spread can be near zero by chance, so a row's noise is at least its group's."""
    spreads = {}
    for (bench, group, row, metric), e in t.rows.items():
        for side in SIDES:
            s = spread(list(e[side].values()))
            if s is not None:
                spreads.setdefault((bench, group, metric), []).append(s)
    return {k: statistics.median(v) for k, v in spreads.items()}


def analyse(t, factor, floor):
    out = []
    typical = group_noise(t)
    for (bench, group, row, metric), e in t.rows.items():
        b = [e["before"][k] for k in sorted(e["before"])]
        a = [e["after"][k] for k in sorted(e["after"])]
        r = {"bench": bench, "group": group, "row": row, "metric": metric, "unit": e["unit"],
             "better": e["better"], "control": e["control"], "before": b, "after": a}
        if b and a:
            mb, ma = statistics.median(b), statistics.median(a)
            ratio = ma / mb
            worse = ratio if e["better"] == "lower" else 1.0 / ratio  # > 1: slower
            sb, sa = spread(b), spread(a)
            gn = typical.get((bench, group, metric), 0.0)
            noise = max([s for s in (sb, sa) if s is not None] + [gn])
            thr = max(factor * noise, floor)
            flag = ""
            if abs(worse - 1.0) > thr:
                flag = "SLOWER" if worse > 1 else "faster"
                if e["control"]:
                    flag = "control " + ("slower" if worse > 1 else "faster")
            # drift: last round against the first, per side (> 1: slower later)
            drift = {}
            for side, v in (("before", b), ("after", a)):
                if len(v) >= 2:
                    q = v[-1] / v[0]
                    drift[side] = q if e["better"] == "lower" else 1.0 / q
            r.update(median_before=mb, median_after=ma, ratio=ratio, worse=worse,
                     spread_before=sb, spread_after=sa, group_noise=gn, threshold=thr, flag=flag,
                     drift=drift)
        out.append(r)
    return out


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def pct(x):
    return "n/a" if x is None else "%.1f%%" % (100.0 * x)


def change(worse):
    d = 100.0 * (worse - 1.0)
    if abs(d) < 0.05:
        return "same"
    return "%.1f%% %s" % (abs(d), "slower" if d > 0 else "faster")


def num(x):
    if x is None:
        return "-"
    a = abs(x)
    return "%.0f" % x if a >= 1000 else "%.1f" % x if a >= 100 else "%.2f" % x if a >= 1 else "%.3g" % x


def render(rows, t, runs, args):
    L = []
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    devs = sorted({str(i.get("device")) for i in runs.values() if i.get("device")})
    L.append("# Benchmarks before/after, side by side in one run")
    L.append("")
    L.append("- command: `%s`" % (args.command or "?"))
    L.append("- before: %s; after: %s" % (args.before_commit or "?", args.after_commit or "?"))
    L.append("- device: %s%s" % (args.device or "?",
                                 "" if not devs else " (benchmarks report: %s)" % ", ".join(devs)))
    L.append("- date: %s" % now)
    for note in args.note:
        L.append("- %s" % note)
    L.append("- order: for each benchmark, before, after, before, after (rounds r1, r2, ...)")
    L.append(
        "- reading: *after/before* is the ratio of the values as reported (times in us: > 1 is "
        "slower; GB/s and TFLOP/s: > 1 is faster); *change* says which. *noise* is each "
        "side's round-to-round spread (max - min) / median. A row is flagged when its change "
        "exceeds max(%g x noise, %s), noise being the larger of the row's two spreads and the "
        "median spread of its table (shown under each table). Controls measure code that is the same on "
        "both sides (cuBLAS, cudaMemcpy, plain TCP): when they move, the machine drifted."
        % (args.factor, pct(args.floor)))
    L.append("")

    L.append("## Verdict")
    L.append("")
    slower = [r for r in rows if r.get("flag") == "SLOWER"]
    faster = [r for r in rows if r.get("flag") == "faster"]
    ctl = [r for r in rows if r.get("flag", "").startswith("control")]
    for bench in BENCHES:
        if not any(r["bench"] == bench and "ratio" in r for r in rows):
            L.append("- **%s: no value reported by both versions**: nothing compared (see Problems)."
                     % bench)
    if t.problems:
        L.append("- %d problem(s) reported by the runs: see Problems below." % len(t.problems))
    if not slower:
        L.append("- No compared row is slower beyond noise.")
    else:
        L.append("- **%d row(s) slower beyond noise:**" % len(slower))
        for r in slower:
            L.append("  - %s / %s / %s %s: %s (noise %s / %s)" % (
                r["bench"], r["group"], r["row"], r["metric"], change(r["worse"]),
                pct(r["spread_before"]), pct(r["spread_after"])))
    if faster:
        L.append("- %d row(s) faster beyond noise: %s" % (len(faster), "; ".join(
            "%s %s %s (%s)" % (r["bench"], r["row"], r["metric"], change(r["worse"]))
            for r in faster)))
    if ctl:
        L.append("- controls that moved beyond noise (machine drift; weigh the rows near them): "
                 + "; ".join("%s %s %s (%s)" % (r["bench"], r["row"], r["metric"],
                                                change(r["worse"])) for r in ctl))
    L.append("")
    L.append("| benchmark | rows compared | slower | faster | geomean change | median noise "
             "| drift before r_last/r1 | drift after r_last/r1 | controls geomean |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for bench in BENCHES:
        both = [r for r in rows if r["bench"] == bench and "ratio" in r]
        main = [r for r in both if not r["control"]]
        ctls = [r for r in both if r["control"]]
        if not both:
            L.append("| %s | 0 | | | | | | | |" % bench)
            continue
        noises = [max(x for x in (r["spread_before"], r["spread_after"]) if x is not None)
                  for r in main if r["spread_before"] is not None or r["spread_after"] is not None]
        g = geomean([r["worse"] for r in main])
        gc = geomean([r["worse"] for r in ctls])
        db = geomean([r["drift"]["before"] for r in main if "before" in r["drift"]])
        da = geomean([r["drift"]["after"] for r in main if "after" in r["drift"]])
        L.append("| %s | %d | %d | %d | %s | %s | %s | %s | %s |" % (
            bench, len(main), sum(r["flag"] == "SLOWER" for r in main),
            sum(r["flag"] == "faster" for r in main), change(g) if g else "-",
            pct(statistics.median(noises)) if noises else "n/a",
            change(db) if db else "-", change(da) if da else "-",
            change(gc) if gc else "-"))
    L.append("")

    if t.problems:
        L.append("## Problems reported by the runs")
        L.append("")
        for bench, side, rnd, text in sorted(t.problems, key=lambda p: (
                BENCHES.index(p[0]) if p[0] in BENCHES else 9, p[1], p[2])):
            L.append("- %s %s r%s: %s" % (bench, side, rnd, text))
        L.append("")

    for bench in BENCHES:
        L.append("## %s" % TITLES[bench])
        L.append("")
        mine = [r for r in rows if r["bench"] == bench]
        if not mine:
            L.append("No values (no run of this benchmark produced JSON).")
            L.append("")
            continue
        groups = []
        for r in mine:
            if r["group"] not in groups:
                groups.append(r["group"])
        for g in groups:
            L.append("### %s" % g)
            L.append("")
            body = []
            only = {"before": [], "after": []}
            for r in (x for x in mine if x["group"] == g):
                name = "%s (%s)" % (r["metric"], r["unit"])
                if "ratio" not in r:
                    only["before" if r["before"] else "after"].append("%s %s" % (r["row"], name))
                    continue
                flag = "**SLOWER**" if r["flag"] == "SLOWER" else r["flag"]
                body.append("| %s | %s | %s | %s | %.3f | %s | %s | %s | %s | %s | %s |" % (
                    r["row"], name, num(r["median_before"]), num(r["median_after"]), r["ratio"],
                    change(r["worse"]), pct(r["spread_before"]), pct(r["spread_after"]), flag,
                    " / ".join(num(v) for v in r["before"]),
                    " / ".join(num(v) for v in r["after"])))
            if body:
                L.append("| row | metric | before | after | after/before | change | noise before "
                         "| noise after | flag | before rounds | after rounds |")
                L.append("|---|---|---|---|---|---|---|---|---|---|---|")
                L.extend(body)
            gn = {}
            for r in mine:
                if r["group"] == g and "group_noise" in r:
                    gn.setdefault(r["metric"], r["group_noise"])
            if gn:
                L.append("")
                L.append("Median noise of this table: %s." % ", ".join(
                    "%s %s" % (m, pct(v)) for m, v in gn.items()))
            for side in SIDES:
                if only[side]:
                    L.append("")
                    L.append("Only %s reports: %s." % (side, ", ".join(only[side])))
            L.append("")

    L.append("## Runs")
    L.append("")
    L.append("| benchmark | side | round | exit code | seconds | JSON | commit in JSON | date in JSON |")
    L.append("|---|---|---|---|---|---|---|---|")
    for (bench, side, rnd), i in sorted(runs.items(), key=lambda x: (
            BENCHES.index(x[0][0]) if x[0][0] in BENCHES else 9, x[0][2], SIDES.index(x[0][1])
            if x[0][1] in SIDES else 9)):
        L.append("| %s | %s | %d | %s | %s | %s | %s | %s |" % (
            bench, side, rnd, i.get("rc", "?"), i.get("seconds", "?"), i.get("json", "missing"),
            i.get("git_commit", "-"), i.get("date", "-")))
    L.append("")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--raw", required=True, help="folder with the runs' JSON and runs.tsv")
    ap.add_argument("--out", required=True, help="markdown output")
    ap.add_argument("--json", help="machine-readable output (every row)")
    ap.add_argument("--command", default="")
    ap.add_argument("--before-commit", default="")
    ap.add_argument("--after-commit", default="")
    ap.add_argument("--device", default="")
    ap.add_argument("--note", action="append", default=[], help="a line for the header (repeatable)")
    ap.add_argument("--factor", type=float, default=3.0,
                    help="flag when the change exceeds factor x noise (default 3)")
    ap.add_argument("--floor", type=float, default=0.03,
                    help="... and exceeds this relative change (default 0.03)")
    args = ap.parse_args()
    if not os.path.isdir(args.raw):
        sys.exit("bench_compare.py: no folder %s" % args.raw)
    if args.factor < 0 or args.floor < 0:
        sys.exit("bench_compare.py: --factor and --floor must be >= 0")
    t, runs = load(args.raw)
    rows = analyse(t, args.factor, args.floor)
    text = render(rows, t, runs, args)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": args.command, "before_commit": args.before_commit,
                       "after_commit": args.after_commit, "device": args.device,
                       "factor": args.factor, "floor": args.floor, "rows": rows,
                       "problems": [list(p) for p in t.problems],
                       "runs": [dict(bench=k[0], side=k[1], round=k[2], **v)
                                for k, v in runs.items()]}, f, indent=1)
    # The verdict and the per-benchmark summary on stdout, for a console that shows the end.
    verdict = text.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    print("bench_compare.py: wrote %s\n%s" % (args.out, verdict.strip()))
    # Exit code 1 when a benchmark could not be compared at all (its runs failed).
    return 0 if all(any(r["bench"] == b and "ratio" in r for r in rows) for b in BENCHES) else 1


if __name__ == "__main__":
    sys.exit(main())
