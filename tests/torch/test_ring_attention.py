"""mkernel.ring_attention (ncclRingAttention) under torchrun.

torchrun --nproc-per-node=4 tests/torch/test_ring_attention.py   (LD_PRELOAD=libmkernel.so; the
ranks may share one GPU; MKERNEL_EMULATE_NODES=2 splits them into 2 virtual nodes; the runner:
scripts/run_torch_tests.sh <build> ring_attention ring_attention_vnodes)

Each case draws a whole sequence q, k, v [B, n*S, H, D] from a seed (every rank the same) and
gives rank r its slice in the case's layout (contiguous: a narrow; zigzag: mkernel.zigzag_split).
The reference is plain torch: k and v gathered with all_gather_into_tensor (checked against the
seeded sequence), then softmax attention in fp32 (TF32 off) with an explicit mask built from the
global positions of the queries and keys (causal: key position <= query position), grouped-query
heads by repeat_interleave. out and lse are poisoned first and compared element by element:
  * lse [B, Hq, S] within e_s + 2^-22 (keys + max|x|) + 2^-21 |lse|, where e_s = scale D 2^-22
    max_j |q|.|k_j| bounds the fp32 score sums (D terms) and the rest the softmax sums, exp2 and
    log; one key too many or too few moves lse by its probability, far above this;
  * out within (2 eps + keys 2^-22 + 2 e_s) A + eps |ref|, A = sum_j p_j |v_j| (eps = 2u of the
    input type): P is rounded to the input type before P.V and out rounded once.
Cases: causal or not x contiguous or zigzag x GQA 1 or 4 x D 64 or 128 (bf16 and fp16, S_local
not a multiple of 64, algo auto / sequential / fused, given and default scale), GQA 8, D 256,
peaked scores; a second call allocating out bit-identical to the first; calls back to back;
subgroups [0,1],[2,3]; a CUDA graph replayed with new inputs; clear errors (and a call refused
by the C library, after which the communicator still works); no NCCL symbol bound to the real
libnccl.

Without a GPU, PYTHON=/usr/bin/python3 tests/torch/cpu_selfcheck.sh test_ring_attention.py runs
this file with gloo and a blockwise online-softmax stand-in of the call (all_gather_object, P
rounded as the kernel does): a check of the reference and tolerances, not of mkernel.
MK_ATTN_FAULT=diag|gqa|zigzag|scale|lse2|drop|pv makes the stand-in wrong on rank 2 to see the
checks catch it.
"""

import math
import os
import sys

import torch
import torch.distributed as dist

from mk_common import (EPS, Ctx, Shifted, check_preloaded_library, compare, expect_raises, log,
                       make_input, nccl_binding_check, pair_group, poison_like, probe_layout,
                       run_tests, skip_without_cuda, world_comm)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import mkernel  # noqa: E402  (the package of this source tree)
from mkernel import _attention  # noqa: E402

DT = {"bf16": torch.bfloat16, "fp16": torch.float16}
CALLS = {"ring": mkernel.ring_attention}


def _grid():
  """causal x layout x GQA (1, 4) x D (64, 128); dtype, S_local, algo and scale rotate."""
  out, i = [], 0
  for causal in (False, True):
    for layout in ("contiguous", "zigzag"):
      for g in (1, 4):
        for D in (64, 128):
          S = (96, 130, 72, 200, 128, 66)[i % 6]  # zigzag: even; mostly not multiples of 64
          Hkv = 2 if g == 4 else (4, 8)[i % 2]
          out.append(dict(B=1 + i % 2, S=S, Hq=Hkv * g, Hkv=Hkv, D=D,
                          dt=("bf16", "fp16")[i % 3 == 2], causal=causal, layout=layout,
                          algo=("auto", "sequential", "fused")[i % 3],
                          scale=(None, None, 0.3)[i % 3]))
          i += 1
  return out


CASES = _grid() + [
    dict(B=1, S=128, Hq=16, Hkv=2, D=128, dt="bf16", causal=True, layout="zigzag", algo="auto",
         scale=None),  # GQA 8
    dict(B=1, S=64, Hq=4, Hkv=2, D=256, dt="bf16", causal=True, layout="contiguous",
         algo="auto", scale=None),
    dict(B=1, S=64, Hq=4, Hkv=2, D=256, dt="fp16", causal=False, layout="zigzag", algo="auto",
         scale=None),
    dict(B=2, S=100, Hq=8, Hkv=8, D=128, dt="bf16", causal=True, layout="zigzag", algo="auto",
         scale=None, peak=6.0),  # large scores: the running max matters
]


def case_name(c):
  return "B%d_S%d_Hq%d_Hkv%d_D%d_%s_%s_%s_%s%s%s" % (
      c["B"], c["S"], c["Hq"], c["Hkv"], c["D"], c["dt"], "causal" if c["causal"] else "full",
      c["layout"], c["algo"], "" if c["scale"] is None else "_scale%g" % c["scale"],
      "_peak%g" % c["peak"] if c.get("peak") else "")


class Case:
  """The whole seeded sequence and this rank's slice of it, on the device."""

  def __init__(self, ctx, tag, c, group=None, granks=None):
    self.c, self.name = c, case_name(c)
    self.granks = list(range(ctx.world)) if granks is None else granks
    self.group, self.n, self.me = group, len(self.granks), self.granks.index(ctx.rank)
    B, S, Hq, Hkv, D, n = c["B"], c["S"], c["Hq"], c["Hkv"], c["D"], self.n
    self.dt = DT[c["dt"]]
    self.scale = c["scale"] if c["scale"] is not None else 1.0 / math.sqrt(D)

    def full(name, H, mult):
      x = make_input(B * n * S * H * D, torch.float32, tag, name) * mult
      return x.to(self.dt).view(B, n * S, H, D)

    self.full = {"q": full("q", Hq, c.get("peak", 1.5)), "k": full("k", Hkv, 1.0),
                 "v": full("v", Hkv, 1.0)}
    self.pos = [mkernel.seq_positions(r, n, S, c["layout"]) for r in range(n)]
    dev = ctx.device
    self.local = {k: self.slice(x, self.me).to(dev) for k, x in self.full.items()}

  def slice(self, x, r):
    if self.c["layout"] == "zigzag":
      return mkernel.zigzag_split(x, r, self.n)
    S = self.c["S"]
    return x.narrow(1, r * S, S).contiguous()

  def call(self, **kw):
    c = self.c
    args = dict(causal=c["causal"], scale=c["scale"], layout=c["layout"], algo=c["algo"],
                group=self.group)
    args.update(kw)
    return CALLS["ring"](self.local["q"], self.local["k"], self.local["v"], **args)


# ---------------------------------------------------------------------------------------------
# Pure-torch reference
# ---------------------------------------------------------------------------------------------
def gather_seq(case, x):
  """all_gather_into_tensor of every rank's [B, S, H, D] slice -> [B, n*S, H, D] in rank order
  (rank j's rows at j*S..), plus the keys' global positions in that order."""
  n = case.n
  g = torch.empty((n * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
  dist.all_gather_into_tensor(g, x.contiguous(), group=case.group)
  g = g.view((n,) + tuple(x.shape)).transpose(0, 1).reshape(x.shape[0], n * x.shape[1],
                                                            *x.shape[2:])
  return g, torch.cat(case.pos).to(x.device)


def reference(case, rep, name):
  """(out [B, S, Hq, D], lse [B, Hq, S], tol_out, tol_lse), fp32, of this rank's queries."""
  c, dev = case.c, case.local["q"].device
  kg, kpos = gather_seq(case, case.local["k"])
  vg, _ = gather_seq(case, case.local["v"])
  order = torch.argsort(kpos.cpu())
  for what, g in (("k", kg), ("v", vg)):
    same = torch.equal(g[:, order.to(dev)].cpu().view(torch.int16),
                       case.full[what].view(torch.int16))
    rep.check(name + "/reference_gathered_%s_is_the_seeded_sequence" % what, same, "")
  gq = c["Hq"] // c["Hkv"]
  q = case.local["q"].float().transpose(1, 2)  # [B, Hq, S, D]
  k = kg.float().transpose(1, 2).repeat_interleave(gq, dim=1)  # [B, Hq, nS, D]
  v = vg.float().transpose(1, 2).repeat_interleave(gq, dim=1)
  qpos = case.pos[case.me].to(dev)
  allowed = (kpos[None, :] <= qpos[:, None]) if c["causal"] else torch.ones(
      len(qpos), len(kpos), dtype=torch.bool, device=dev)
  s = (q @ k.transpose(-1, -2)) * case.scale
  s = s.masked_fill(~allowed, float("-inf"))
  lse = torch.logsumexp(s, dim=-1)
  p = torch.exp(s - lse[..., None])
  out = p @ v
  # Bounds (see the module doc).
  qk = (q.abs() @ k.abs().transpose(-1, -2)).masked_fill(~allowed, 0)
  e_s = case.scale * c["D"] * 2.0**-22 * qk.amax(-1)
  keys = allowed.sum(-1).to(torch.float32)
  xmax = (s.masked_fill(~allowed, 0).abs().amax(-1))
  tol_lse = e_s + 2.0**-22 * (keys + xmax) + 2.0**-21 * lse.abs() + 1e-7
  eps = EPS[case.dt]
  A = p @ v.abs()
  tol_out = (2 * eps + keys[..., None] * 2.0**-22 + 2 * e_s[..., None]) * A + eps * out.abs()
  return (out.transpose(1, 2), lse, tol_out.transpose(1, 2) + 1e-30, tol_lse)


def check(rep, name, case, out, lse):
  ref, ref_lse, tol, tol_lse = reference(case, rep, name)
  ok, det = compare(out, ref.double().cpu(), tol.double().cpu())
  rep.check(name + "/out", ok, det)
  if lse is not None:
    ok, det = compare(lse, ref_lse.double().cpu(), tol_lse.double().cpu())
    rep.check(name + "/lse", ok, det)


def poisoned(case):
  c, dev = case.c, case.local["q"].device
  out = poison_like(torch.empty(c["B"], c["S"], c["Hq"], c["D"], dtype=case.dt, device=dev))
  lse = poison_like(torch.empty(c["B"], c["Hq"], c["S"], dtype=torch.float32, device=dev))
  return out, lse


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------
def test_probe(ctx):
  """One small call: this layout (processes, GPUs) must be one the library runs."""
  case = Case(ctx, "probe", CASES[0])
  ok, res = probe_layout(ctx, "ring_attention_runs_in_this_layout",
                         lambda: case.call(return_lse=True))
  if ok:
    check(ctx.report, "probe", case, *res)
  return ok


def test_cases(ctx):
  rep = ctx.report
  for i, c in enumerate(CASES):
    case = Case(ctx, ("case", i), c)
    out, lse = poisoned(case)
    got, got_lse = case.call(out=out, lse=lse, return_lse=True)
    torch.cuda.synchronize()
    rep.check(case.name + "/returns_out_and_lse", got is out and got_lse is lse, "")
    check(rep, case.name, case, out, lse)
    if i % 4 == 0:  # allocated out, no lse: the same bits
      again = case.call()
      torch.cuda.synchronize()
      rep.check(case.name + "/allocated_no_lse_bit_identical", torch.equal(again, out), "")


def test_back_to_back(ctx):
  """6 calls of different shapes and options without host synchronisation, checked after."""
  runs = []
  for i in range(6):
    case = Case(ctx, ("b2b", i), CASES[(5 * i + 3) % len(CASES)])
    runs.append((case,) + tuple(case.call(return_lse=True)))
  torch.cuda.synchronize()
  for i, (case, out, lse) in enumerate(runs):
    check(ctx.report, "back_to_back_6/%d_%s" % (i, case.name), case, out, lse)


def test_subgroups(ctx):
  rep = ctx.report
  pair = pair_group(ctx)
  if pair is None:
    return
  group, first = pair
  for i in (2, 13):  # the sequence of each pair is its own: positions 0 .. 2*S-1
    case = Case(ctx, ("sub", first, i), CASES[i], group=group,
                granks=[first, first + 1])
    out, lse = case.call(return_lse=True)
    torch.cuda.synchronize()
    check(rep, "subgroup_pairs/" + case.name, case, out, lse)


def test_cuda_graph(ctx):
  rep = ctx.report
  if skip_without_cuda(ctx, "cuda_graph"):
    return
  c = dict(CASES[11], algo="auto")
  cases = [Case(ctx, ("graph", i), c) for i in range(3)]
  q, k, v = (cases[0].local[x].clone() for x in "qkv")
  out, lse = poisoned(cases[0])
  call = lambda: mkernel.ring_attention(q, k, v, causal=c["causal"], scale=c["scale"],  # noqa
                                        layout=c["layout"], out=out, lse=lse)
  s = torch.cuda.Stream()
  s.wait_stream(torch.cuda.current_stream())
  with torch.cuda.stream(s):  # the first call on a communicator is not capturable
    call()
  torch.cuda.current_stream().wait_stream(s)
  torch.cuda.synchronize()
  check(rep, "cuda_graph/eager", cases[0], out, lse)
  g = torch.cuda.CUDAGraph()
  with torch.cuda.graph(g):
    call()
  for case in cases[1:]:
    for x, t in zip("qkv", (q, k, v)):
      t.copy_(case.local[x])
    poison_like(out)
    poison_like(lse)
    g.replay()
    torch.cuda.synchronize()
    check(rep, "cuda_graph/replay_new_inputs", case, out, lse)


def test_errors(ctx):
  rep = ctx.report
  if skip_without_cuda(ctx, "errors"):
    return
  case = Case(ctx, "errors", CASES[1])
  q, k, v = (case.local[x] for x in "qkv")

  def raises(name, exc, text, fn):
    expect_raises(rep, name, exc, text, fn)

  ra = mkernel.ring_attention
  raises("errors/cpu_tensor", ValueError, "CUDA tensors", lambda: ra(q.cpu(), k, v))
  raises("errors/fp32", TypeError, "q has dtype float32", lambda: ra(q.float(), k, v))
  raises("errors/head_dim_96", ValueError, "D=96 unsupported",
         lambda: ra(q[..., :96].contiguous(), k[..., :96].contiguous(), v[..., :96].contiguous()))
  raises("errors/gqa_ratio", ValueError, "multiple of Hkv",
         lambda: ra(q[:, :, :3].contiguous(), k, v))
  raises("errors/zigzag_odd", ValueError, "must be even with layout='zigzag'",
         lambda: ra(q[:, :-1].contiguous(), k[:, :-1].contiguous(), v[:, :-1].contiguous(),
                    layout="zigzag"))
  raises("errors/non_contiguous", ValueError, "must be contiguous",
         lambda: ra(q.transpose(1, 2), k, v))
  gloo = dist.new_group(backend="gloo")
  raises("errors/gloo_group", mkernel.MkernelError, "CUDA backend",
         lambda: ra(q, k, v, group=gloo))

  lib, comm = world_comm(ctx)
  p = _attention.plan(q, k, v, ctx.world)
  out = torch.empty_like(q)
  stream = torch.cuda.current_stream().cuda_stream
  raises("errors/refused_by_c_library_with_message", mkernel.MkernelError, "16-byte aligned",
         lambda: _attention.invoke(lib, p, Shifted(q), k, v, out, None, comm, stream))
  out, lse = case.call(return_lse=True)
  torch.cuda.synchronize()
  check(rep, "errors/comm_usable_after_refused_call", case, out, lse)
  check_preloaded_library(rep, lib)


# ---------------------------------------------------------------------------------------------
# CPU self-check: a blockwise online-softmax stand-in built from all_gather_object
# ---------------------------------------------------------------------------------------------
def emu_ring_attention(q, k, v, causal=False, scale=None, layout="contiguous", group=None,
                       algo="auto", comm_sms=-1, return_lse=False, out=None, lse=None):
  n, me = dist.get_world_size(group), dist.get_rank(group)
  objs = [None] * n
  dist.all_gather_object(objs, (k.cpu(), v.cpu()), group=group)
  fault = os.environ.get("MK_ATTN_FAULT", "") if me == 2 else ""
  B, S, Hq, D = q.shape
  Hkv = k.shape[2]
  sc = scale if scale is not None else 1.0 / math.sqrt(D)
  if fault == "scale":
    sc *= 1 + 2.0**-8
  lay = "contiguous" if fault == "zigzag" else layout
  qpos = torch.tensor(_attention.positions(me, n, S, lay))
  heads = torch.arange(Hq) % Hkv if fault == "gqa" else torch.arange(Hq) // (Hq // Hkv)
  qf = q.float().transpose(1, 2)  # [B, Hq, S, D]
  m = torch.full((B, Hq, S), float("-inf"))
  l = torch.zeros(B, Hq, S)
  acc = torch.zeros(B, Hq, S, D)
  for j in range(n):  # rank order, blocks of 64 keys
    kj, vj = objs[j]
    kpos = torch.tensor(_attention.positions(j, n, S, layout))
    for b0 in range(0, S, 64):
      kb = kj[:, b0:b0 + 64].float().transpose(1, 2)[:, heads]  # [B, Hq, kb, D]
      vb = vj[:, b0:b0 + 64].float().transpose(1, 2)[:, heads]
      if fault == "drop" and j == n - 1 and b0 + 64 >= S:
        kb, vb, kp = kb[:, :, :-1], vb[:, :, :-1], kpos[b0:b0 + 64][:-1]
      else:
        kp = kpos[b0:b0 + 64]
      s = (qf @ kb.transpose(-1, -2)) * sc
      if causal:
        ok = (kp[None, :] < qpos[:, None]) if fault == "diag" else (kp[None, :] <= qpos[:, None])
        s = s.masked_fill(~ok, float("-inf"))
      m_new = torch.maximum(m, s.amax(-1))
      base = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
      p = torch.exp(s - base[..., None])
      alpha = torch.exp(m - base)
      l = l * alpha + p.sum(-1)
      pv = p.to(q.dtype).float() if fault != "pv" else p.to(q.dtype).float() * (1 + 2.0**-5)
      acc = acc * alpha[..., None] + pv @ vb
      m = m_new
  res = (acc / l[..., None]).transpose(1, 2).to(q.dtype)
  lse_v = m + torch.log(l)
  if fault == "lse2":
    lse_v = lse_v / math.log(2)
  if out is None:
    out = res
  else:
    out.copy_(res)
  if lse is not None:
    lse.copy_(lse_v)
  elif return_lse:
    lse = lse_v
  return (out, lse) if return_lse else out


def main():
  variant = os.environ.get("MK_TORCH_VARIANT", "")
  ctx = Ctx("test_ring_attention" + ("[%s]" % variant if variant else ""))
  rep = ctx.report
  if ctx.rank == 0:
    log("[%s] MKERNEL_EMULATE_NODES=%s" % (ctx.test, os.environ.get("MKERNEL_EMULATE_NODES", "")))
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  if ctx.device.type != "cuda":
    CALLS["ring"] = emu_ring_attention
    log("[test_ring_attention] CPU self-check: a stand-in of the call (checks the test, not "
        "mkernel)")
  if rep.run("probe", test_probe, ctx):
    run_tests(ctx, (test_cases, test_back_to_back, test_subgroups, test_cuda_graph,
                    test_errors))
  rep.run("no_call_reaches_real_libnccl", nccl_binding_check, rep)
  ctx.finish()


if __name__ == "__main__":
  main()
