#!/usr/bin/env python3
"""Report of bench/fused_vs_nccl.sh (issue 12, fused benchmark mode (b)).

usage: fused_vs_nccl_report.py <out-dir> <commit> <device> <command> <nccl-path> <nccl-version>
                               <env-record> [failure...]
Reads <out>/runs/mk.json and runs/nccl.json (bench_fused_procs_bench) and logs/mk.log (the
library's NCCL_DEBUG_SUBSYS=FUSED lines between the driver's marker lines); writes
<out>/fused_vs_nccl.json and fused_vs_nccl.md and prints the markdown.
Exit status: 1 a run failed or an element mismatched, 3 the target (NCCL / mkernel auto >= 1.0
at every shape) is missed, 0 otherwise.
"""
import datetime
import json
import os
import re
import sys

MARK = re.compile(r"fused_procs_bench: mark pid=(\d+) rank=(\d+) shape=(\d+) op=(\S+) M=(\d+) "
                  r"N=(\d+) K=(\d+) variant=(\S+) phase=(\S+)")
# mkernel's log prefix: host:pid:tid [dev] mkernel INFO message
MKLINE = re.compile(r"^\S*?:(\d+):\d+ \[[^\]]*\] mkernel INFO (.*)$")
SPLIT = re.compile(r"(\w+) rank (\d+) M=(\d+) N=(\d+) K=(\d+) fused: compute=(\d+) comm=(\d+) "
                   r"\(([^)]*)\)")
FALLBACK = "no fused kernel for this layout"
# The fused kernel's launch logs the cost model's verdict times after the split (fused_launch.cu).
MODEL = re.compile(r"predicted fused ([\d.]+) us,? sequential ([\d.]+) us")
RATES = "fused cost model: measured rates"


def parse_log(path):
    """{(shape, variant): {"splits": {(rank, compute, comm, source)}, "model": [(f, s)]}},
    fallback lines, rate lines, whether any marker was seen."""
    out, fallback, rates, marked = {}, [], [], False
    cur = {}  # pid -> (shape, variant)
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return out, fallback, rates, marked
    for line in lines:
        m = MARK.search(line)
        if m:
            marked = True
            cur[m.group(1)] = (int(m.group(3)), m.group(8))
            continue
        m = MKLINE.match(line)
        if not m:
            continue
        pid, msg = m.group(1), m.group(2)
        if FALLBACK in msg:
            fallback.append(msg.strip())
        if RATES in msg:
            rates.append(msg.strip())
        key = cur.get(pid)
        if key is None:
            continue
        e = out.setdefault(key, {"splits": set(), "model": []})
        s = SPLIT.search(msg)
        if s:
            e["splits"].add((int(s.group(2)), int(s.group(6)), int(s.group(7)), s.group(8)))
        p = MODEL.search(msg)
        if p:
            e["model"].append((float(p.group(1)), float(p.group(2))))
    return out, fallback, rates, marked


def path_of(log, shape, variant, fallback, marked):
    """What the call ran, from the log: the split and its source, or the sequential path."""
    if not marked:
        return "unknown (no marker lines in logs/mk.log)", None
    e = log.get((shape, variant))
    if e and e["splits"]:
        sp = sorted(e["splits"])
        kinds = sorted({(c, s, src) for _, c, s, src in sp})
        txt = "; ".join("compute=%d comm=%d (%s)" % k for k in kinds)
        return "fused " + txt, [dict(rank=r, compute=c, comm=s, source=src) for r, c, s, src in sp]
    why = "sequential (no fused-kernel log line)"
    if variant == "fused" and fallback:
        why += "; the library: no fused kernel for this layout"
    if variant == "auto":
        why += "; auto across nodes fuses AllGather only from N = 256 (xnode.h gxAutoFuses)"
    return why, None


def model_of(log, shape, variant):
    e = log.get((shape, variant))
    if e and e["model"]:
        f, s = e["model"][0]
        return "fused %.0f us / seq %.0f us" % (f, s), dict(fused_us=f, sequential_us=s)
    return "not exposed", None


def fmt(x, f="%.3f"):
    return f % x if isinstance(x, (int, float)) else "-"


def main(argv):
    if len(argv) < 8:
        print(__doc__, file=sys.stderr)
        return 2
    out, commit, device, cmdline, ncclpath, nver, envrec = argv[1:8]
    failed = list(argv[8:])
    runs = {}
    for k in ("mk", "nccl"):
        p = os.path.join(out, "runs", k + ".json")
        try:
            runs[k] = json.load(open(p))
        except (OSError, ValueError) as e:
            failed.append("%s: no readable results (%s)" % (p, e))
    for k, r in runs.items():
        if not r.get("ranks_finished", False):
            failed.append("%s: not every rank finished (see logs/%s.log)" % (k, k))
    log, fallback, rates, marked = parse_log(os.path.join(out, "logs", "mk.log"))

    def shapes(k):
        return runs.get(k, {}).get("shapes", [])

    mk, nc = shapes("mk"), shapes("nccl")
    rows, missed, wrong_total = [], [], 0
    md = ["# Fused GEMM + collective: mkernel vs cuBLAS + NCCL, 2 processes as 2 nodes (issue 12 (b))",
          "",
          "- command: `%s`" % cmdline, "- commit: %s" % commit, "- device: %s" % device,
          "- date: %s" % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
          "- mkernel: %s, MKERNEL_EMULATE_NODES=2 (2 virtual nodes x 1 process), %s" % (
              runs.get("mk", {}).get("library", "?"), envrec),
          "- NCCL: %s (version %s), NCCL_NET=Socket, NCCL_SOCKET_IFNAME=lo, one NCCL_HOSTID per "
          "process; cuBLAS cublasGemmEx bf16, fp32 accumulation" % (ncclpath, nver),
          "- both: one GPU under MPS, bf16 in/out, A [M,K] x B [N,K]^T; time = median over %s reps of "
          "the slowest rank (CUDA events, a barrier between reps); TF/s per rank = 2MNK / time "
          "(r0 / r1 from each rank's own median)" % runs.get("mk", runs.get("nccl", {})).get("reps", "?"),
          "- check: every element of every rank against a cuBLAS fp32 reference of the same "
          "inputs (tolerance of tests/gpu/test_fused_util.cuh)",
          "- split: from the library's NCCL_DEBUG_SUBSYS=FUSED log; cost model prediction: %s" % (
              "logged" if any(e["model"] for e in log.values()) else
              "not exposed (the library logs neither tFusedUs nor tSequentialUs)"),
          "- target: NCCL ms / mkernel auto ms >= 1.0 at every shape", ""]
    if rates:
        md += ["- cost model rates: " + rates[0], ""]
    md += ["| op | M x N x K | mk auto ms | mk fused ms | mk seq ms | cuBLAS+NCCL ms | NCCL/mk | "
           "target | mk auto TF/s/rank (r0 / r1) | NCCL TF/s/rank (r0 / r1) | wrong (mk / NCCL) | "
           "auto ran | fused ran | model predicted |",
           "|---|---|---:|---:|---:|---:|---:|---|---|---|---|---|---|---|"]
    for i, a in enumerate(mk or nc):
        b = nc[i] if i < len(nc) else {}
        x = mk[i] if i < len(mk) else {}
        name = ("%dx%dx%d %s" % (a["M"], a["N"], a["K"], a.get("shape_tag", ""))).strip()
        va, vb = x.get("variants", {}), b.get("variants", {})
        if x and b and (x["op"], x["M"], x["N"], x["K"]) != (b["op"], b["M"], b["N"], b["K"]):
            failed.append("shape %d differs between the runs: %s vs %s" % (i, x, b))
            continue
        if x.get("state") != "ran" or b.get("state") != "ran" or "auto" not in va or \
                "cublas+coll" not in vb:
            why = "; ".join("%s: %s%s" % (k, r.get("state", "missing"),
                                          (" (" + r["note"] + ")") if r.get("note") else "")
                            for k, r in (("mkernel", x), ("NCCL", b)) if r.get("state") != "ran")
            md.append("| %s | %s | %s |" % (a["op"], name, why or "incomplete"))
            rows.append(dict(op=a["op"], M=a["M"], N=a["N"], K=a["K"], tag=a.get("shape_tag"),
                             ran=False, note=why))
            missed.append("%s %s: not measured (%s)" % (a["op"], name, why or "incomplete"))
            continue
        au, fu, sq, ref = va.get("auto", {}), va.get("fused", {}), va.get("sequential", {}), \
            vb["cublas+coll"]
        ratio = ref["median_ms"] / au["median_ms"] if au.get("median_ms") else float("nan")
        ok = ratio >= 1.0
        if not ok:
            missed.append("%s %s: NCCL/mkernel %.2f" % (a["op"], name, ratio))
        wmk = sum(v.get("wrong", 0) for v in va.values())
        wnc = ref.get("wrong", 0)
        wrong_total += wmk + wnc
        if wmk or wnc:
            failed.append("%s %s: %d mkernel and %d NCCL elements outside the tolerance" % (
                a["op"], name, wmk, wnc))
        pa, spa = path_of(log, i, "auto", fallback, marked)
        pf, spf = path_of(log, i, "fused", fallback, marked) if "fused" in va else ("-", None)
        mtxt, mrec = model_of(log, i, "auto")
        per = lambda v: " / ".join("%.1f" % t for t in v.get("per_rank_tflops", []))
        md.append("| %s | %s | %s | %s | %s | %s | %.2f | %s | %s | %s | %d / %d | %s | %s | %s |" % (
            a["op"], name, fmt(au.get("median_ms")), fmt(fu.get("median_ms")),
            fmt(sq.get("median_ms")), fmt(ref.get("median_ms")), ratio,
            "met" if ok else "MISSED", per(au), per(ref), wmk, wnc, pa, pf, mtxt))
        rows.append(dict(op=a["op"], M=a["M"], N=a["N"], K=a["K"], tag=a.get("shape_tag"), ran=True,
                         mkernel_ms={k: v.get("median_ms") for k, v in va.items()},
                         nccl_ms=ref.get("median_ms"), ratio_nccl_over_mkernel_auto=ratio,
                         target_met=ok,
                         tflops_per_rank=dict(mkernel_auto=au.get("tflops_per_rank"),
                                              nccl=ref.get("tflops_per_rank")),
                         per_rank_tflops=dict(mkernel_auto=au.get("per_rank_tflops"),
                                              nccl=ref.get("per_rank_tflops")),
                         wrong=dict(mkernel=wmk, nccl=wnc),
                         auto_path=pa, auto_split=spa, fused_path=pf, fused_split=spf,
                         model=mrec, model_note=mtxt))
    md += ["", "## Verdict", ""]
    md += ["- FAILED: " + f for f in failed]
    md += ["- target missed: " + m for m in missed]
    if not failed and not missed:
        md.append("- both runs passed every check (0 wrong elements); NCCL/mkernel >= 1.0 at every shape")
    elif not failed:
        md.append("- both runs passed every check (0 wrong elements)")
    if fallback:
        md.append("- the library said: " + fallback[0])
    doc = dict(command=cmdline, commit=commit, device=device,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(), real_nccl=ncclpath,
               real_nccl_version=nver, env=envrec, runs=runs, comparisons=rows, failed=failed,
               targets_missed=missed, wrong_total=wrong_total, library_fallback=fallback,
               cost_model_rates=rates,
               cost_model_prediction="logged" if any(e["model"] for e in log.values())
               else "not exposed")
    json.dump(doc, open(os.path.join(out, "fused_vs_nccl.json"), "w"), indent=1)
    open(os.path.join(out, "fused_vs_nccl.md"), "w").write("\n".join(md) + "\n")
    print("\n".join(md))
    return 1 if failed else (3 if missed else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
