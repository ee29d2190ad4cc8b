#!/usr/bin/env python3
"""Attention benchmark (issue 14): mkernel's attention kernel and ring attention against torch.

  python3 bench/attn_bench.py single --lib build/src/libmkernel.so [options]
  python3 bench/attn_bench.py ring --lib build/src/libmkernel.so --mps --nproc 4 [options]
  python3 bench/attn_bench.py ring --lib build/src/libmkernel.so --mps --nproc 2 --nodes 2
      (2 processes as 2 virtual nodes against torch on the real NCCL, every rank its own host
      over sockets: two runs, see bench/README.md "--nodes")

single  one process, one GPU: mkernel.ring_attention on a 1-rank group (the attention kernel
        alone) against torch.nn.functional.scaled_dot_product_attention with each backend
        (cuDNN, flash, efficient; via torch.nn.attention.sdpa_kernel), on [B, S, H, D] inputs
        (SDPA on the same tensors seen as [B, H, S, D], 'bshd', and on contiguous [B, H, S, D]
        copies, 'bhsd'). Default: B 1, H 16, D 128 and 64, bf16, S 4K 8K 16K 32K, causal and not.
ring    n ranks (torchrun, all on GPU LOCAL_RANK % device_count: with one GPU they share it,
        under MPS) each holding S/n positions of a sequence of S (--seqs: total lengths,
        default 16K..128K): mkernel.ring_attention with each algo (auto, fused, sequential)
        against torch (all_gather_into_tensor of k and v, the keys put in sequence order, then
        SDPA per query chunk over its causal key prefix, torch's default backend and each
        backend), and the kernel alone on rank 0 over the whole sequence (1-rank group, the
        other ranks idle): the single-rank rate the ring is held against.

Timing: warm-up calls, then --reps rounds; in each round every variant runs once (the order
rotates), timed with CUDA events around `inner` back-to-back calls (inner chosen in the
warm-up so that one measurement lasts about --target-ms); single mode replays a CUDA graph of
those calls (--eager: plain calls), so that Python and launch overheads drop out; ring mode
times plain calls unless --graphs (then every variant, torch's included, and the 1-rank kernel
replay graphs; where one rank's capture fails every rank times that variant eagerly). The
result is the median per call. In ring mode each measurement starts after a barrier and one
untimed call and a one-element all-reduce (--no-lead-in: without them), which line the ranks'
streams up on the GPU so that the host barrier's skew stays out of the window (the 1-rank
kernel's measurements start after an untimed call too); a round's time is the slowest rank's. FLOPs = 4 B H S^2 D, halved when causal (S: the whole
sequence); ring TFLOP/s are the whole sequence's FLOPs over the time of one call.

Checks before timing: mkernel's output against torch's (max |difference|; above --tol is a
MISMATCH, exit status 1). Targets printed (issue 14): single, ours >= 0.9x the fastest SDPA
backend; ring, auto >= 1.2x torch's fastest path, >= 1.0x mkernel sequential, and >= 0.9x the
kernel's single-rank TFLOP/s. Exit status 3 when a target is missed, 2 on a setup error.

Output: <--out>/attn_bench_<mode>_<date>.json and .md (command, commit: MK_BENCH_COMMIT, else
the repository's COMMIT_SNAP, else git; device, torch/CUDA/cuDNN versions, date, every
measurement). Without --lib the process must already run with LD_PRELOAD=libmkernel.so (or
torchrun started it so); when mkernel cannot be used, the torch variants still run and the
reason is recorded. --mps starts an MPS daemon for ring mode unless one answers.
"""

import argparse
import datetime
import math
import os
import statistics
import sys
import time

import bench_py_util as bpu
from bench_py_util import commit, log

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CHILD = "MK_ATTN_BENCH_CHILD"
BACKENDS = ("cudnn", "flash", "efficient")


def parse_args(argv):
  common = argparse.ArgumentParser(add_help=False)
  c = common.add_argument
  c("--lib", help="libmkernel.so to preload (default: the one already preloaded)")
  c("--out", default=os.path.join(HERE, "results"), help="results directory")
  c("--seqs", help="sequence lengths (ring: of the whole sequence), comma separated")
  c("--head-dims", default="128,64")
  c("--heads", type=int, default=16)
  c("--kv-heads", type=int, help="default: --heads")
  c("--batch", type=int, default=1)
  c("--dtype", default="bf16", choices=("bf16", "fp16"))
  c("--causal", default="both", choices=("both", "yes", "no"))
  c("--reps", type=int, default=15)
  c("--warmup", type=int, default=3)
  c("--target-ms", type=float, default=20.0, help="length of one measurement")
  c("--budget", type=float, default=480.0, help="seconds; no new shape starts after it")
  c("--backends", default=",".join(BACKENDS), help="SDPA backends")
  c("--tol", type=float, default=0.05, help="max |ours - torch| accepted")
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter,
                               epilog="Options go after the mode: attn_bench.py single --help")
  sub = ap.add_subparsers(dest="mode", required=True)
  s = sub.add_parser("single", parents=[common], help="one GPU: kernel vs SDPA")
  s.add_argument("--torch-layouts", default="bshd,bhsd", help="SDPA input layouts")
  s.add_argument("--eager", action="store_true", help="no CUDA graphs: time eager calls")
  r = sub.add_parser("ring", parents=[common], help="n ranks: ring attention vs torch")
  r.add_argument("--nproc", "--ranks", dest="nproc", type=int, default=4)
  r.add_argument("--mps", action="store_true", help="start an MPS daemon unless one answers")
  r.add_argument("--layout", default="zigzag", choices=("zigzag", "contiguous"))
  r.add_argument("--algos", default="auto,fused,sequential")
  r.add_argument("--no-single-rank", action="store_true", help="skip the 1-rank kernel run")
  r.add_argument("--graphs", action="store_true",
                 help="time CUDA graph replays of every variant and of the 1-rank kernel")
  r.add_argument("--no-lead-in", dest="lead_in", action="store_false",
                 help="start each collective measurement right after the host barrier, "
                 "without the untimed call that lines the ranks' streams up first")
  r.add_argument("--nodes", type=int, default=1,
                 help="N >= 2: the ranks as N (virtual) nodes, against torch on the real NCCL "
                 "with every rank its own host over sockets (two runs; see bench/README.md)")
  r.add_argument("--side", choices=bpu.SIDES, help=argparse.SUPPRESS)  # set by the launcher
  r.add_argument("--side-out", help=argparse.SUPPRESS)
  r.add_argument("--torch-from", help=argparse.SUPPRESS)
  a = ap.parse_args(argv)
  if a.mode == "ring":
    why = "--nproc %d: at least 1" % a.nproc if a.nproc < 1 else ""
    why = why or bpu.nodes_problem(a.nproc, a.nodes) or bpu.side_problem(
        a.side, a.nodes, a.side_out, a.torch_from)
    if why:
      r.error(why)
  else:
    a.nodes, a.side = 1, None
  a.kv_heads = a.kv_heads or a.heads
  default = "4096,8192,16384,32768" if a.mode == "single" else "16384,32768,65536,131072"
  a.seq_list = [int(s) for s in (a.seqs or default).split(",")]
  a.dims = [int(d) for d in a.head_dims.split(",")]
  a.causals = {"both": [False, True], "yes": [True], "no": [False]}[a.causal]
  a.backend_list = [b for b in a.backends.split(",") if b]
  return a


# ---------------------------------------------------------------------------------------------
# Launcher: LD_PRELOAD, MPS and torchrun, before torch or CUDA is touched
# ---------------------------------------------------------------------------------------------
def launch(a, argv):
  env = dict(os.environ, **{CHILD: "1"})
  if a.lib:
    lib = os.path.realpath(a.lib)
    if not os.path.isfile(lib):
      sys.exit("attn_bench: --lib %s not found (build it: cmake --build <build> --target "
               "mkernel)" % a.lib)
    env["LD_PRELOAD"] = lib
    env.setdefault("MK_ATTN_BENCH_LIB", lib)
  try:
    ring = a.mode == "ring"
    if ring and a.nodes > 1:
      return bpu.launch_nodes("attn_bench", __file__, argv, env, a.nproc, a.nodes, a.mps,
                              nproc_flag="--nproc-per-node",
                              torch_timeout=a.budget + bpu.SIDE_TIMEOUT_MARGIN_S)
    return bpu.launch("attn_bench", __file__, argv, env, ring, a.nproc if ring else 1,
                      ring and a.mps, nproc_flag="--nproc-per-node")
  except bpu.LaunchError as e:
    sys.exit("attn_bench: %s" % e)


# ---------------------------------------------------------------------------------------------
# Worker
# ---------------------------------------------------------------------------------------------
import_error = None
try:
  import torch
  import torch.distributed as dist
  import torch.nn.functional as F
except ImportError as e:  # the launcher and --help work without torch
  import_error = e


def flops(B, H, S, D, causal):
  f = 4.0 * B * H * S * S * D
  return f / 2 if causal else f


class Bench:
  """Process group, mkernel's availability, the SDPA backends."""

  def __init__(self, a):
    self.a = a
    self.rank, self.world, self.device, self.dtype = bpu.init_rank(a.dtype)
    if a.side == "torch":  # torch's own NCCL: libmkernel stays out of this process
      self.mk, self.mk_error, self.lib_path = None, "not loaded on the torch side", None
      sys.path.insert(0, os.path.join(REPO, "python"))  # mk_positions: pure Python
    else:
      self.mk, self.mk_error, self.lib_path = bpu.import_mkernel(
          lambda e: "%s: %s" % (type(e).__name__, e))
    self.facts = None  # --nodes: bpu.side_facts, gathered once the shapes ran
    self.sdpa_ctx = self._sdpa_contexts()
    self.t0 = time.time()

  def _sdpa_contexts(self):
    """backend name -> a function returning a context manager that selects it."""
    try:
      from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
      return {}
    names = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION",
             "efficient": "EFFICIENT_ATTENTION"}
    return {b: (lambda be=getattr(SDPBackend, names[b]): sdpa_kernel(be))
            for b in self.a.backend_list if hasattr(SDPBackend, names.get(b, "?"))}

  def agree(self, ok):
    """True only if `ok` on every rank."""
    t = torch.tensor([1.0 if ok else 0.0], device=self.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item() == 1.0)

  def out_of_time(self):
    t = torch.tensor([1.0 if time.time() - self.t0 > self.a.budget else 0.0], device=self.device)
    dist.broadcast(t, 0)
    return bool(t.item())

  def randn(self, shape, seed, scale=1.0):
    g = torch.Generator(device=self.device)
    g.manual_seed(seed)
    return (torch.randn(shape, generator=g, device=self.device) * scale).to(self.dtype)

  def sdpa(self, q, k, v, backend, **kw):
    """SDPA on [B, H, S, D] views; backend None = torch's own choice."""
    if backend is None:
      return F.scaled_dot_product_attention(q, k, v, **kw)
    with self.sdpa_ctx[backend]():
      return F.scaled_dot_product_attention(q, k, v, **kw)


def graphed(fn, inner):
  """A CUDA graph of `inner` calls of fn (after one eager call on a side stream): its replay
  runs them without Python or launch overhead between them."""
  side, cur = torch.cuda.Stream(), torch.cuda.current_stream()
  side.wait_stream(cur)
  with torch.cuda.stream(side):
    fn()
  cur.wait_stream(side)
  torch.cuda.synchronize()
  g = torch.cuda.CUDAGraph()
  with torch.cuda.graph(g):
    for _ in range(inner):
      fn()
  torch.cuda.synchronize()
  return g


def measure(bench, variants, collective, graphs=False):
  """variants: {name: fn}. Returns {name: {"ms": median per call, "inner": calls per
  measurement, "graph": bool, "reps": [...]}} (the slowest rank's when collective). graphs:
  one measurement replays a CUDA graph of `inner` calls (eager when the capture fails)."""
  a = bench.a
  ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731

  lead_in = getattr(a, "lead_in", False)  # ring mode; the 1-rank kernel's windows too
  sync = torch.zeros(1, device=bench.device) if lead_in and collective else None

  def once(fn, inner, lead=None):
    if collective:
      dist.barrier()
    torch.cuda.synchronize()
    s, e = ev(), ev()
    if lead_in and lead is not None:
      # The ranks leave the host barrier up to a millisecond apart, and the first call of a
      # collective waits on the GPU for the last rank: with 2-3 calls a measurement that skew
      # was a third of a 16K call. So one untimed call first (the host queues the timed ones
      # meanwhile), then a one-element all-reduce, after which every rank's stream starts its
      # window at the same moment: the untimed call's own end differs between the ranks (the
      # ring's ranks end one after another, torch's four SDPAs in no fixed order), and a
      # window opened there would count that spread on the early ranks. The 1-rank kernel,
      # which auto is held against, gets the untimed call too (a busy GPU at the window's
      # start, as in the ring's), without the all-reduce (the other ranks wait on the host).
      lead()
      if collective:
        dist.all_reduce(sync)
    s.record()
    for _ in range(inner):
      fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e)

  plan = {}  # name -> (timed fn, its repeat count, calls per measurement, graph)
  for name, fn in variants.items():
    w = [once(fn, 1) for _ in range(max(1, a.warmup))]
    est = torch.tensor([statistics.median(w)], device=bench.device)
    if collective:
      dist.all_reduce(est, op=dist.ReduceOp.MAX)
    inner = int(min(50, max(1, math.ceil(a.target_ms / max(float(est), 1e-3)))))
    plan[name] = (fn, inner, inner, False)
    if graphs:
      try:
        g = graphed(fn, inner)
        plan[name] = (g.replay, 1, inner, g)
      except Exception as e:  # noqa: BLE001 - measured eagerly instead
        log("attn_bench: %s: CUDA graph capture failed (%s); timed eagerly" % (name, e))
        torch.cuda.synchronize()
      # Every rank times the same way: eagerly wherever one rank's capture failed.
      if collective and not bench.agree(plan[name][3] is not False):
        plan[name] = (fn, inner, inner, False)
  names = list(variants)
  times = {x: [] for x in names}
  for r in range(a.reps):
    for j in range(len(names)):
      x = names[(j + r) % len(names)]
      fn, reps, inner, _ = plan[x]
      times[x].append(once(fn, reps, variants[x]) / inner)
  res = {}
  for x in names:
    t = torch.tensor(times[x], device=bench.device, dtype=torch.float32)
    if collective:
      dist.all_reduce(t, op=dist.ReduceOp.MAX)
    res[x] = {"ms": statistics.median(t.tolist()), "inner": plan[x][2],
              "graph": plan[x][3] is not False, "reps": t.tolist()}
  plan.clear()
  return res


def probe(bench, fn, collective):
  """(ok, error) of one call of fn, agreed by every rank when collective."""
  err = None
  try:
    fn()
    torch.cuda.synchronize()
  except Exception as e:  # noqa: BLE001
    err = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
  ok = bench.agree(err is None) if collective else err is None
  if not ok and err is None:
    err = "failed on another rank"
  return ok, err


# ---------------------------------------------------------------------------------------------
def run_single(bench):
  a, mk = bench.a, bench.mk
  B, H, Hkv = a.batch, a.heads, a.kv_heads
  rows = []
  for D in a.dims:
    for causal in a.causals:
      for S in a.seq_list:
        if time.time() - bench.t0 > a.budget:
          rows.append(dict(S=S, D=D, causal=causal, skipped="budget exhausted"))
          continue
        q = bench.randn((B, S, H, D), 1)
        k = bench.randn((B, S, Hkv, D), 2)
        v = bench.randn((B, S, Hkv, D), 3)
        fns, errors = {}, {}
        out = torch.empty_like(q)
        if mk is not None:
          fns["mkernel"] = lambda: mk.ring_attention(q, k, v, causal=causal, out=out)
        else:
          errors["mkernel"] = bench.mk_error
        views = {"bshd": tuple(x.transpose(1, 2) for x in (q, k, v))}
        if "bhsd" in a.torch_layouts:
          views["bhsd"] = tuple(x.transpose(1, 2).contiguous() for x in (q, k, v))
        kw = dict(is_causal=causal)
        if Hkv != H:
          kw["enable_gqa"] = True
        for lay in [x for x in a.torch_layouts.split(",") if x in views]:
          for b in a.backend_list:
            name = "sdpa_%s_%s" % (b, lay)
            if b not in bench.sdpa_ctx:
              errors[name] = "backend not in this torch"
              continue
            fns[name] = (lambda qq=views[lay], bb=b: bench.sdpa(*qq, bb, **kw))
        avail = {}
        for name, fn in fns.items():
          ok, err = probe(bench, fn, False)
          if ok:
            avail[name] = fn
          else:
            errors[name] = err
        check = None
        torch_names = [n for n in avail if n.startswith("sdpa")]
        if "mkernel" in avail and torch_names:
          ref = avail[torch_names[0]]().transpose(1, 2)
          ours = avail["mkernel"]()
          d = float((ours.float() - ref.float()).abs().max())
          check = dict(against=torch_names[0], max_abs_diff=d, ok=d <= a.tol)
        res = measure(bench, avail, False, graphs=not a.eager)
        f = flops(B, H, S, D, causal)
        for n, r in res.items():
          r["tflops"] = f / (r["ms"] * 1e-3) / 1e12
        for n, e in errors.items():
          res[n] = {"error": e}
        best = max(torch_names, key=lambda n: res[n]["tflops"], default=None)
        ratio = (res["mkernel"]["tflops"] / res[best]["tflops"]
                 if best and "tflops" in res.get("mkernel", {}) else None)
        row = dict(S=S, D=D, causal=causal, B=B, H=H, Hkv=Hkv, flops=f, variants=res,
                   best_torch=best, ratio=ratio, check=check,
                   target_met=None if ratio is None else ratio >= 0.9)
        rows.append(row)
        log(single_line(row))
        del q, k, v, out, views, fns, avail
        torch.cuda.empty_cache()
  return rows


def single_line(r):
  v = r["variants"]
  parts = ["%s %.0f" % (n, v[n]["tflops"]) for n in sorted(v) if "tflops" in v[n]]
  return "S=%-6d D=%-3d %-6s TFLOP/s: %s | best torch %s, ours/best %s%s" % (
      r["S"], r["D"], "causal" if r["causal"] else "full", ", ".join(parts), r["best_torch"],
      "%.3f" % r["ratio"] if r["ratio"] is not None else "n/a",
      "" if not r["check"] else " | max|diff| %.3g %s" % (
          r["check"]["max_abs_diff"], "ok" if r["check"]["ok"] else "MISMATCH"))


# ---------------------------------------------------------------------------------------------
def torch_ring(bench, q, k, v, causal, layout, backend, pos_order, chunks):
  """all_gather_into_tensor of k and v, keys put in sequence order, SDPA per query chunk over
  its key prefix (causal: lower-right aligned). Returns this rank's [B, S_local, H, D]."""
  n, (B, S, Hkv, D) = bench.world, k.shape
  kv = []
  for x in (k, v):
    g = torch.empty((n * B, S, Hkv, D), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(g, x)
    g = g.view(n, B, S, Hkv, D).transpose(0, 1).reshape(B, n * S, Hkv, D)
    if pos_order is not None:
      g = g.index_select(1, pos_order)
    kv.append(g.transpose(1, 2))  # [B, Hkv, T, D]
  kw = {} if Hkv == q.shape[2] else {"enable_gqa": True}
  qt = q.transpose(1, 2)
  if not causal:
    return bench.sdpa(qt, kv[0], kv[1], backend, **kw).transpose(1, 2)
  from torch.nn.attention.bias import causal_lower_right
  outs = []
  for r0, r1, end in chunks:  # query rows [r0, r1) at positions ending at `end` (exclusive)
    mask = causal_lower_right(r1 - r0, end)
    outs.append(bench.sdpa(qt[:, :, r0:r1], kv[0][:, :, :end], kv[1][:, :, :end], backend,
                           attn_mask=mask, **kw))
  return torch.cat(outs, dim=2).transpose(1, 2)


def run_ring(bench):
  a, mk, n, rank = bench.a, bench.mk, bench.world, bench.rank
  B, H, Hkv = a.batch, a.heads, a.kv_heads
  algos = [x for x in a.algos.split(",") if x]
  solo = None
  if not a.no_single_rank and n > 1 and a.side != "torch":
    solo = dist.new_group(ranks=[0])
  rows = []
  for D in a.dims:
    for causal in a.causals:
      for T in a.seq_list:
        if bench.out_of_time():
          rows.append(dict(S=T, D=D, causal=causal, skipped="budget exhausted"))
          continue
        if T % (2 * n):
          rows.append(dict(S=T, D=D, causal=causal, skipped="not a multiple of 2*nranks"))
          continue
        S = T // n
        q = bench.randn((B, S, H, D), 100 + rank)
        k = bench.randn((B, S, Hkv, D), 200 + rank)
        v = bench.randn((B, S, Hkv, D), 300 + rank)
        pos = [mk_positions(r, n, S, a.layout) for r in range(n)]
        allpos = torch.tensor(sum(pos, []), device=bench.device)
        pos_order = None if a.layout == "contiguous" else torch.argsort(allpos)
        mine = pos[rank]
        cuts = [0] + [i for i in range(1, S) if mine[i] != mine[i - 1] + 1] + [S]
        chunks = [(cuts[i], cuts[i + 1], mine[cuts[i + 1] - 1] + 1) for i in range(len(cuts) - 1)]
        fns, errors = {}, {}
        out = torch.empty_like(q)
        for al in algos if a.side != "torch" else []:
          if mk is None:
            errors["mkernel_" + al] = bench.mk_error
            continue
          fns["mkernel_" + al] = (lambda al=al: mk.ring_attention(
              q, k, v, causal=causal, layout=a.layout, algo=al, out=out))
        # The mkernel side of --nodes runs torch only as the check's reference (untimed).
        for b in [None] + (a.backend_list if a.side != "mkernel" else []):
          name = "torch_" + (b or "default")
          if b is not None and b not in bench.sdpa_ctx:
            errors[name] = "backend not in this torch"
            continue
          fns[name] = (lambda b=b: torch_ring(bench, q, k, v, causal, a.layout, b, pos_order,
                                              chunks))
        avail = {}
        for name, fn in fns.items():
          ok, err = probe(bench, fn, True)
          if ok:
            avail[name] = fn
          else:
            errors[name] = err
        check = None
        mk_names = [x for x in avail if x.startswith("mkernel")]
        torch_names = [x for x in avail if x.startswith("torch")]
        if mk_names and torch_names:
          d = (avail[mk_names[0]]().float() - avail[torch_names[0]]().float()).abs().max()
          dist.all_reduce(d, op=dist.ReduceOp.MAX)
          check = dict(against=torch_names[0], max_abs_diff=float(d), ok=float(d) <= a.tol)
        if a.side == "mkernel":
          avail = {x: fn for x, fn in avail.items() if not x.startswith("torch")}
        res = measure(bench, avail, True, graphs=a.graphs)
        f = flops(B, H, T, D, causal)
        if solo is not None and mk is not None:
          res.update(single_rank(bench, solo, B, T, H, Hkv, D, causal))
        for r in res.values():
          if "ms" in r:
            r["tflops"] = f / (r["ms"] * 1e-3) / 1e12
        for x, e in errors.items():
          res[x] = {"error": e}
        rows.append(ring_row(T, D, causal, B, H, Hkv, f, res, check))
        if rank == 0:
          log(ring_line(rows[-1]))
        del q, k, v, out, fns, avail
        torch.cuda.empty_cache()
  return rows


def mk_positions(r, n, S, layout):
  from mkernel import _attention
  return _attention.positions(r, n, S, layout)


def single_rank(bench, solo, B, T, H, Hkv, D, causal):
  """The kernel alone on rank 0 over the whole sequence (1-rank group). The others wait on the
  host (TCPStore), not in a collective whose kernel would take SMs from rank 0's."""
  res = {}
  store = dist.distributed_c10d._get_default_store()
  key = "attn_bench/solo/%d/%d/%d" % (T, D, causal)
  if bench.rank != 0:
    store.wait([key], datetime.timedelta(seconds=900))
  else:
    q = bench.randn((B, T, H, D), 7)
    k = bench.randn((B, T, Hkv, D), 8)
    v = bench.randn((B, T, Hkv, D), 9)
    out = torch.empty_like(q)
    fn = lambda: bench.mk.ring_attention(q, k, v, causal=causal, group=solo, out=out)  # noqa
    ok, err = probe(bench, fn, False)
    res["kernel_1rank"] = (measure(bench, {"k": fn}, False, graphs=bench.a.graphs)["k"]
                           if ok else {"error": err})
    del q, k, v, out
    store.set(key, "done")
  dist.barrier()
  return res


def ring_row(T, D, causal, B, H, Hkv, f, res, check):
  row = dict(S=T, D=D, causal=causal, B=B, H=H, Hkv=Hkv, flops=f, variants=res, check=check)
  return set_ratios(row)


def torch_variants(a):
  return ["torch_" + (b or "default") for b in [None] + a.backend_list]


def set_ratios(row):
  """Ratios of auto against the fastest torch path, mkernel sequential and the 1-rank kernel,
  and the targets; again after --nodes brought the torch side's timings in."""
  res = row["variants"]

  def tf(x):
    return res.get(x, {}).get("tflops")

  auto = tf("mkernel_auto")
  tnames = [x for x in res if x.startswith("torch") and "tflops" in res[x]]
  best = max(tnames, key=lambda x: res[x]["tflops"], default=None)
  ratios = {}
  if auto:
    if best:
      ratios["auto_vs_torch"] = auto / res[best]["tflops"]
    if tf("mkernel_sequential"):
      ratios["auto_vs_sequential"] = auto / tf("mkernel_sequential")
    if tf("kernel_1rank"):
      ratios["auto_vs_kernel_1rank"] = auto / tf("kernel_1rank")
  goals = {"auto_vs_torch": 1.2, "auto_vs_sequential": 1.0, "auto_vs_kernel_1rank": 0.9}
  row.update(best_torch=best, ratios=ratios,
             target_met=all(ratios[x] >= goals[x] for x in ratios) if ratios else None)
  return row


def row_key(r):
  return (r["S"], r["D"], bool(r["causal"]))


def ring_line(r):
  v = r["variants"]
  parts = ["%s %.2f ms" % (x, v[x]["ms"]) for x in sorted(v) if "ms" in v[x]]
  rat = ", ".join("%s %.3f" % kv for kv in sorted(r["ratios"].items()))
  return "S=%-7d D=%-3d %-6s %s | %s%s" % (
      r["S"], r["D"], "causal" if r["causal"] else "full", ", ".join(parts), rat or "no ratio",
      "" if not r["check"] else " | max|diff| %.3g %s" % (
          r["check"]["max_abs_diff"], "ok" if r["check"]["ok"] else "MISMATCH"))


# ---------------------------------------------------------------------------------------------
def markdown(meta, rows):
  L = ["# attn_bench %s" % meta["mode"], "",
       "- command: `%s`" % meta["command"], "- commit: %s" % meta["commit"],
       "- device: %s (%d rank(s))" % (meta["device"], meta["nranks"]), "- date: %s" % meta["date"],
       "- torch %s, CUDA %s, cuDNN %s" % (meta["torch"], meta["cuda"], meta["cudnn"]),
       "- libmkernel: %s" % (meta["library"] or "not usable: %s" % meta["mkernel_error"])
       ] + meta.get("nodes_header", []) + [""]
  names = []
  for r in rows:
    for x in r.get("variants", {}):
      if x not in names:
        names.append(x)
  single = meta["mode"] == "single"
  unit = "TFLOP/s" if single else "ms per call (TFLOP/s of the whole sequence)"
  extra = ["ours/best", "target 0.9"] if single else ["auto/torch", "auto/seq", "auto/1rank"]
  L.append("Values: %s. S: %s." % (unit, "sequence" if single else "total sequence"))
  L.append("")
  L.append("| S | D | causal | " + " | ".join(names) + " | best torch | " + " | ".join(extra) +
           " | max diff |")
  L.append("|" + "---|" * (len(names) + len(extra) + 5))
  for r in rows:
    if "skipped" in r:
      L.append("| %d | %d | %s | %s |" % (r["S"], r["D"], "yes" if r["causal"] else "no",
                                          r["skipped"]))
      continue
    cells = []
    for x in names:
      m = r["variants"].get(x, {})
      if "tflops" not in m:
        cells.append("-" if not m else "n/a")
      elif single:
        cells.append("%.0f" % m["tflops"])
      else:
        cells.append("%.2f (%.0f)" % (m["ms"], m["tflops"]))
    if single:
      ex = ["%.3f" % r["ratio"] if r["ratio"] is not None else "n/a",
            {True: "met", False: "MISSED", None: "n/a"}[r["target_met"]]]
    else:
      ex = ["%.3f" % r["ratios"][x] if x in r["ratios"] else "n/a"
            for x in ("auto_vs_torch", "auto_vs_sequential", "auto_vs_kernel_1rank")]
    c = r["check"]
    L.append("| %d | %d | %s | %s | %s | %s | %s |" % (
        r["S"], r["D"], "yes" if r["causal"] else "no", " | ".join(cells), r["best_torch"],
        " | ".join(ex), "%.3g%s" % (c["max_abs_diff"], "" if c["ok"] else " MISMATCH")
        if c else "n/a"))
  errs = sorted({(x, m["error"]) for r in rows for x, m in r.get("variants", {}).items()
                 if "error" in m})
  if errs:
    L += ["", "Variants that did not run:"] + ["- %s: %s" % e for e in errs]
  if not single:
    L += ["", "Targets (issue 14): auto/torch >= 1.2, auto/seq >= 1.0, auto/1rank >= 0.9."]
  return "\n".join(L) + "\n"


def report(bench, a, argv, rows):
  """Rank 0: the results written (the torch side of --nodes: its file for the mkernel side);
  returns the exit status."""
  now = datetime.datetime.now(datetime.timezone.utc)
  meta = dict(tool="attn_bench", mode=a.mode, nranks=bench.world,
              command=bpu.command_line(argv),
              commit=commit(), device=torch.cuda.get_device_name(bench.device),
              date=now.isoformat(timespec="seconds"), torch=torch.__version__,
              cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
              library=bench.lib_path, mkernel_error=bench.mk_error,
              preload=os.environ.get("LD_PRELOAD", ""), mps=os.environ.get(
                  "CUDA_MPS_PIPE_DIRECTORY", ""),
              config={x: getattr(a, x) for x in ("batch", "heads", "kv_heads", "dtype", "reps",
                                                 "warmup", "target_ms", "backend_list", "tol")})
  if a.mode == "ring":
    meta["config"].update(layout=a.layout, algos=a.algos, lead_in=a.lead_in)
  if a.side == "torch":
    meta["side_facts"] = bench.facts
    bpu.write_torch_side(a.side_out, meta, rows)
    bad = any(x == "torch_default" and "error" in m for r in rows
              for x, m in r.get("variants", {}).items())
    return 1 if bad or any(bench.facts["libmkernel_mapped"]) else 0
  missing = 0
  if a.side == "mkernel":
    missing = bpu.apply_torch_side(a, bench, rows, meta, row_key,
                                   lambda x: x.startswith("torch"), torch_variants(a), set_ratios)
    for r in rows:
      if "variants" in r:
        log(ring_line(r))
  bpu.write_results("attn_bench", a.out, a.mode, now, meta, rows, markdown(meta, rows))
  bad = [r for r in rows if r.get("check") and not r["check"]["ok"]]
  missed = [r for r in rows if r.get("target_met") is False]
  rc = 1 if bad or missing else (3 if missed else 0)
  log("attn_bench: %d shape(s), %d mismatch(es), %d target(s) missed%s" % (
      len(rows), len(bad), len(missed),
      ", %d without torch timings (torch side)" % missing if a.side else ""))
  return rc


def worker(a, argv):
  if import_error is not None:
    sys.exit("attn_bench: torch is needed: %s" % import_error)
  bench = Bench(a)
  torch.backends.cuda.matmul.allow_tf32 = False
  if bench.rank == 0:
    log("attn_bench %s: %d rank(s), %s, torch %s; libmkernel %s" % (
        a.mode, bench.world, torch.cuda.get_device_name(bench.device), torch.__version__,
        bench.lib_path or "NOT USABLE (%s)" % bench.mk_error))
    log("SDPA backends: %s" % (", ".join(sorted(bench.sdpa_ctx)) or "none selectable"))
  rows = run_single(bench) if a.mode == "single" else run_ring(bench)
  # (The sides' facts are gathered after the runs: libmkernel never got mapped by then.)
  return bpu.finish_worker(bench, a, lambda: report(bench, a, argv, rows))


def main():
  argv = sys.argv[1:]
  return bpu.dispatch(argv, parse_args, launch, worker, CHILD)


if __name__ == "__main__":
  sys.exit(main())
