"""moe_bench.py --dedup-modes (issue 13, MKERNEL_MOE_NODE_DEDUP): the option, the launcher's
runs (one torch side, then the mkernel side once per mode) and the summary over the modes.

Pure Python (no torch): bench/test_moe_dedup_bench.py checks it on the CPU."""

import argparse
import json
import os
import tempfile

import bench_py_util as bpu

DEDUP_ENV = "MKERNEL_MOE_NODE_DEDUP"
# Each mkernel-side run's rank 0 appends its rows' summary (JSON lines) to this file.
SUMMARY_ENV = "MK_MOE_BENCH_DEDUP_SUMMARY"


def parse_modes(s):
  v = [x.strip() for x in s.split(",") if x.strip()]
  if not v or set(v) - {"0", "1"} or len(set(v)) != len(v):
    raise argparse.ArgumentTypeError("%r: distinct values of 0, 1, comma separated" % s)
  return [int(x) for x in v]


def dedup_mode():
  """This run's mode: the variable as the library reads it (unset: the default, 1)."""
  v = os.environ.get(DEDUP_ENV, "1")
  return int(v) if v.isdigit() else v


def xnode_text(r):
  """The modelled cross-node MiB per call of the row's mode (the other modes in brackets)."""
  x, m = r["xnode_mib_model"], str(r["dedup_mode"])
  return "%s (%s)" % ("%.2f" % x[m] if m in x else "?", ", ".join(
      "mode %s %.2f" % kv for kv in sorted(x.items()) if kv[0] != m))


def launch_modes(tool, script, argv, env, a, timeout):
  """The torch side once, then the mkernel side once per --dedup-modes value (that mode in its
  environment); then the summary over the modes. Returns the worst run's status."""
  fd, path = tempfile.mkstemp(prefix="mk-moe-bench-dedup.", suffix=".jsonl")
  os.close(fd)
  try:
    rc = bpu.launch_nodes(tool, script, argv, dict(env, **{SUMMARY_ENV: path}), a.nproc,
                          a.nodes, a.mps, torch_timeout=timeout,
                          mkernel_envs=[{DEDUP_ENV: str(m)} for m in a.dedup_modes])
    with open(path) as f:
      entries = [json.loads(x) for x in f if x.strip()]
    bpu.log(summary_text(entries, a.dedup_modes))
    return rc
  finally:
    os.unlink(path)


def append_summary(rows, mode, shape_text, check_text, path=None):
  """An mkernel-side run's rank 0: one JSON line per shape for the launcher's summary."""
  path = path or os.environ.get(SUMMARY_ENV)
  if not path:
    return
  with open(path, "a") as f:
    for r in rows:
      e = dict(mode=mode, shape=shape_text(r), skipped=r.get("skipped"))
      if "variants" in r:
        e.update(ms={x: m["ms"] for x, m in r["variants"].items() if "ms" in m},
                 check=check_text(r))
      if "xnode_mib_model" in r:
        e["xnode"] = xnode_text(dict(r, dedup_mode=mode))
      f.write(json.dumps(e) + "\n")


def summary_text(entries, modes):
  """Markdown: per shape, one line per mode (a mode whose run left no line: said so)."""
  names, shapes = [], []
  for e in entries:
    names += [x for x in e.get("ms", {}) if x not in names]
    shapes += [e["shape"]] if e["shape"] not in shapes else []
  L = ["", "moe_bench --dedup-modes: ms per call by %s (torch: the one torch side), check, "
       "x-node MiB/call of the dispatch's token rows (model; other modes in brackets)" %
       DEDUP_ENV, "",
       "| " + " | ".join(["shape", "mode"] + names + ["check", "x-node MiB/call"]) + " |",
       "|" + "---|" * (len(names) + 4)]
  for s in shapes:
    for m in modes:
      e = next((x for x in entries if x["shape"] == s and x["mode"] == m), None)
      if e is None or e.get("skipped"):
        why = "skipped: " + e["skipped"] if e else "no result (that run failed: see above)"
        L.append("| %s | %s | %s |" % (s, m, why))
        continue
      cells = ["%.3f" % e["ms"][x] if x in e.get("ms", {}) else "n/a" for x in names]
      L.append("| " + " | ".join([s, str(m)] + cells + [e.get("check", "n/a"),
                                                         e.get("xnode", "n/a")]) + " |")
  if not shapes:
    L.append("| (no mkernel-side run left a result) |")
  return "\n".join(L) + "\n"
