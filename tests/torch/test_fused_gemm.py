"""The Python package (python/mkernel) on torch tensors, through LD_PRELOAD=libmkernel.so.

torchrun --nproc-per-node=4 tests/torch/test_fused_gemm.py    (all ranks may share one GPU;
MKERNEL_EMULATE_NODES=2 splits them into 2 virtual nodes of 2; MK_TORCH_VARIANT names the run)

gemm_all_reduce / all_gather_gemm / gemm_reduce_scatter on the default group's communicator
(mkernel's, borrowed from ProcessGroupNCCL), for bf16 and fp16 inputs, both B layouts, bf16/fp16
/fp32 outputs, with and without bias, shapes with tails in M, N and K, algo auto / fused /
sequential. Every result (poisoned first) is compared element by element with
  * an fp64 reference built on each rank from every rank's seeded inputs (independent of
    mkernel), tolerance per element (see tolerance()): (n+1) eps_out T + eps_out |ref| +
    K 2^-22 S with T = sum_r |A_r B_r| + |bias|, S = sum_r |A_r| |B_r|, eps_out = 2u;
  * torch.distributed (all_reduce / all_gather_into_tensor / reduce_scatter_tensor, fp32) +
    torch.matmul, with twice that tolerance.
Also: gemm_all_reduce bit-identical on every rank and from run to run; the gathered A exact,
in place too; a side stream; 12 calls back to back; subgroups [0,1],[2,3]; a CUDA graph
replayed with new inputs; clear errors (CPU tensors, a gloo group, a call the C library refuses,
after which the communicator still works); no NCCL symbol bound to the real libnccl.
"""

import os
import sys

import torch
import torch.distributed as dist

from mk_common import (EPS, Ctx, Shifted, check_preloaded_library, compare, expect_raises, log,
                       make_input, nccl_binding_check, pair_group, poison_like, run_tests,
                       world_comm)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import mkernel  # noqa: E402  (the package of this source tree)
from mkernel import _plan  # noqa: E402

OPS = {"ar": mkernel.gemm_all_reduce, "ag": mkernel.all_gather_gemm,
       "rs": mkernel.gemm_reduce_scatter}
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# (op, M, N, K, in, layout, out, bias, algo). M is the total row count (a multiple of the world
# size is made of it for ag/rs).
CASES = [
    ("ar", 256, 512, 1024, "bf16", "nk", None, False, "auto"),
    ("ar", 300, 200, 136, "bf16", "nk", "fp32", True, "sequential"),
    ("ar", 129, 264, 520, "fp16", "kn", None, True, "fused"),
    ("ar", 1024, 1024, 1024, "bf16", "nk", None, False, "fused"),
    ("ar", 64, 72, 8, "bf16", "kn", "fp16", False, "auto"),
    ("ag", 256, 512, 1024, "bf16", "nk", None, False, "auto"),
    ("ag", 300, 200, 136, "bf16", "kn", "fp32", True, "fused"),
    ("ag", 1024, 128, 1024, "fp16", "nk", None, True, "sequential"),
    ("ag", 2048, 128, 2048, "bf16", "nk", None, False, "fused"),
    ("rs", 256, 512, 1024, "bf16", "nk", None, False, "auto"),
    ("rs", 300, 200, 136, "fp16", "kn", "fp32", True, "fused"),
    ("rs", 1024, 1024, 1024, "bf16", "nk", None, True, "sequential"),
]


def rows_for(op, M, world):
  return M if op == "ar" else (M + world - 1) // world * world


class Inputs:
  """Every rank's A_r and B_r (seeded, so each rank can rebuild them all), on the device."""

  def __init__(self, ctx, tag, op, M, N, K, dt, layout, out_dt, with_bias, ranks=None):
    self.ranks = list(range(ctx.world)) if ranks is None else ranks
    n = len(self.ranks)
    self.op, self.M, self.N, self.K = op, M, N, K
    arows = M // n if op == "ag" else M
    dev = ctx.device
    self.A = [make_input(arows * K, dt, tag, "A", r).view(arows, K).to(dev) for r in self.ranks]
    bshape = (N, K) if layout == "nk" else (K, N)
    # Scaled so that sums over K stay well inside fp16's range.
    self.B = [(make_input(N * K, torch.float32, tag, "B", r) * 0.25).to(dt).view(*bshape).to(dev)
              for r in self.ranks]
    self.layout = layout
    self.bias = make_input(N, out_dt, tag, "bias").to(dev) if with_bias else None
    me = self.ranks.index(ctx.rank)
    self.me = me
    self.a, self.b = self.A[me], self.B[me]

  def bt(self, B, dtype):
    """B as [K, N] in dtype."""
    B = B.to(dtype)
    return B.t() if self.layout == "nk" else B

  def reference(self):
    """fp64 result of this rank and the tolerance of each of its elements."""
    f64 = torch.float64
    if self.op == "ag":
      A = torch.cat(self.A).to(f64)
      B = self.bt(self.B[self.me], f64)
      prods, S = [A @ B], A.abs() @ B.abs()
    else:
      prods = [a.to(f64) @ self.bt(b, f64) for a, b in zip(self.A, self.B)]
      S = sum(a.to(f64).abs() @ self.bt(b, f64).abs() for a, b in zip(self.A, self.B))
      if self.op == "rs":
        rows = self.M // len(self.ranks)
        sl = slice(self.me * rows, (self.me + 1) * rows)
        prods, S = [p[sl] for p in prods], S[sl]
    ref = sum(prods)
    T = sum(p.abs() for p in prods)
    if self.bias is not None:
      ref = ref + self.bias.to(f64)
      T = T + self.bias.to(f64).abs()
    return ref, T, S


def tolerance(x, ref, T, S, out_dt):
  """Per element: every rounding to the output type (each rank's product, each partial sum of
  the reduction, the bias) is at most eps_out times a partial result bounded by
  T = sum_r |A_r B_r| + |bias|; fp32 accumulation over K adds at most K 2^-22 sum_r |A_r||B_r|.
  It scales with the products, not with sum |a||b|, so a missing or wrong contribution (about
  |A_r B_r|) cannot hide in it."""
  n = 1 if x.op == "ag" else len(x.ranks)
  return (n + 1) * EPS[out_dt] * T + EPS[out_dt] * ref.abs() + x.K * 2.0**-22 * S + 1e-30


def dist_reference(x, group=None):
  """torch.distributed + torch.matmul, in fp32."""
  bt = x.bt(x.b, torch.float32)
  if x.op == "ar":
    c = x.a.float() @ bt
    dist.all_reduce(c, group=group)
  elif x.op == "ag":
    full = torch.empty(x.M, x.K, dtype=x.a.dtype, device=x.a.device)
    dist.all_gather_into_tensor(full, x.a, group=group)
    c = full.float() @ bt
  else:
    p = x.a.float() @ bt
    c = torch.empty(x.M // len(x.ranks), x.N, dtype=torch.float32, device=x.a.device)
    dist.reduce_scatter_tensor(c, p, group=group)
  if x.bias is not None:
    c = c + x.bias.float()
  return c


def check_result(rep, name, got, x, out_dt, group=None):
  ref, T, S = x.reference()
  tol = tolerance(x, ref, T, S, out_dt)
  ok, det = compare(got, ref.cpu(), tol.cpu())
  rep.check(name + "/vs_fp64", ok, det)
  dref = dist_reference(x, group)
  ok2, det2 = compare(got, dref.to(torch.float64).cpu(), (2 * tol).cpu())
  rep.check(name + "/vs_torch_distributed", ok2, det2)
  return ok and ok2


def same_on_all_ranks(t, group=None):
  """True when every rank of group holds the same bytes in t."""
  flat = t.contiguous().view(-1).view(torch.uint8)  # NCCL has no 16-bit integer type
  n = dist.get_world_size(group)
  allv = torch.empty(n * flat.numel(), dtype=flat.dtype, device=flat.device)
  dist.all_gather_into_tensor(allv, flat, group=group)
  return all(torch.equal(allv[i * flat.numel():(i + 1) * flat.numel()], flat) for i in range(n))


# ---------------------------------------------------------------------------------------------
def test_cases(ctx):
  rep = ctx.report
  for i, (op, M, N, K, din, layout, dout, with_bias, algo) in enumerate(CASES):
    M = rows_for(op, M, ctx.world)
    dt, out_dt = DT[din], DT[dout or din]
    name = "%s/%dx%dx%d/%s/%s/out_%s%s/%s" % (op, M, N, K, din, layout, dout or din,
                                              "/bias" if with_bias else "", algo)
    x = Inputs(ctx, ("case", i), op, M, N, K, dt, layout, out_dt, with_bias)
    kw = dict(bias=x.bias, b_layout=layout, algo=algo, out_dtype=DT[dout] if dout else None)
    shape = (M // ctx.world if op == "rs" else M, N)
    out = poison_like(torch.empty(shape, dtype=out_dt, device=ctx.device))
    gathered = None
    if op == "ag":
      gathered = poison_like(torch.empty(M, K, dtype=dt, device=ctx.device))
      kw["gathered"] = gathered
    res = OPS[op](x.a, x.b, out=out, **kw)
    torch.cuda.synchronize()
    rep.check(name + "/returns_out", res is out, "the function returns its out tensor")
    check_result(rep, name, out, x, out_dt)
    if gathered is not None:
      ok, det = compare(gathered, torch.cat(x.A).to(torch.float64).cpu())
      rep.check(name + "/gathered_exact", ok, det)
    if op == "ar":
      again = OPS[op](x.a, x.b, **kw)  # allocated out, second run
      torch.cuda.synchronize()
      rep.check(name + "/run_to_run_bit_identical", torch.equal(again, out), "")
      rep.check(name + "/bit_identical_on_all_ranks", same_on_all_ranks(out), "")


def test_in_place_gather_and_side_stream(ctx):
  rep = ctx.report
  M, N, K = rows_for("ag", 512, ctx.world), 256, 512
  x = Inputs(ctx, "inplace", "ag", M, N, K, torch.bfloat16, "nk", torch.bfloat16, False)
  rows = M // ctx.world
  gathered = poison_like(torch.empty(M, K, dtype=torch.bfloat16, device=ctx.device))
  shard = gathered[ctx.rank * rows:(ctx.rank + 1) * rows]
  shard.copy_(x.a)
  s = torch.cuda.Stream()
  s.wait_stream(torch.cuda.current_stream())
  with torch.cuda.stream(s):
    out = mkernel.all_gather_gemm(shard, x.b, gathered=gathered)
  torch.cuda.current_stream().wait_stream(s)
  torch.cuda.synchronize()
  check_result(rep, "ag/in_place_on_side_stream", out, x, torch.bfloat16)
  ok, det = compare(gathered, torch.cat(x.A).to(torch.float64).cpu())
  rep.check("ag/in_place_on_side_stream/gathered_exact", ok, det)


def test_back_to_back(ctx):
  """12 calls (all three ops) without host synchronisation, checked afterwards."""
  rep = ctx.report
  calls = []
  for i in range(12):
    op = ("ar", "ag", "rs")[i % 3]
    M = rows_for(op, 192 + 8 * i, ctx.world)
    x = Inputs(ctx, ("b2b", i), op, M, 128, 256, torch.bfloat16, "nk", torch.bfloat16, i % 2)
    calls.append((x, OPS[op](x.a, x.b, bias=x.bias)))
  torch.cuda.synchronize()
  for i, (x, out) in enumerate(calls):
    check_result(rep, "back_to_back_12/%s_%d" % (x.op, i), out, x, torch.bfloat16)


def test_subgroups(ctx):
  rep = ctx.report
  pair = pair_group(ctx)
  if pair is None:
    return
  group, mine = pair  # mine: the first rank of this rank's pair
  for op in ("ar", "ag", "rs"):
    x = Inputs(ctx, ("sub", op, mine), op, 256, 192, 256, torch.bfloat16, "nk", torch.bfloat16,
               True, ranks=[mine, mine + 1])
    out = OPS[op](x.a, x.b, group=group, bias=x.bias)
    torch.cuda.synchronize()
    check_result(rep, "subgroup_pairs/%s" % op, out, x, torch.bfloat16, group=group)


def test_cuda_graph(ctx):
  rep = ctx.report
  M, N, K = rows_for("rs", 256, ctx.world), 256, 512
  xs = [Inputs(ctx, ("graph", k), "rs", M, N, K, torch.bfloat16, "nk", torch.bfloat16, False)
        for k in range(4)]
  a, b = xs[0].a.clone(), xs[0].b.clone()
  out = torch.empty(M // ctx.world, N, dtype=torch.bfloat16, device=ctx.device)
  s = torch.cuda.Stream()
  s.wait_stream(torch.cuda.current_stream())
  with torch.cuda.stream(s):  # warm-up outside the capture (lazy setup)
    mkernel.gemm_reduce_scatter(a, b, out=out)
  torch.cuda.current_stream().wait_stream(s)
  torch.cuda.synchronize()
  g = torch.cuda.CUDAGraph()
  with torch.cuda.graph(g):
    mkernel.gemm_reduce_scatter(a, b, out=out)
  for k in range(1, 4):
    a.copy_(xs[k].a)
    b.copy_(xs[k].b)
    poison_like(out)
    g.replay()
    torch.cuda.synchronize()
    check_result(rep, "cuda_graph/gemm_reduce_scatter_replay", out, xs[k], torch.bfloat16)


def test_errors(ctx):
  rep = ctx.report
  a = torch.zeros(64, 64, dtype=torch.bfloat16, device=ctx.device)
  b = torch.zeros(64, 64, dtype=torch.bfloat16, device=ctx.device)

  def raises(name, exc, text, fn):
    expect_raises(rep, name, exc, text, fn)

  raises("errors/cpu_tensor", ValueError, "CUDA tensors",
         lambda: mkernel.gemm_all_reduce(a.cpu(), b.cpu()))
  if ctx.world > 1:
    raises("errors/rs_rows_not_multiple", ValueError, "multiple of the group size",
           lambda: mkernel.gemm_reduce_scatter(a[:ctx.world * 8 + 1], b))
  gloo = dist.new_group(backend="gloo")
  raises("errors/gloo_group", mkernel.MkernelError, "CUDA backend",
         lambda: mkernel.gemm_all_reduce(a, b, group=gloo))

  lib, comm = world_comm(ctx)
  p = _plan.plan("gemm_all_reduce", a, b, ctx.world)
  out = torch.empty(64, 64, dtype=torch.bfloat16, device=ctx.device)
  stream = torch.cuda.current_stream().cuda_stream
  raises("errors/refused_by_c_library_with_message", mkernel.MkernelError, "16-byte aligned",
         lambda: _plan.invoke(lib, p, Shifted(a), b, out, comm, stream))
  # The refused call changed nothing: the communicator still works.
  x = Inputs(ctx, "after_error", "ar", 64, 64, 64, torch.bfloat16, "nk", torch.bfloat16, False)
  res = mkernel.gemm_all_reduce(x.a, x.b)
  torch.cuda.synchronize()
  check_result(rep, "errors/comm_usable_after_refused_call", res, x, torch.bfloat16)
  check_preloaded_library(rep, lib)


def main():
  variant = os.environ.get("MK_TORCH_VARIANT", "")
  ctx = Ctx("test_fused_gemm" + ("[%s]" % variant if variant else ""))
  rep = ctx.report
  if ctx.rank == 0:
    log("[%s] MKERNEL_EMULATE_NODES=%s" % (ctx.test, os.environ.get("MKERNEL_EMULATE_NODES", "")))
  run_tests(ctx, (test_cases, test_in_place_gather_and_side_stream, test_back_to_back,
                  test_subgroups, test_cuda_graph, test_errors))
  rep.run("no_call_reaches_real_libnccl", nccl_binding_check, rep, require=("ncclAllReduce",))
  ctx.finish()


if __name__ == "__main__":
  main()
