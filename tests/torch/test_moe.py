"""The MoE calls of the Python package (mkernel.moe_dispatch_gemm, mkernel.moe_ffn) under torchrun.

torchrun --nproc-per-node=4 tests/torch/test_moe.py   (LD_PRELOAD=libmkernel.so; the ranks may
share one GPU; the runner: scripts/run_torch_tests.sh <build> fused_moe fused_moe_vnodes, the
second with MKERNEL_EMULATE_NODES=2: 2 virtual nodes of 2, where the "fused" cases run the fused
kernel across nodes; MK_TORCH_VARIANT names the run)

Every rank draws its tokens, routing (uniform, one hot expert, half the experts and ranks empty,
repeated expert ids in a token; -1 slots and tokens with every slot -1; one rank with no tokens)
and routing weights from seeds, and its local experts' weights. The results (outputs poisoned
first) are compared element by element with a pure-torch reference:
  * dispatch: all_to_all_single of the routed rows with their (source, token, slot, expert) and
    weight, sorted stably by local expert: the packed layout (source rank, then token, then
    slot), checked against the seeded routing of every rank too. expert_count, expert_offset
    (multiples of 128), row_source (-1 on padding rows), x_recv and row_weight exact; y against
    fp64 x_recv @ w1^T within eps_out |ref| + H 2^-22 sum|x||w| (one rounding, fp32 sums);
  * moe_ffn: that dispatch, per expert h = x W1^T and act = silu(gate) * up rounded to the input
    dtype, out = act W2^T, sent back with all_to_all_single and summed weighted in slot order.
    Checked per element within a bound that allows h and act to round to the neighbouring
    value (the reference's and mkernel's fp32 sums differ in order), and per token: the error's
    L2 norm below 2^-6 sum_j |w_j| |out_j| (a missing, doubled or misweighted slot is >= 8x
    that); tokens with no slot exactly 0.
Also: several calls back to back, subgroups [0,1],[2,3], a CUDA graph of moe_ffn with reused
buffers replayed with new tokens and routing, clear errors (and a call refused by the C library,
after which the communicator still works), no NCCL symbol bound to the real libnccl.

Without a GPU, tests/torch/cpu_selfcheck.sh test_moe.py runs this file with gloo and a slow
stand-in of the two calls (built from all_gather_object, not from the reference's path): a
check of the references and comparisons, not of mkernel. MK_MOE_FAULT=row_order|y_ulp|padding|
weight|drop_slot makes the stand-in wrong on rank 2, to see the checks catch it.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mk_common import (Ctx, Shifted, check_preloaded_library, compare, expect_raises, log,
                       make_input, nccl_binding_check, pair_group, poison_like, probe_layout,
                       run_tests, seed_of, skip_without_cuda, world_comm)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import mkernel  # noqa: E402  (the package of this source tree)
from mkernel import _lib, _moe  # noqa: E402

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# One step between neighbouring values, relative (2 * unit roundoff).
STEP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23}
ALIGN = _lib.MOE_ROW_ALIGN
CALLS = {"dispatch": mkernel.moe_dispatch_gemm, "ffn": mkernel.moe_ffn,
         "buffers": mkernel.moe_ffn_buffers}

# (T, H, N or I, local experts, k, in, layout, out, routing, algo, rank without tokens)
DISPATCH_CASES = [
    (300, 128, 200, 2, 4, "bf16", "nk", None, "uniform", "auto", None),
    (129, 136, 128, 3, 2, "fp16", "kn", "fp32", "hot", "sequential", None),
    (64, 64, 72, 1, 1, "bf16", "nk", "fp16", "uniform", "fused", 1),
    (200, 256, 256, 4, 8, "bf16", "nk", None, "empty", "auto", None),
    (150, 64, 64, 2, 3, "bf16", "kn", None, "dup", "auto", None),
]
FFN_CASES = [
    (300, 128, 64, 2, 4, "bf16", "nk", None, "uniform", "auto", None),
    (129, 136, 72, 3, 2, "fp16", "kn", "fp32", "hot", "sequential", None),
    (200, 256, 128, 4, 8, "bf16", "nk", None, "empty", "fused", None),
    (90, 64, 32, 1, 3, "bf16", "nk", "fp16", "dup", "auto", 2),
]


def make_routing(T, k, E, kind, *parts):
  g = torch.Generator()
  g.manual_seed(seed_of(*parts))
  if kind == "dup":  # a token may name one expert in several slots
    idx = torch.randint(0, E, (T, k), generator=g)
  else:
    scores = torch.rand(T, E, generator=g)
    if kind == "hot":
      scores[:, 0] += 0.7
    allowed = torch.ones(E, dtype=torch.bool)
    if kind == "empty":  # odd experts and the upper half of the ranks receive nothing
      e = torch.arange(E)
      allowed = (e % 2 == 0) & (e < max(1, E // 2))
      scores[:, ~allowed] = -1.0
    kk = min(k, E)
    idx = torch.full((T, k), -1, dtype=torch.int64)
    if T:
      idx[:, :kk] = scores.topk(kk, dim=1).indices
    idx[(idx >= 0) & ~allowed[idx.clamp(min=0)]] = -1
  idx[torch.rand(T, k, generator=g) < 0.15] = -1
  idx[torch.rand(T, generator=g) < 0.05] = -1
  wts = torch.rand(T, k, generator=g) + 0.05
  return idx.to(torch.int32), wts


class Case:
  """Every rank's tokens and routing (seeded: each rank rebuilds all), this rank's experts."""

  def __init__(self, ctx, tag, T, H, NI, L, k, din, layout, dout, routing, algo, zero_rank,
               ffn, group=None, granks=None):
    self.granks = list(range(ctx.world)) if granks is None else granks
    self.group, self.n, self.me = group, len(self.granks), self.granks.index(ctx.rank)
    self.H, self.L, self.k, self.E, self.ffn = H, L, k, L * len(self.granks), ffn
    self.I = NI if ffn else 0
    self.N = 2 * NI if ffn else NI
    self.dt, self.out_dt = DT[din], DT[dout or din]
    self.layout, self.algo, self.routing = layout, algo, routing
    self.name = "%s/T%d_H%d_%s%d_L%d_k%d/%s/%s/out_%s/%s/%s" % (
        "ffn" if ffn else "dispatch", T, H, "I" if ffn else "N", NI, L, k, din, layout,
        dout or din, routing, algo)
    dev = ctx.device
    self.x, self.idx, self.wts = [], [], []
    for i, r in enumerate(self.granks):
      Ti = 0 if i == zero_rank else T + 13 * i
      self.x.append(make_input(Ti * H, self.dt, tag, "x", r).view(Ti, H))
      idx, wts = make_routing(Ti, k, self.E, routing, tag, "route", r)
      self.idx.append(idx)
      self.wts.append(wts)
    me = self.me
    self.T = self.x[me].shape[0]
    self.dx, self.didx, self.dwts = self.x[me].to(dev), self.idx[me].to(dev), self.wts[me].to(dev)
    # Logical [L, N, H] and [L, H, I]; the call gets them in `layout`.
    self.w1l = (make_input(L * self.N * H, torch.float32, tag, "w1", ctx.rank) * H**-0.5).to(
        self.dt).view(L, self.N, H).to(dev)
    self.dw1 = self.w1l if layout == "nk" else self.w1l.transpose(1, 2).contiguous()
    self.w2l = self.dw2 = None
    if ffn:
      self.w2l = (make_input(L * H * self.I, torch.float32, tag, "w2", ctx.rank) *
                  self.I**-0.5).to(self.dt).view(L, H, self.I).to(dev)
      self.dw2 = self.w2l if layout == "nk" else self.w2l.transpose(1, 2).contiguous()
    self.max_rows = mkernel.moe_max_rows(max(x.shape[0] for x in self.x), k, L, self.n)
    self.pass_weights = True  # False: the call gets topk_weights=None

  def kwargs(self):
    return dict(max_rows=self.max_rows, group=self.group, w_layout=self.layout, algo=self.algo,
                out_dtype=self.out_dt if self.out_dt != self.dt else None)


# ---------------------------------------------------------------------------------------------
# Pure-torch reference
# ---------------------------------------------------------------------------------------------
def a2a_rows(c, send, send_counts, recv_counts):
  """all_to_all_single of the rows of send [S, C] (1-D transfers: counts in elements)."""
  C = send.shape[1]
  out = torch.empty(sum(recv_counts) * C, dtype=send.dtype, device=send.device)
  dist.all_to_all_single(out, send.reshape(-1).contiguous(), [v * C for v in recv_counts],
                         [v * C for v in send_counts], group=c.group)
  return out.view(-1, C)


class Dispatched:
  """The rows this rank receives, sorted into the packed layout, and how to send back."""

  def __init__(self, c):
    dev, L, k = c.dx.device, c.L, c.k
    idx = c.didx.reshape(-1).long()
    slots = ((idx >= 0) & (idx < c.E)).nonzero().reshape(-1)  # slot order: token, then k
    dest = idx[slots] // L
    self.order = slots[torch.sort(dest, stable=True).indices]
    sc = torch.bincount(dest, minlength=c.n).to(torch.int64)
    rc = torch.empty_like(sc)
    dist.all_to_all_single(rc, sc, group=c.group)
    self.send_counts, self.recv_counts = sc.tolist(), rc.tolist()
    t, j = self.order // k, self.order % k
    meta = torch.stack([torch.full_like(t, c.me), t, j, idx[self.order]], 1)
    rx = a2a_rows(c, c.dx[t], self.send_counts, self.recv_counts)
    rmeta = a2a_rows(c, meta, self.send_counts, self.recv_counts)
    rw = a2a_rows(c, c.dwts.reshape(-1)[self.order].reshape(-1, 1), self.send_counts,
                  self.recv_counts)
    local = rmeta[:, 3] - c.me * L
    self.perm = torch.sort(local, stable=True).indices
    self.rx, self.meta, self.rw = rx[self.perm], rmeta[self.perm], rw[self.perm, 0]
    self.local = local[self.perm]
    self.counts = torch.bincount(self.local, minlength=L).tolist()
    self.starts = [sum(self.counts[:e]) for e in range(L)]  # in the sorted rows
    padded = [(v + ALIGN - 1) // ALIGN * ALIGN for v in self.counts]
    self.offsets = [sum(padded[:e]) for e in range(L + 1)]
    R = len(self.local)
    pos = torch.arange(R, device=dev)
    self.packed = (torch.tensor(self.offsets[:L], device=dev, dtype=torch.int64)[self.local] + pos -
                   torch.tensor(self.starts, device=dev, dtype=torch.int64)[self.local]
                   ) if R else pos
    self.span = self.offsets[L]

  def rows(self, e):
    return slice(self.starts[e], self.starts[e] + self.counts[e])

  def seeded_mismatch(self, c):
    """'' when the rows match every rank's seeded tokens and routing, else what differs."""
    me0 = c.me * c.L
    src_tj = []
    for e in range(c.L):
      for s in range(c.n):
        tj = (c.idx[s] == me0 + e).nonzero()
        src_tj += [(s, int(t), int(j)) for t, j in tj]
    got = [tuple(v) for v in self.meta[:, :3].tolist()]
    if got != src_tj:
      return "rows (source, token, slot) %s... differ from the seeded %s..." % (got[:4],
                                                                                src_tj[:4])
    want = torch.stack([c.x[s][t] for s, t, _ in src_tj]) if src_tj else self.rx.cpu()
    if not torch.equal(self.rx.cpu().view(torch.int16), want.view(torch.int16)):
      return "received token rows differ from the seeded tokens"
    return ""


def check_dispatch(rep, name, c, res):
  d = Dispatched(c)
  rep.check(name + "/reference_matches_seeded_routing", not d.seeded_mismatch(c),
            d.seeded_mismatch(c))
  L, R = c.L, len(d.local)
  ok, det = compare(res.expert_count, torch.tensor(d.counts, dtype=torch.int64))
  rep.check(name + "/expert_count", ok, det)
  ok, det = compare(res.expert_offset, torch.tensor(d.offsets, dtype=torch.int64))
  rep.check(name + "/expert_offset", ok, det)
  if d.span > c.max_rows:
    rep.fail(name + "/span", "reference layout spans %d rows > max_rows %d" % (d.span,
                                                                              c.max_rows))
    return
  src = torch.full((d.span, 3), -1, dtype=torch.int64, device=c.dx.device)
  src[d.packed] = d.meta[:, :3]
  ok, det = compare(res.row_source[:d.span], src.cpu())
  rep.check(name + "/row_source_incl_padding", ok, det)
  ok, det = compare(res.x_recv[d.packed], d.rx.to(torch.float64).cpu())
  rep.check(name + "/x_recv_exact", ok, det)
  if res.row_weight is not None:
    ok, det = compare(res.row_weight[d.packed], d.rw.to(torch.float64).cpu())
    rep.check(name + "/row_weight_exact", ok, det)
  ref = torch.empty(R, c.N, dtype=torch.float64, device=c.dx.device)
  tol = torch.empty_like(ref)
  for e in range(L):
    x, w = d.rx[d.rows(e)].double(), c.w1l[e].double()
    ref[d.rows(e)] = x @ w.t()
    tol[d.rows(e)] = c.H * 2.0**-22 * (x.abs() @ w.abs().t())
  tol += STEP[c.out_dt] * ref.abs() + 1e-30
  ok, det = compare(res.y[d.packed], ref.cpu(), tol.cpu())
  rep.check(name + "/y_vs_fp64", ok, det)


def ffn_reference(c):
  """y (fp64) of this rank's tokens, an element bound, and S_t = sum_j |w_j| |out_j|_2."""
  d = Dispatched(c)
  H, I, R, dev = c.H, c.I, len(d.local), c.dx.device
  s_in = STEP[c.dt]
  outs = torch.zeros(R, 2 * H, dtype=torch.float64, device=dev)  # out | its bound
  for e in range(c.L):
    rs = d.rows(e)
    x, w1, w2 = d.rx[rs].double(), c.w1l[e].double(), c.w2l[e].double()
    h = (x @ w1.t()).to(c.dt)
    s1 = c.H * 2.0**-22 * (x.abs() @ w1.abs().t())
    g, u = h[:, :I].float(), h[:, I:].float()
    act = (F.silu(g) * u).to(c.dt).double()
    g, u = g.double(), u.double()
    dg = s_in * g.abs() + s1[:, :I]
    du = s_in * u.abs() + s1[:, I:]
    dact = 1.2 * u.abs() * dg + F.silu(g).abs() * du + (s_in + 2.0**-20) * act.abs()
    out = act @ w2.t()
    aw = act.abs() @ w2.abs().t()
    outs[rs, :H] = out
    # The library's combine takes out rounded to the input type (fused/ops/moe/combine_dev.cuh):
    # one step of it (fp16: at least its subnormal step) on top of the fp32 sum's error.
    sub = 2.0**-24 if c.dt == torch.float16 else 0.0
    outs[rs, H:] = (dact @ w2.abs().t() + I * 2.0**-22 * aw + (s_in + 2.0**-23) * out.abs() +
                    sub)
  back = torch.empty_like(outs)
  back[d.perm] = outs  # received order: by source, in the source's slot order
  got = a2a_rows(c, back, d.recv_counts, d.send_counts)  # row i is slot d.order[i]
  T, k = c.T, c.k
  w = c.dwts.reshape(-1)[d.order].double().unsqueeze(1)
  contrib = torch.zeros(T * k, H, dtype=torch.float64, device=dev)
  bound = torch.zeros_like(contrib)
  contrib[d.order] = w * got[:, :H]
  bound[d.order] = w.abs() * got[:, H:] + (k + 1) * 2.0**-23 * (w * got[:, :H]).abs()
  norms = torch.zeros(T * k, dtype=torch.float64, device=dev)
  norms[d.order] = w.abs().reshape(-1) * got[:, :H].norm(dim=1)
  y = contrib.view(T, k, H).sum(1)
  tol = bound.view(T, k, H).sum(1) + STEP[c.out_dt] * y.abs() + 1e-30
  return y, tol, norms.view(T, k).sum(1)


def check_ffn(rep, name, c, y):
  ref, tol, S = ffn_reference(c)
  ok, det = compare(y, ref.cpu(), tol.cpu())
  rep.check(name + "/y_per_element", ok, det)
  err = (y.double() - ref).norm(dim=1) if c.T else ref.sum(1)
  lim = 2.0**-6 * S
  bad = ~(err <= lim)
  nb = int(bad.sum())
  det = "max err/limit %.3g over %d tokens" % (float((err / (lim + 1e-300)).max()) if c.T else 0,
                                                c.T)
  if nb:
    t = int(bad.nonzero()[0])
    det = "%d tokens off, first %d: |err| %.4g > %.4g" % (nb, t, float(err[t]), float(lim[t]))
  rep.check(name + "/y_per_token_l2", nb == 0, det)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------
def poisoned_result(c):
  dev, R, L = c.dx.device, c.max_rows, c.L
  e = lambda shape, dt: poison_like(torch.empty(shape, dtype=dt, device=dev))  # noqa: E731
  return mkernel.MoeDispatchResult(e((R, c.H), c.dt), e((R, c.N), c.out_dt), e((L,), torch.int32),
                                   e((L + 1,), torch.int32), e((R, 3), torch.int32),
                                   e((R,), torch.float32))


def run_dispatch(c, out=None):
  return CALLS["dispatch"](c.dx, c.didx, c.dwts if c.pass_weights else None, c.dw1, out=out,
                           **c.kwargs())


def run_ffn(c, out=None, buffers=None):
  return CALLS["ffn"](c.dx, c.didx, c.dwts, c.dw1, c.dw2, out=out, buffers=buffers, **c.kwargs())


def test_probe(ctx):
  """One small call: this layout (processes, GPUs) must be one the library runs."""
  c = Case(ctx, "probe", 32, 64, 64, 1, 2, "bf16", "nk", None, "uniform", "auto", None, False)
  ok, res = probe_layout(ctx, "moe_runs_in_this_layout", lambda: run_dispatch(c))
  if ok:
    check_dispatch(ctx.report, "probe", c, res)
  return ok


def test_dispatch(ctx):
  rep = ctx.report
  for i, case in enumerate(DISPATCH_CASES):
    c = Case(ctx, ("dispatch", i), *case, ffn=False)
    out = poisoned_result(c)
    res = run_dispatch(c, out=out)
    torch.cuda.synchronize()
    rep.check(c.name + "/returns_out", res is out, "")
    check_dispatch(rep, c.name, c, res)
  c = Case(ctx, ("dispatch", "alloc"), *DISPATCH_CASES[0], ffn=False)
  c.pass_weights = False
  res = run_dispatch(c)
  torch.cuda.synchronize()
  rep.check("dispatch/allocated_no_weights/row_weight_none", res.row_weight is None, "")
  check_dispatch(rep, "dispatch/allocated_no_weights", c, res)


def test_ffn(ctx):
  rep = ctx.report
  for i, case in enumerate(FFN_CASES):
    c = Case(ctx, ("ffn", i), *case, ffn=True)
    y = poison_like(torch.empty(c.T, c.H, dtype=c.out_dt, device=ctx.device))
    got = run_ffn(c, out=y)
    torch.cuda.synchronize()
    rep.check(c.name + "/returns_out", got is y, "")
    check_ffn(rep, c.name, c, y)
    if i == 0:  # allocated output and the call's own buffers, twice (the second reuses them)
      for rnd in range(2):
        y2 = run_ffn(c)
        torch.cuda.synchronize()
        rep.check(c.name + "/allocated/bit_identical_to_out_%d" % rnd, torch.equal(y2, y), "")


def test_back_to_back(ctx):
  """8 calls, dispatch and ffn alternating, without host synchronisation, checked after."""
  calls = []
  for i in range(8):
    ffn = i % 2 == 1
    case = (FFN_CASES if ffn else DISPATCH_CASES)[i // 2 % 2]
    c = Case(ctx, ("b2b", i), *case, ffn=ffn)
    calls.append((c, run_ffn(c) if ffn else run_dispatch(c)))
  torch.cuda.synchronize()
  for i, (c, r) in enumerate(calls):
    (check_ffn if c.ffn else check_dispatch)(ctx.report, "back_to_back_8/%d_%s" % (i, c.name), c,
                                             r)


def test_subgroups(ctx):
  rep = ctx.report
  pair = pair_group(ctx)
  if pair is None:
    return
  group, first = pair
  kw = dict(group=group, granks=[first, first + 1])
  c = Case(ctx, ("sub_d", first), *DISPATCH_CASES[0], ffn=False, **kw)
  check_dispatch(rep, "subgroup_pairs/dispatch", c, run_dispatch(c))
  c = Case(ctx, ("sub_f", first), *FFN_CASES[0], ffn=True, **kw)
  y = run_ffn(c)
  torch.cuda.synchronize()
  check_ffn(rep, "subgroup_pairs/ffn", c, y)


def test_cuda_graph(ctx):
  rep = ctx.report
  if skip_without_cuda(ctx, "cuda_graph"):
    return
  shape = (160, 128, 64, 2, 4, "bf16", "nk", None, "uniform", "auto", None)
  cs = [Case(ctx, ("graph", i), *shape, ffn=True) for i in range(4)]
  c0 = cs[0]
  x, idx, wts = c0.dx.clone(), c0.didx.clone(), c0.dwts.clone()
  bufs = CALLS["buffers"](c0.max_rows, c0.H, c0.I, c0.L, c0.dt)
  y = torch.empty(c0.T, c0.H, dtype=c0.dt, device=ctx.device)
  call = lambda: mkernel.moe_ffn(x, idx, wts, c0.dw1, c0.dw2, buffers=bufs, out=y)  # noqa: E731
  s = torch.cuda.Stream()
  s.wait_stream(torch.cuda.current_stream())
  with torch.cuda.stream(s):  # the first call on a comm is not capturable
    call()
  torch.cuda.current_stream().wait_stream(s)
  torch.cuda.synchronize()
  check_ffn(rep, "cuda_graph/eager_with_buffers", c0, y)
  g = torch.cuda.CUDAGraph()
  with torch.cuda.graph(g):
    call()
  for i in range(1, 4):
    # Same shapes and weights (the graph's); new tokens and routing.
    ci = cs[i]
    ci.w1l, ci.w2l, ci.dw1, ci.dw2 = c0.w1l, c0.w2l, c0.dw1, c0.dw2
    x.copy_(ci.dx)
    idx.copy_(ci.didx)
    wts.copy_(ci.dwts)
    poison_like(y)
    g.replay()
    torch.cuda.synchronize()
    check_ffn(rep, "cuda_graph/moe_ffn_replay_new_routing", ci, y)


def test_errors(ctx):
  rep = ctx.report
  if skip_without_cuda(ctx, "errors"):
    return
  c = Case(ctx, "errors", 64, 64, 32, 1, 2, "bf16", "nk", None, "uniform", "auto", None, True)

  def raises(name, exc, text, fn):
    expect_raises(rep, name, exc, text, fn)

  raises("errors/cpu_tensor", ValueError, "CUDA tensors",
         lambda: mkernel.moe_ffn(c.dx.cpu(), c.didx, c.dwts, c.dw1, c.dw2, max_rows=256))
  raises("errors/int64_topk_idx", TypeError, ".int()",
         lambda: mkernel.moe_ffn(c.dx, c.didx.long(), c.dwts, c.dw1, c.dw2, max_rows=256))
  raises("errors/no_max_rows", TypeError, "max_rows is required",
         lambda: mkernel.moe_dispatch_gemm(c.dx, c.didx, c.dwts, c.dw1))
  gloo = dist.new_group(backend="gloo")
  raises("errors/gloo_group", mkernel.MkernelError, "CUDA backend",
         lambda: mkernel.moe_ffn(c.dx, c.didx, c.dwts, c.dw1, c.dw2, max_rows=256, group=gloo))

  lib, comm = world_comm(ctx)
  p = _moe.plan("moe_dispatch_gemm", c.dx, c.didx, c.dwts, c.dw1, ctx.world, 256)
  res = mkernel.MoeDispatchResult(*[
      torch.empty(s[0], dtype=getattr(torch, s[1]), device=ctx.device)
      for s in _moe.recv_specs(p).values()
  ])
  stream = torch.cuda.current_stream().cuda_stream
  raises("errors/refused_by_c_library_with_message", mkernel.MkernelError, "16-byte aligned",
         lambda: _moe.invoke_dispatch(lib, p, c.dx, c.didx, c.dwts, Shifted(c.dw1), res, comm,
                                      stream))
  y = mkernel.moe_ffn(c.dx, c.didx, c.dwts, c.dw1, c.dw2, max_rows=c.max_rows)
  torch.cuda.synchronize()
  check_ffn(rep, "errors/comm_usable_after_refused_call", c, y)
  check_preloaded_library(rep, lib)


# ---------------------------------------------------------------------------------------------
# CPU self-check: a stand-in of the two calls from every rank's inputs (all_gather_object)
# ---------------------------------------------------------------------------------------------
def _gathered(group, *tensors):
  objs = [None] * dist.get_world_size(group)
  dist.all_gather_object(objs, tuple(t.cpu() if t is not None else None for t in tensors),
                         group=group)
  return objs


def emu_dispatch(x, idx, wts, w1, *, max_rows, group=None, out_dtype=None, w_layout="nk",
                 algo="auto", out=None):
  me, allv = dist.get_rank(group), _gathered(group, x, idx, wts)
  L, H = w1.shape[0], x.shape[1]
  w = w1 if w_layout == "nk" else w1.transpose(1, 2)
  od = out_dtype or x.dtype
  if out is None:
    e = torch.empty
    out = mkernel.MoeDispatchResult(e(max_rows, H, dtype=x.dtype), e(max_rows, w.shape[1],
                                                                      dtype=od),
                                    e(L, dtype=torch.int32), e(L + 1, dtype=torch.int32),
                                    e(max_rows, 3, dtype=torch.int32),
                                    e(max_rows) if wts is not None else None)
  row = 0
  for le in range(L):
    out.expert_offset[le] = row
    n = 0
    for s, (xs, ids, ws) in enumerate(allv):
      for t, j in (ids == me * L + le).nonzero().tolist():
        out.x_recv[row + n] = xs[t]
        out.row_source[row + n] = torch.tensor([s, t, j], dtype=torch.int32)
        if out.row_weight is not None:
          out.row_weight[row + n] = ws[t, j]
        n += 1
    out.expert_count[le] = n
    out.y[row:row + n] = (out.x_recv[row:row + n].float() @ w[le].float().t()).to(od)
    pad = (n + ALIGN - 1) // ALIGN * ALIGN
    out.row_source[row + n:row + pad] = -1
    row += pad
  out.expert_offset[L] = row
  assert row <= max_rows
  fault = os.environ.get("MK_MOE_FAULT", "")
  if me == 2 and out.expert_count[0] >= 2:
    if fault == "row_order":  # two rows of expert 0 swapped, with their sources
      for t in (out.x_recv, out.row_source, out.row_weight):
        t[[0, 1]] = t[[1, 0]]
    elif fault == "y_ulp":  # one element of y a few steps off
      out.y[1, 3] = out.y[1, 3].float() * (1 + 8 * STEP[od])
    elif fault == "padding":  # a padding row's source not -1
      out.row_source[int(out.expert_count[0])] = 0
  return out


def emu_ffn(x, idx, wts, w1, w2, *, max_rows=None, group=None, out_dtype=None, w_layout="nk",
            algo="auto", buffers=None, out=None):
  allw, me = _gathered(group, w1, w2), dist.get_rank(group)
  fault = os.environ.get("MK_MOE_FAULT", "")
  L, H = w1.shape[0], x.shape[1]
  y = torch.zeros(x.shape[0], H)
  for j in range(idx.shape[1]):  # slot order
    for e in idx[:, j].unique().tolist():
      if e < 0:
        continue
      a, b = allw[e // L]
      a, b = (a[e % L], b[e % L]) if w_layout == "nk" else (a[e % L].t(), b[e % L].t())
      m = idx[:, j] == e
      h = (x[m].float() @ a.float().t()).to(x.dtype).float()
      I = h.shape[1] // 2
      act = (F.silu(h[:, :I]) * h[:, I:]).to(x.dtype).float()
      wj = wts[m, j:j + 1].clone()
      if fault == "weight" and j == 0 and me == 2:  # one token's first slot weighted 2% more
        wj[0] *= 1.02
      if fault == "drop_slot" and j == 1 and me == 2:  # one token's slot 1 left out
        wj[0] = 0
      y[m] += wj * (act @ b.float().t()).to(x.dtype).float()  # out rounded, as the combine takes it
  y = y.to(out_dtype or x.dtype)
  if out is not None:
    out.copy_(y)
    return out
  return y


def main():
  variant = os.environ.get("MK_TORCH_VARIANT", "")
  ctx = Ctx("test_moe" + ("[%s]" % variant if variant else ""))
  rep = ctx.report
  if ctx.rank == 0 and os.environ.get("MKERNEL_EMULATE_NODES"):
    # Virtual nodes: the AllToAll path, and the kernel across nodes (xnode.cu) with algo fused
    # and, for the layer with w1 [N,K] and the SwiGLU epilogue, with auto.
    log("[%s] MKERNEL_EMULATE_NODES=%s" % (ctx.test, os.environ["MKERNEL_EMULATE_NODES"]))
  torch.backends.cuda.matmul.allow_tf32 = False
  if ctx.device.type != "cuda":
    CALLS.update(dispatch=emu_dispatch, ffn=emu_ffn, buffers=lambda *a, **k: None)
    log("[test_moe] CPU self-check: stand-ins of the MoE calls (checks the test, not mkernel)")
  if rep.run("probe", test_probe, ctx):
    run_tests(ctx, (test_dispatch, test_ffn, test_back_to_back, test_subgroups, test_cuda_graph,
                    test_errors))
  rep.run("no_call_reaches_real_libnccl", nccl_binding_check, rep)
  ctx.finish()


if __name__ == "__main__":
  main()
