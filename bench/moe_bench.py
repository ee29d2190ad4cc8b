#!/usr/bin/env python3
"""MoE benchmark (issue 13): mkernel's expert-parallel calls side by side with plain torch.

  python3 bench/moe_bench.py ffn --lib build/src/libmkernel.so --mps --nproc 4 [options]
  python3 bench/moe_bench.py dispatch --lib build/src/libmkernel.so --mps --nproc 4 [options]
  python3 bench/moe_bench.py ffn --lib build/src/libmkernel.so --nproc 1      (1-rank group)
  python3 bench/moe_bench.py ffn --lib build/src/libmkernel.so --mps --nproc 2 --nodes 2
            (2 processes as 2 virtual nodes against torch on the real NCCL, every rank its own
            host over sockets: two runs, see bench/README.md "--nodes")
  ... --nproc 4 --nodes 2 --dedup-modes 0,1
            (2 nodes x 2 ranks; the mkernel side once per MKERNEL_MOE_NODE_DEDUP value after
            one torch side, each with the modelled cross-node MiB per call of its dispatch;
            a table over the modes at the end: bench/moe_bench_dedup.py)
  python3 bench/moe_bench.py --selftest       (CPU: runs bench/test_moe_bench.py)

ffn       the whole layer. mkernel.moe_ffn (each --algos, default auto and sequential; plus a
          CUDA graph of back-to-back calls of the first algo) against a torch layer: routing
          counts per expert exchanged with all_to_all_single and copied to the host (the row
          exchange needs its split sizes there: that synchronisation is part of torch's cost),
          token rows with all_to_all_single, grouped by local expert, GEMM1 with
          torch._grouped_mm (a loop of torch.mm when this torch has none or refuses it: noted),
          SwiGLU, GEMM2, the rows back with all_to_all_single (bf16, as mkernel's return rows
          since session 37), weighted sum in slot order (fp32). FLOPs per rank:
          2 T k H 2I + 2 T k I H.
dispatch  mkernel.moe_dispatch_gemm against the first half of that layer (counts to the host,
          all_to_all_single of the rows, grouping, one grouped GEMM with N = 2I outputs).
          FLOPs per rank: 2 T k H N.

Ranks: torchrun with --nproc ranks, each on GPU LOCAL_RANK % device_count (one GPU: shared,
which needs MPS: --mps starts a daemon unless one answers); --nproc 1 runs one process, no
torchrun. Which mkernel path runs (fused/core/clique_block.cc, docs/moe.md): ranks in one
process on one GPU use the clique kernels (only the 1-rank group here); ranks in separate
processes use the AllToAll path (fused/ops/moe/a2a.cu), or with --algos fused on one node the
fused kernels (rows landing in the ranks' windows: fused_moe.cu, fused_ffn.cu), and with
--algos fused across --nodes the fused kernel across nodes (rows and the layer's outputs moving
per pair through the device API: xnode.cu; 3-12x slower than the AllToAll path in session 35). The AllToAll
path's per-pair buffers hold max_rows rows: each call moves nranks * max_rows rows per rank whatever the routing, so max_rows is
chosen per shape (--max-rows tight: the routing's need, the same on every rank; bound:
mkernel.moe_max_rows, which never overflows but moves nranks times more; or a factor of tight).
Under LD_PRELOAD=libmkernel.so torch's all_to_all_single also runs on mkernel's NCCL.

Shapes (H:I:E:k:T, T = tokens per rank; routing: top-k of random scores, softmax weights;
--routing hot biases expert 0): --preset default (6 shapes, estimated at 2-3 minutes for 4
ranks on one H200; not yet measured), --preset wide (H 4096,7168 x E 8,32,64 x k 2,4,8 x
T 512,2048,4096), --shapes H:I:E:k:T,... or any of --hidden/--inter/--experts/--topk/--tokens
(their product). A shape
whose estimated memory exceeds --mem-frac of the GPU for the ranks sharing it drops the graph
variant, then the shape.

Checks before timing: every mkernel variant's output against torch's (relative L2 error above
--tol, or one token's above --token-tol, is a MISMATCH), dispatch also the per-expert counts and
the received rows (exact); ffn also torch's output for the first --spot tokens of each rank
against a direct fp32 computation per token (regenerating the experts' weights).

Timing: warm-up calls, then --reps rounds; each round runs every variant once (the order
rotates) after a barrier, one untimed call and a one-element all-reduce (--no-lead-in: without
them; they start every rank's window at the same moment on the GPU, where the host barrier left
the processes up to a millisecond apart), timed with CUDA events around `inner` back-to-back
calls (inner chosen so that one measurement lasts about --target-ms); a round's time is the
slowest rank's; the result is the median per call. torch's layer cannot be captured (host synchronisation), so it
and mkernel's eager variants are plain calls; the graph variant shows mkernel without Python and
launch overhead. Printed: ms per call, TFLOP/s per rank (and per GPU: times the ranks sharing
it), mkernel/torch = torch ms / mkernel ms (target auto >= 1.0, issue 13).

Output: <--out>/moe_bench_<mode>_<date>.json and .md (command, commit: MK_BENCH_COMMIT, else
the repository's COMMIT_SNAP, else git; device, torch/CUDA versions, date, every repetition).
Exit status 0; 1 a mismatch or an mkernel call that failed; 2 a setup error; 3 a target missed.
The torch layer, the direct reference and the arithmetic are in bench/moe_bench_ref.py.
"""

import argparse
import datetime
import gc
import itertools
import math
import os
import socket
import statistics
import subprocess
import sys
import time

import bench_py_util as bpu
from bench_py_util import commit, log
from moe_bench_dedup import (DEDUP_ENV, append_summary, dedup_mode, launch_modes, parse_modes,
                             xnode_text)

from moe_bench_ref import (PATH_NOTE, choose_max_rows, compare, cross_node_rows, direct_moe_ffn,
                           dispatch_flops, expert_weights, ffn_flops, gemm_grouped, gemm_loop,
                           generator, judge, make_routing, mem_estimate, merge_compare,
                           mkernel_path, pad_rows, seed_of, shape_problem, tight_rows,
                           torch_dispatch, torch_moe_ffn)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CHILD = "MK_MOE_BENCH_CHILD"

# (H, I, E, k, T): both Hs, I 2048, E 8..64, k 2..8, T 512..4096, and the small model.
DEFAULT_SHAPES = [(4096, 2048, 8, 2, 512), (4096, 2048, 8, 2, 4096), (4096, 2048, 32, 4, 4096),
                  (2048, 1408, 64, 6, 4096), (7168, 2048, 64, 8, 1024), (7168, 2048, 64, 8, 4096)]
WIDE = dict(hidden=[4096, 7168], inter=[2048], experts=[8, 32, 64], topk=[2, 4, 8],
            tokens=[512, 2048, 4096])
AXES = ("hidden", "inter", "experts", "topk", "tokens")
PRODUCT_DEFAULTS = dict(hidden=[4096], inter=[2048], experts=[32], topk=[4], tokens=[4096])


# ---------------------------------------------------------------------------------------------
# Arguments and shapes (pure Python: bench/test_moe_bench.py checks them)
# ---------------------------------------------------------------------------------------------
def int_list(s):
  v = [int(x) for x in s.split(",") if x.strip()]
  if not v or min(v) < 1:
    raise argparse.ArgumentTypeError("%r: expected positive integers, comma separated" % s)
  return v


def parse_shapes(s):
  out = []
  for item in s.split(","):
    parts = item.strip().split(":")
    if len(parts) != 5:
      raise argparse.ArgumentTypeError("shape %r: expected H:I:E:k:T" % item)
    out.append(tuple(int_list(",".join(parts))))
  return out


def parse_max_rows(s):
  if s in ("tight", "bound"):
    return s
  try:
    f = float(s)
  except ValueError:
    f = 0.0
  if not f >= 1.0:
    raise argparse.ArgumentTypeError("--max-rows %r: tight, bound or a factor >= 1" % s)
  return f


def algo_of(al):
  """The algo of an --algos entry (auto, fused, sequential; optionally @C)."""
  return al.partition("@")[0]


def sms_of(al):
  """The comm SMs of an --algos entry: C of name@C, else -1 (the library's choice)."""
  sms = al.partition("@")[2]
  return int(sms) if sms else -1


def parse_args(argv):
  common = argparse.ArgumentParser(add_help=False)
  c = common.add_argument
  c("--lib", help="libmkernel.so to preload (default: the one already preloaded)")
  c("--out", default=os.path.join(HERE, "results"), help="results directory")
  c("--nproc", "--ranks", dest="nproc", type=int, default=4, help="ranks (1: one process, no torchrun)")
  c("--mps", action="store_true", help="start an MPS daemon unless one answers")
  c("--preset", default="default", choices=("default", "wide"))
  c("--shapes", type=parse_shapes, help="H:I:E:k:T,... (T: tokens per rank); replaces --preset")
  for ax in AXES:
    c("--" + ax, type=int_list, help="comma list; any of these: their product")
  c("--routing", default="uniform", choices=("uniform", "hot"))
  c("--dtype", default="bf16", choices=("bf16", "fp16"))
  c("--algos", default="auto,sequential", help="mkernel algos (auto, fused, sequential)")
  c("--no-graph", action="store_true", help="no CUDA-graph variant of mkernel")
  c("--torch-gemm", default="auto", choices=("auto", "grouped", "loop"),
    help="torch's expert GEMMs: torch._grouped_mm when it works (auto), or a loop of torch.mm")
  c("--max-rows", type=parse_max_rows, default="tight", help="tight | bound | factor of tight")
  c("--reps", type=int, default=15)
  c("--warmup", type=int, default=3)
  c("--target-ms", type=float, default=20.0, help="length of one measurement")
  c("--no-lead-in", dest="lead_in", action="store_false",
    help="open each measurement right after the host barrier, without the untimed call and "
    "all-reduce that line the ranks' streams up first")
  c("--budget", type=float, default=200.0, help="seconds; no new shape starts after it")
  c("--tol", type=float, default=0.02, help="max relative L2 error against torch")
  c("--token-tol", type=float, default=0.02, help="max relative L2 error of one token")
  c("--spot", type=int, default=8, help="ffn: tokens per rank checked against a direct sum")
  c("--mem-frac", type=float, default=0.8, help="share of GPU memory the ranks may plan for")
  c("--seed", type=int, default=1)
  c("--nodes", type=int, default=1,
    help="N >= 2: the ranks as N (virtual) nodes, against torch on the real NCCL with every rank "
    "its own host over sockets (two runs; see bench/README.md)")
  c("--dedup-modes", type=parse_modes,
    help="with --nodes: the mkernel side once per value of %s (0,1), after one torch side" %
    DEDUP_ENV)
  c("--side", choices=bpu.SIDES, help=argparse.SUPPRESS)  # set by the launcher of --nodes
  c("--side-out", help=argparse.SUPPRESS)
  c("--torch-from", help=argparse.SUPPRESS)
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter,
                               epilog="Options go after the mode: moe_bench.py ffn --help")
  sub = ap.add_subparsers(dest="mode", required=True)
  sub.add_parser("ffn", parents=[common], help="the whole layer: moe_ffn vs torch")
  sub.add_parser("dispatch", parents=[common], help="moe_dispatch_gemm vs torch")
  a = ap.parse_args(argv)
  if a.nproc < 1 or a.reps < 1 or a.warmup < 1 or a.spot < 0 or not 0 < a.mem_frac <= 1:
    ap.error("--nproc, --reps, --warmup >= 1, --spot >= 0, 0 < --mem-frac <= 1")
  why = bpu.nodes_problem(a.nproc, a.nodes) or bpu.side_problem(a.side, a.nodes, a.side_out,
                                                                a.torch_from)
  if a.dedup_modes and a.nodes < 2:
    why = "--dedup-modes: only with --nodes >= 2 (the dedup is across nodes)"
  if why:
    ap.error(why)
  a.algo_list = [x for x in a.algos.split(",") if x]
  for al in a.algo_list:
    name, at, sms = al.partition("@")
    if name not in ("auto", "fused", "sequential") or (at and not (sms.isdigit() and int(sms) >= 1)):
      a.algo_list = []
  if not a.algo_list:
    ap.error("--algos %r: a comma list of auto, fused, sequential (each may end in @C: C comm "
             "SMs)" % a.algos)
  a.shape_list = shape_list(a)
  for H, I, E, k, T in a.shape_list:
    if H % 8 or I % 8:
      ap.error("shape %s: H and I must be multiples of 8" % ((H, I, E, k, T),))
  return a


def shape_list(a):
  given = {ax: getattr(a, ax) for ax in AXES if getattr(a, ax)}
  if a.shapes:
    return list(a.shapes)
  if given or a.preset == "wide":
    axes = dict(WIDE if a.preset == "wide" else PRODUCT_DEFAULTS, **given)
    return list(itertools.product(*(axes[ax] for ax in AXES)))
  return list(DEFAULT_SHAPES)


# ---------------------------------------------------------------------------------------------
# Launcher: LD_PRELOAD, MPS and torchrun, before torch or CUDA is touched
# ---------------------------------------------------------------------------------------------
def launch(a, argv):
  env = dict(os.environ, **{CHILD: "1"})
  if a.lib:
    lib = os.path.realpath(a.lib)
    if not os.path.isfile(lib):
      print("moe_bench: --lib %s not found (build it: cmake --build <build> --target mkernel)" %
            a.lib, file=sys.stderr)
      return 2
    env["LD_PRELOAD"] = lib
  try:
    if a.nodes > 1 and a.dedup_modes:
      return launch_modes("moe_bench", __file__, argv, env, a,
                          a.budget + bpu.SIDE_TIMEOUT_MARGIN_S)
    if a.nodes > 1:
      return bpu.launch_nodes("moe_bench", __file__, argv, env, a.nproc, a.nodes, a.mps,
                              torch_timeout=a.budget + bpu.SIDE_TIMEOUT_MARGIN_S)
    return bpu.launch("moe_bench", __file__, argv, env, a.nproc > 1, a.nproc, a.mps)
  except bpu.LaunchError as e:
    print("moe_bench: %s" % e, file=sys.stderr)
    return 2


# ---------------------------------------------------------------------------------------------
# Worker (one per rank)
# ---------------------------------------------------------------------------------------------
import_error = None
try:
  import torch
  import torch.distributed as dist
except ImportError as e:  # the launcher, --help and --selftest's pure parts work without torch
  import_error = e


class SetupError(Exception):
  pass


def first_line(e):
  return "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")


class Bench:
  """Process group, mkernel's availability and path, torch's expert GEMM."""

  def __init__(self, a):
    self.a = a
    if torch.cuda.device_count() < 1:
      raise SetupError("no CUDA device visible")
    self.rank, self.world, self.device, self.dtype = bpu.init_rank(a.dtype)
    if a.side == "torch":  # torch's own NCCL: libmkernel stays out of this process
      self.mk, self.mk_error, self.lib_path = None, "not loaded on the torch side", None
    else:
      self.mk, self.mk_error, self.lib_path = bpu.import_mkernel(first_line)
    self.facts = None  # --nodes: bpu.side_facts, gathered once the shapes ran
    peers = [None] * self.world
    dist.all_gather_object(peers, (socket.gethostname(), self.device.index, os.getpid()))
    mine = peers[self.rank][:2]
    self.ranks_per_gpu = sum(1 for p in peers if tuple(p[:2]) == tuple(mine))
    self.path = mkernel_path([tuple(p) for p in peers])
    self.a2a = lambda out, inp, osz, isz: dist.all_to_all_single(out, inp, osz, isz)
    self.gemm, self.gemm_note = self._pick_gemm()
    self.sync = torch.zeros(1, device=self.device)  # timed()'s all-reduce
    self.t0 = time.time()

  def agree(self, ok):
    """True only if `ok` on every rank."""
    t = torch.tensor([1.0 if ok else 0.0], device=self.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item() == 1.0)

  def reduce_max(self, vals):
    t = torch.tensor([float(v) for v in vals], dtype=torch.float64, device=self.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()

  def out_of_time(self):
    t = torch.tensor([1.0 if time.time() - self.t0 > self.a.budget else 0.0], device=self.device)
    dist.broadcast(t, 0)
    return bool(t.item())

  def _pick_gemm(self):
    if self.a.torch_gemm == "loop":
      return gemm_loop, "loop of torch.mm per expert (--torch-gemm loop)"
    why = ""
    if not hasattr(torch, "_grouped_mm"):
      why = "torch %s has no torch._grouped_mm (torch >= 2.8)" % torch.__version__
    else:
      try:  # an empty group included: routing can leave experts without rows
        g = generator(self.device, 5)
        x = torch.randn((40, 64), generator=g, device=self.device).to(self.dtype)
        w = torch.randn((3, 32, 64), generator=g, device=self.device).to(self.dtype)
        per, offs = [8, 0, 32], torch.tensor([8, 8, 40], dtype=torch.int32, device=self.device)
        c = compare(gemm_grouped(x, w, per, offs), gemm_loop(x, w, per, offs))
        if not judge(c, 0.01, 0.02):
          why = "torch._grouped_mm disagrees with torch.mm: %s" % c
      except Exception as e:  # noqa: BLE001
        why = "torch._grouped_mm failed: " + first_line(e)
    if self.agree(not why):
      return gemm_grouped, "torch._grouped_mm"
    why = why or "torch._grouped_mm failed on another rank"
    if self.a.torch_gemm == "grouped":
      raise SetupError("--torch-gemm grouped: " + why)
    return gemm_loop, "loop of torch.mm per expert (%s)" % why


def timed(bench, fn, calls, lead=None):
  """ms of `calls` back-to-back calls of fn, started after a barrier of every rank (and with
  lead: after one untimed call of it and a one-element all-reduce, which start every rank's
  window at the same moment on the GPU, as attn_bench.py's ring mode does: the processes
  leave the host barrier up to a millisecond apart)."""
  if bench.world > 1:
    dist.barrier()
  torch.cuda.synchronize()
  s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  if lead is not None and bench.world > 1 and bench.a.lead_in:
    lead()
    dist.all_reduce(bench.sync)
  s.record()
  for _ in range(calls):
    fn()
  e.record()
  e.synchronize()
  return s.elapsed_time(e)


def capture(bench, fn, inner):
  """A CUDA graph of `inner` calls of fn (after one eager call on a side stream), or (None,
  why); every rank keeps it only if every rank captured it."""
  g, err = None, None
  try:
    side, cur = torch.cuda.Stream(), torch.cuda.current_stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):
      fn()
    cur.wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:  # torch's watchdog thread queries events during the capture: only ours is captured
      ctx = torch.cuda.graph(g, capture_error_mode="thread_local")
    except TypeError:
      ctx = torch.cuda.graph(g)
    with ctx:
      for _ in range(inner):
        fn()
    torch.cuda.synchronize()
  except Exception as e:  # noqa: BLE001 - reported, timed without it
    err, g = first_line(e), None
  if not bench.agree(err is None):
    return None, err or "capture failed on another rank"
  return g, None


def measure(bench, variants, graph_of):
  """variants {name: fn} timed as plain calls; graph_of {graph name: variant name}: that variant
  also as a CUDA graph of back-to-back calls. Returns ({name: result}, {name: error})."""
  a = bench.a
  plan, errors = {}, {}  # name -> (callable, its calls per measurement, mkernel calls, graph)
  for name, fn in variants.items():
    est = bench.reduce_max([statistics.median([timed(bench, fn, 1) for _ in range(a.warmup)])])
    inner = int(min(50, max(1, math.ceil(a.target_ms / max(est[0], 1e-3)))))
    plan[name] = (fn, inner, inner, None)
  for gname, base in graph_of.items():
    if base in plan:
      g, err = capture(bench, variants[base], plan[base][2])
      if g is None:
        errors[gname] = "CUDA graph: " + err
      else:
        plan[gname] = (g.replay, 1, plan[base][2], g)
  names = list(plan)
  times = {x: [] for x in names}
  for r in range(a.reps):
    for j in range(len(names)):  # the order rotates: no variant always runs first
      x = names[(j + r) % len(names)]
      fn, calls, inner, _ = plan[x]
      times[x].append(timed(bench, fn, calls, variants[graph_of.get(x, x)]) / inner)
  res = {}
  for x in names:
    t = bench.reduce_max(times[x])  # each round: the slowest rank
    res[x] = dict(ms=statistics.median(t), inner=plan[x][2], graph=plan[x][3] is not None,
                  reps=t)
  torch.cuda.synchronize()
  dist.barrier()  # no rank frees a graph (its scratch) while a peer's replay may still use it
  plan.clear()
  return res, errors


def probe(bench, fn):
  """(ok on every rank, error, result) of one call."""
  err, out = None, None
  try:
    out = fn()
    torch.cuda.synchronize()
  except Exception as e:  # noqa: BLE001
    err = first_line(e)
  ok = bench.agree(err is None)
  return ok, err if err or ok else "failed on another rank", out


# ---------------------------------------------------------------------------------------------
def run_shape(bench, no, shape, mode):
  a, n, rank, dev, dt, mk = bench.a, bench.world, bench.rank, bench.device, bench.dtype, bench.mk
  H, I, E, k, T = shape
  row = dict(H=H, I=I, E=E, k=k, T=T)
  why = shape_problem(shape, n)
  if why:
    row["skipped"] = why
    return row
  ffn, L, N = mode == "ffn", E // n, 2 * I
  seed = seed_of(a.seed, *shape)
  idx, wts = make_routing(T, E, k, generator(dev, seed_of(seed, rank, 2)), dev, a.routing == "hot")
  cnt = torch.zeros(E, dtype=torch.int64, device=dev)
  cnt.scatter_add_(0, idx.reshape(-1).long(), torch.ones(T * k, dtype=torch.int64, device=dev))
  dist.all_reduce(cnt)
  tight = tight_rows(cnt.tolist(), n)
  max_rows = choose_max_rows(a.max_rows, tight, T, k, L, n)
  # The library's rule for its per-node dedup (fan buffers): equal nodes of >= 2 ranks.
  dedup = (a.side != "torch" and a.nodes > 1 and n % a.nodes == 0 and n // a.nodes >= 2 and
           dedup_mode() == 1)
  need, scratch = mem_estimate(mode, bench.path, n, max_rows, H, I, k, T, L,
                               torch.finfo(dt).bits // 8, node_dedup=dedup)
  room = a.mem_frac * torch.cuda.get_device_properties(dev).total_memory / bench.ranks_per_gpu
  flops = ffn_flops(T, k, H, I) if ffn else dispatch_flops(T, k, H, N)
  row.update(L=L, N=N, max_rows=max_rows, tight_rows=tight, flops_per_rank=flops,
             mem_gib=round((need + scratch) / 2**30, 2))
  if a.dedup_modes and a.side != "torch":
    row.update(xnode_model(bench, idx, E, max_rows, H * torch.finfo(dt).bits // 8))
  if need + scratch > room:
    row["skipped"] = ("needs about %.2f GiB per rank, %.2f GiB for each of the %d ranks on the "
                      "GPU (--mem-frac %g)" % ((need + scratch) / 2**30, room / 2**30,
                                                bench.ranks_per_gpu, a.mem_frac))
    return row
  graph = not a.no_graph and mk is not None
  if graph and need + 2 * scratch > room:
    graph = False
    row["graph_skipped"] = "memory: a graph holds a second copy of mkernel's scratch"
  x = torch.randn((T, H), generator=generator(dev, seed_of(seed, rank, 1)), device=dev).to(dt)
  w1 = torch.empty((L, N, H), dtype=dt, device=dev)
  w2 = torch.empty((L, H, I), dtype=dt, device=dev) if ffn else None
  for le in range(L):
    e1, e2 = expert_weights(seed, rank * L + le, H, I, dt, dev, ffn)
    w1[le].copy_(e1)
    if ffn:
      w2[le].copy_(e2)
  fns, errors = {}, {}
  if ffn:
    fns["torch"] = lambda: torch_moe_ffn(x, idx, wts, w1, w2, n, bench.a2a, bench.gemm)
  else:
    fns["torch"] = lambda: torch_dispatch(x, idx, w1, n, bench.a2a, bench.gemm)
  mk_names = [] if a.side == "torch" else ["mkernel_" + al for al in a.algo_list]
  if mk is None:
    errors.update({m: bench.mk_error for m in mk_names})
  elif ffn:
    bufs = mk.moe_ffn_buffers(max_rows, H, I, L, dt)
    y = torch.empty((T, H), dtype=dt, device=dev)
    for al in a.algo_list:
      fns["mkernel_" + al] = (lambda al=al: mk.moe_ffn(
          x, idx, wts, w1, w2, max_rows=max_rows, algo=algo_of(al), comm_sms=sms_of(al),
          buffers=bufs, out=y))
  else:
    e = lambda size, t=dt: torch.empty(size, dtype=t, device=dev)  # noqa: E731
    res = mk.MoeDispatchResult(e((max_rows, H)), e((max_rows, N)), e((L,), torch.int32),
                               e((L + 1,), torch.int32), e((max_rows, 3), torch.int32),
                               e((max_rows,), torch.float32))
    for al in a.algo_list:
      fns["mkernel_" + al] = (lambda al=al: mk.moe_dispatch_gemm(
          x, idx, wts, w1, max_rows=max_rows, algo=algo_of(al), comm_sms=sms_of(al), out=res))
  avail, ref = {}, None
  for name, fn in fns.items():
    ok, err, out = probe(bench, fn)
    if ok:
      avail[name] = fn
      ref = out if name == "torch" else ref
    else:
      errors[name] = err
  checks, spot, direct, toks = {}, {}, None, list(range(min(a.spot, T)))
  if ffn and ref is not None and toks:
    direct = direct_moe_ffn(x, idx, wts, lambda e: expert_weights(seed, e, H, I, dt, dev), toks)
    spot["torch"] = verdict(bench, compare(ref[toks], direct))
  for name in [m for m in mk_names if m in avail and ref is not None]:
    avail[name]()
    torch.cuda.synchronize()
    checks[name] = check_ffn(bench, y, ref) if ffn else check_dispatch(bench, res, ref)
    if direct is not None:
      spot[name] = verdict(bench, compare(y[toks], direct))
  ref = direct = None
  first = next((m for m in mk_names if m in avail), None)
  graph_of = {first + "_graph": first} if graph and first else {}
  if a.side == "mkernel":  # torch's timing comes from the torch side (the real NCCL)
    avail.pop("torch", None)
  results, gerr = measure(bench, avail, graph_of)
  errors.update(gerr)
  for r in results.values():
    r["tflops"] = flops / (r["ms"] * 1e-3) / 1e12
    r["tflops_gpu"] = r["tflops"] * bench.ranks_per_gpu
  for name, err in errors.items():
    results[name] = {"error": err}
  row.update(variants=results, checks=checks, spot=spot)
  set_ratios(row)
  torch.cuda.synchronize()
  dist.barrier()  # peers may still read this rank's buffers until every rank is here
  return row


def xnode_model(bench, idx, E, max_rows, row_bytes):
  """--dedup-modes: the mode of this run and the modelled MiB of token rows one dispatch sends
  across (virtual) nodes, every rank together, in modes 0 and 1 (cross_node_rows)."""
  lst = idx.tolist()
  rows = [cross_node_rows(lst, E, bench.world, bench.a.nodes, bench.rank, m, max_rows)
          for m in (0, 1)]
  t = torch.tensor(rows, dtype=torch.float64, device=bench.device)
  dist.all_reduce(t)
  return dict(dedup_mode=dedup_mode(),
              xnode_mib_model={str(m): v * row_bytes / 2**20 for m, v in enumerate(t.tolist())})


def set_ratios(row):
  """mkernel/torch = torch ms / mkernel ms per mkernel variant, and the target (auto, else the
  first algo, >= 1.0); again after --nodes brought the torch side's timings in."""
  v = row["variants"]
  t_ms = v.get("torch", {}).get("ms")
  ratios = {m: t_ms / r["ms"] for m, r in v.items()
            if m.startswith("mkernel") and "ms" in r and t_ms}
  first = next((m for m in v if m.startswith("mkernel") and not m.endswith("_graph") and
                "ms" in v[m]), None)
  goal = "mkernel_auto" if "mkernel_auto" in ratios else first
  row.update(ratios=ratios, target_variant=goal,
             target_met=None if goal not in ratios else ratios[goal] >= 1.0)


def row_key(r):
  return tuple(r[x] for x in "HIEkT")


def verdict(bench, c):
  c = merge_compare(c, bench.reduce_max)
  c["ok"] = judge(c, bench.a.tol, bench.a.token_tol)
  return c


def check_ffn(bench, y, ref):
  return verdict(bench, compare(y, ref))


def check_dispatch(bench, res, ref):
  """Counts and offsets equal, received rows equal, y close, in torch's order of the rows."""
  xe, yt, per = ref
  cnt, off = res.expert_count.tolist(), res.expert_offset.tolist()
  layout_ok = cnt == per and off[0] == 0 and all(
      off[e + 1] == off[e] + pad_rows(cnt[e]) for e in range(len(cnt)))
  rows_ok, c = False, dict(rel_l2=math.inf, worst_token=math.inf, max_abs=math.inf, finite=True)
  if layout_ok:
    rows = torch.cat([torch.arange(off[e], off[e] + v, device=xe.device)
                      for e, v in enumerate(cnt)])
    rows_ok = torch.equal(res.x_recv[rows], xe)
    c = compare(res.y[rows], yt)
  c = verdict(bench, c)
  c["layout_ok"], c["rows_exact"] = bench.agree(layout_ok), bench.agree(rows_ok)
  c["ok"] = c["ok"] and c["layout_ok"] and c["rows_exact"]
  return c


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def shape_text(r):
  return "H=%d I=%d E=%d k=%d T=%d" % (r["H"], r["I"], r["E"], r["k"], r["T"])


def short(name):
  return name.replace("mkernel_", "")


def check_text(r):
  cs = list(r.get("checks", {}).values())
  if not cs:
    return "n/a"
  worst = max(c["rel_l2"] for c in cs)
  what = [w for w, key in (("counts/offsets", "layout_ok"), ("rows", "rows_exact"))
          if not all(c.get(key, True) for c in cs)]
  return "%.2g %s" % (worst, "ok" if all(c["ok"] for c in cs) else "MISMATCH" +
                      "".join(" (%s differ)" % w for w in what))


def shape_line(r):
  if "skipped" in r:
    return "%s skipped: %s" % (shape_text(r), r["skipped"])
  v = r["variants"]
  parts = ["%s %.3f ms (%.0f TF/s)" % (x, v[x]["ms"], v[x]["tflops"]) for x in v if "ms" in v[x]]
  rat = ", ".join("%s %.3f" % (short(m), x) for m, x in r["ratios"].items())
  line = "%s max_rows=%d | %s | mkernel/torch: %s | check %s" % (
      shape_text(r), r["max_rows"], ", ".join(parts), rat or "n/a", check_text(r))
  if "dedup_mode" in r:
    line += " | %s=%s, x-node MiB/call (model) %s" % (DEDUP_ENV, r["dedup_mode"], xnode_text(r))
  return line


def markdown(meta, rows):
  L = ["# moe_bench %s" % meta["mode"], "",
       "- command: `%s`" % meta["command"], "- commit: %s" % meta["commit"],
       "- device: %s; %d rank(s), %d per GPU" % (meta["device"], meta["nranks"],
                                                 meta["ranks_per_gpu"]),
       "- date: %s" % meta["date"],
       "- torch %s, CUDA %s; torch's collectives: NCCL %s (%s)" % (
           meta["torch"], meta["cuda"], meta["nccl_version"], meta["nccl_provider"]),
       "- libmkernel: %s" % (meta["library"] or "not usable: %s" % meta["mkernel_error"]),
       "- mkernel path: %s" % PATH_NOTE[meta["mkernel_path"]],
       "- torch layer: routing counts through all_to_all_single, then copied to the host (the "
       "split sizes of the row exchange: a host synchronisation per call, part of torch's "
       "time), rows through all_to_all_single, expert GEMMs: %s" % meta["torch_gemm"],
       "- max_rows: %s; routing %s; %s" % (meta["config"]["max_rows"], meta["config"]["routing"],
                                           meta["config"]["dtype"])] + meta.get(
                                               "nodes_header", []) + [""]
  names = []
  for r in rows:
    for x in r.get("variants", {}):
      if x not in names:
        names.append(x)
  L.append("Values: ms per call (TFLOP/s per rank; per GPU: times %d). mkernel/torch: torch's ms "
           "over mkernel's (target >= 1.0 for auto). check: worst relative L2 error against "
           "torch; spot: torch against a direct fp32 sum over the first tokens." %
           meta["ranks_per_gpu"])
  dedup = "dedup_mode" in meta
  if dedup:
    L.append("%s=%s (--dedup-modes: one mkernel-side run per mode, one torch side). x-node: "
             "MiB of token rows one dispatch sends across nodes, all ranks, modelled from the "
             "routing (moe_bench_ref.cross_node_rows; the return path is per slot in every "
             "mode), other modes in brackets." % (DEDUP_ENV, meta["dedup_mode"]))
  L.append("")
  L.append("| shape (T per rank) | max_rows | " + " | ".join(names) +
           " | mkernel/torch | check | spot |" + (" x-node MiB/call |" if dedup else ""))
  L.append("|" + "---|" * (len(names) + 5 + dedup))
  for r in rows:
    if "skipped" in r:
      L.append("| %s | %s |" % (shape_text(r), "skipped: " + r["skipped"]))
      continue
    cells = []
    for x in names:
      m = r["variants"].get(x)
      cells.append("-" if m is None else "n/a" if "ms" not in m else "%.3f (%.0f)" % (
          m["ms"], m["tflops"]))
    rat = ", ".join("%s %.2f" % (short(m), x) for m, x in r["ratios"].items()) or "n/a"
    sp = r["spot"].get("torch")
    L.append("| %s | %d | %s | %s | %s | %s |" % (
        shape_text(r), r["max_rows"], " | ".join(cells), rat, check_text(r),
        "n/a" if sp is None else "%.2g %s" % (sp["rel_l2"], "ok" if sp["ok"] else "WRONG")) +
             (" %s |" % xnode_text(r) if dedup and "xnode_mib_model" in r else ""))
  errs = sorted({(x, m["error"]) for r in rows for x, m in r.get("variants", {}).items()
                 if "error" in m})
  notes = sorted({r["graph_skipped"] for r in rows if "graph_skipped" in r})
  if errs:
    L += ["", "Variants that did not run:"] + ["- %s: %s" % e for e in errs]
  if notes:
    L += ["", "CUDA-graph variant left out at some shapes: " + "; ".join(notes)]
  return "\n".join(L) + "\n"


def exit_status(rows, mk_usable):
  """1: a check failed, or an mkernel variant failed while the library was usable; 3: a target
  missed; else 0."""
  bad = [r for r in rows for c in list(r.get("checks", {}).values()) + list(
      r.get("spot", {}).values()) if not c["ok"]]
  failed = [r for r in rows for x, m in r.get("variants", {}).items()
            if mk_usable and x.startswith("mkernel") and "error" in m]
  missed = [r for r in rows if r.get("target_met") is False]
  return (1 if bad or failed else 3 if missed else 0), len(bad), len(failed), len(missed)


def report(bench, a, argv, rows):
  """Rank 0: the results written (the torch side of --nodes: its file for the mkernel side);
  returns the exit status."""
  now = datetime.datetime.now(datetime.timezone.utc)
  pre = os.environ.get("LD_PRELOAD", "")
  try:
    nv = ".".join(str(x) for x in torch.cuda.nccl.version())
  except Exception as e:  # noqa: BLE001
    nv = "unknown (%s)" % first_line(e)
  meta = dict(tool="moe_bench", mode=a.mode, nranks=bench.world,
              ranks_per_gpu=bench.ranks_per_gpu,
              command=bpu.command_line(argv),
              commit=commit(), device=torch.cuda.get_device_name(bench.device),
              date=now.isoformat(timespec="seconds"), torch=torch.__version__,
              cuda=torch.version.cuda, nccl_version=nv,
              nccl_provider="mkernel, preloaded" if "mkernel" in pre else "torch's own NCCL",
              library=bench.lib_path, mkernel_error=bench.mk_error, preload=pre,
              mps=os.environ.get("CUDA_MPS_PIPE_DIRECTORY", ""), mkernel_path=bench.path,
              mkernel_path_note=PATH_NOTE[bench.path], torch_gemm=bench.gemm_note,
              torch_host_sync="routing counts copied to the host once per call (split sizes)",
              config=dict(max_rows=str(a.max_rows), routing=a.routing, dtype=a.dtype,
                          algos=a.algo_list, graph=not a.no_graph, reps=a.reps,
                          warmup=a.warmup, target_ms=a.target_ms, tol=a.tol,
                          token_tol=a.token_tol, spot=a.spot, seed=a.seed,
                          mem_frac=a.mem_frac, lead_in=a.lead_in and bench.world > 1))
  if a.dedup_modes and a.side == "mkernel":
    meta["dedup_mode"] = dedup_mode()
  if a.side == "torch":
    meta["side_facts"] = bench.facts
    bpu.write_torch_side(a.side_out, meta, rows)
    bad = [r for r in rows for x, m in r.get("variants", {}).items() if "error" in m] + [
        r for r in rows for c in r.get("spot", {}).values() if not c["ok"]]
    return 1 if bad or any(bench.facts["libmkernel_mapped"]) else 0
  missing = 0
  if a.side == "mkernel":
    missing = bpu.apply_torch_side(a, bench, rows, meta, row_key, lambda x: x == "torch",
                                   ["torch"], set_ratios)
    for r in rows:
      log(shape_line(r))
  name = a.mode + ("_dedup%s" % meta["dedup_mode"] if "dedup_mode" in meta else "")
  bpu.write_results("moe_bench", a.out, name, now, meta, rows, markdown(meta, rows))
  if "dedup_mode" in meta:
    append_summary(rows, meta["dedup_mode"], shape_text, check_text)
  rc, nbad, nfail, nmiss = exit_status(rows, bench.mk is not None)
  log("moe_bench: %d shape(s), %d failed check(s), %d failed mkernel variant(s), %d target(s) "
      "missed%s" % (len(rows), nbad, nfail, nmiss,
                    ", %d without torch timings (torch side)" % missing if a.side else ""))
  return 1 if missing else rc


def worker(a, argv):
  if import_error is not None:
    print("moe_bench: torch is needed: %s" % import_error, file=sys.stderr)
    return 2
  try:
    bench = Bench(a)
  except SetupError as e:
    print("moe_bench: %s" % e, file=sys.stderr)
    return 2
  torch.backends.cuda.matmul.allow_tf32 = False
  if bench.rank == 0:
    log("moe_bench %s: %d rank(s) (%d per GPU), %s, torch %s; libmkernel %s; mkernel path: %s; "
        "torch GEMMs: %s" % (a.mode, bench.world, bench.ranks_per_gpu,
                             torch.cuda.get_device_name(bench.device), torch.__version__,
                             bench.lib_path or "NOT USABLE (%s)" % bench.mk_error, bench.path,
                             bench.gemm_note))
  rows = []
  for no, shape in enumerate(a.shape_list):
    if bench.out_of_time():
      rows.append(dict(zip("HIEkT", shape), skipped="budget exhausted"))
    else:
      rows.append(run_shape(bench, no, shape, a.mode))
    if bench.rank == 0:
      log(shape_line(rows[-1]))
    gc.collect()
    torch.cuda.empty_cache()
  # (The sides' facts are gathered after the runs: libmkernel never got mapped by then.)
  return bpu.finish_worker(bench, a, lambda: report(bench, a, argv, rows))


def main():
  argv = sys.argv[1:]
  if argv[:1] == ["--selftest"]:
    return subprocess.run([sys.executable, os.path.join(HERE, "test_moe_bench.py")] +
                          argv[1:]).returncode
  return bpu.dispatch(argv, parse_args, launch, worker, CHILD)


if __name__ == "__main__":
  sys.exit(main())
