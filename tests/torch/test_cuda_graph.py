"""Collectives captured in CUDA graphs by PyTorch, through LD_PRELOAD=libmkernel.so.

torchrun --nproc-per-node=4 tests/torch/test_cuda_graph.py   (all ranks may share one GPU)

Graph A: all_reduce SUM (float32), all_reduce MAX (bfloat16), all_gather_into_tensor (int64) and
reduce_scatter_tensor SUM (float32), captured once and replayed 5 times with fresh inputs copied
in before each replay (the captured kernels run with the same arguments every time, so the
library must not rely on host-side per-call state such as sequence numbers set at enqueue).
Graph B: 8 copies + 8 all_reduces on separate buffers, replayed 10 times back to back without
host synchronisation; the buffers are checked after the last replay.
"""

import torch
import torch.distributed as dist

from mk_common import Ctx, compare, make_input, poison_like, sum_tolerance, nccl_binding_check

N = 65537


def sum_ref(xs, dtype):
  if not dtype.is_floating_point:
    return torch.stack(xs).sum(0), None
  x64 = torch.stack([x.to(torch.float64) for x in xs])
  ref = x64.sum(0)
  return ref, sum_tolerance(dtype, x64.abs().sum(0), len(xs) + 1, ref)


def inputs(ctx, n, dtype, *tag):
  return [make_input(n, dtype, *tag, r) for r in range(ctx.world)]


def warmup(ctx, fn):
  s = torch.cuda.Stream()
  s.wait_stream(torch.cuda.current_stream())
  with torch.cuda.stream(s):
    fn()
  torch.cuda.current_stream().wait_stream(s)
  torch.cuda.synchronize()


def test_graph_a(ctx):
  rep, w, dev = ctx.report, ctx.world, ctx.device
  a = torch.empty(N, dtype=torch.float32, device=dev)
  b = torch.empty(N, dtype=torch.bfloat16, device=dev)
  c_in = torch.empty(N, dtype=torch.int64, device=dev)
  c_out = torch.empty(N * w, dtype=torch.int64, device=dev)
  d_in = torch.empty(N * w, dtype=torch.float32, device=dev)
  d_out = torch.empty(N, dtype=torch.float32, device=dev)

  def body():
    dist.all_reduce(a)
    dist.all_reduce(b, op=dist.ReduceOp.MAX)
    dist.all_gather_into_tensor(c_out, c_in)
    dist.reduce_scatter_tensor(d_out, d_in)

  for t in (a, b, c_in, d_in):
    t.zero_()
  warmup(ctx, body)
  g = torch.cuda.CUDAGraph()
  with torch.cuda.graph(g):
    body()
  torch.cuda.synchronize()
  rep.ok("graph_a/capture", "4 collectives captured")

  mine = slice(ctx.rank * N, (ctx.rank + 1) * N)
  for it in range(5):
    xa = inputs(ctx, N, torch.float32, "ga", it)
    xb = inputs(ctx, N, torch.bfloat16, "gb", it)
    xc = inputs(ctx, N, torch.int64, "gc", it)
    xd = inputs(ctx, N * w, torch.float32, "gd", it)
    a.copy_(xa[ctx.rank])
    b.copy_(xb[ctx.rank])
    c_in.copy_(xc[ctx.rank])
    d_in.copy_(xd[ctx.rank])
    poison_like(c_out)
    poison_like(d_out)
    g.replay()
    torch.cuda.synchronize()
    ref, tol = sum_ref(xa, torch.float32)
    ok, det = compare(a, ref, tol)
    rep.check("graph_a/all_reduce_sum/float32", ok, "replay %d: %s" % (it, det))
    ref = torch.stack([x.to(torch.float64) for x in xb]).max(0).values
    ok, det = compare(b, ref)
    rep.check("graph_a/all_reduce_max/bfloat16", ok, "replay %d: %s" % (it, det))
    ok, det = compare(c_out, torch.cat(xc))
    rep.check("graph_a/all_gather_into_tensor/int64", ok, "replay %d: %s" % (it, det))
    ref, tol = sum_ref([x[mine] for x in xd], torch.float32)
    ok, det = compare(d_out, ref, tol)
    rep.check("graph_a/reduce_scatter_tensor_sum/float32", ok, "replay %d: %s" % (it, det))


def test_graph_b(ctx):
  rep, dev = ctx.report, ctx.device
  sizes = [1, 31, 1024, 4097, 65536, 7, 262147, 100]
  xs = [inputs(ctx, n, torch.float32, "gbb", i) for i, n in enumerate(sizes)]
  srcs = [x[ctx.rank].to(dev) for x in xs]
  bufs = [torch.empty(n, dtype=torch.float32, device=dev) for n in sizes]

  def body():
    for s, b in zip(srcs, bufs):
      b.copy_(s)
      dist.all_reduce(b)

  warmup(ctx, body)
  g = torch.cuda.CUDAGraph()
  with torch.cuda.graph(g):
    body()
  for b in bufs:
    poison_like(b)
  for _ in range(10):
    g.replay()
  torch.cuda.synchronize()
  for i, (b, x) in enumerate(zip(bufs, xs)):
    ref, tol = sum_ref(x, torch.float32)
    ok, det = compare(b, ref, tol)
    rep.check("graph_b/8_all_reduces_x10_replays_back_to_back", ok, "buffer %d (n=%d): %s" %
              (i, sizes[i], det))


def main():
  ctx = Ctx("test_cuda_graph")
  rep = ctx.report
  rep.run("graph_a", test_graph_a, ctx)
  rep.run("graph_b", test_graph_b, ctx)
  rep.run("no_call_reaches_real_libnccl", nccl_binding_check, rep, require=("ncclAllReduce",))
  ctx.finish()


if __name__ == "__main__":
  main()
