"""Point-to-point traffic of ProcessGroupNCCL through LD_PRELOAD=libmkernel.so.

torchrun --nproc-per-node=4 tests/torch/test_p2p.py   (all ranks may share one GPU)

  isend/irecv ring (each rank sends to rank+1, receives from rank-1; torch creates one 2-rank
  communicator per pair for these), the reverse ring, batch_isend_irecv in both directions at once
  (grouped ncclSend/ncclRecv on the main communicator), blocking send/recv pairs, gather, scatter
  and all_to_all with lists of different sizes (grouped send/recv). float32, bfloat16, int64;
  outputs poisoned first; results must be bit-exact copies of the sender's seeded data.
"""

import time

import torch
import torch.distributed as dist

from mk_common import Ctx, compare, make_input, poison_like, nccl_binding_check, log

DTYPES = [torch.float32, torch.bfloat16, torch.int64]
SIZES = [1, 4099, 1 << 20]


def dname(dtype):
  return str(dtype).replace("torch.", "")


def exact(x):
  return x.to(torch.float64) if x.dtype.is_floating_point else x


def empty(ctx, n, dtype):
  return poison_like(torch.empty(n, dtype=dtype, device=ctx.device))


def test_ring(ctx, step, label):
  rep, r, w = ctx.report, ctx.rank, ctx.world
  dst, src = (r + step) % w, (r - step) % w
  for dtype in DTYPES:
    name = "%s/%s" % (label, dname(dtype))
    for n in SIZES:
      x = make_input(n, dtype, label, n, r)
      out = empty(ctx, n, dtype)
      # Unbatched P2P makes torch create a 2-rank communicator per pair on first use, which
      # blocks until the peer joins: even ranks send first and odd ranks receive first, so the
      # pair inits cannot wait on each other in a cycle.
      if r % 2 == 0:
        reqs = [dist.isend(x.to(ctx.device), dst=dst), dist.irecv(out, src=src)]
      else:
        reqs = [dist.irecv(out, src=src), dist.isend(x.to(ctx.device), dst=dst)]
      for q in reqs:
        q.wait()
      torch.cuda.synchronize()
      ok, detail = compare(out, exact(make_input(n, dtype, label, n, src)))
      rep.check(name, ok, "n=%d: %s" % (n, detail))


def test_batch(ctx):
  rep, r, w = ctx.report, ctx.rank, ctx.world
  nxt, prv = (r + 1) % w, (r - 1) % w
  for dtype in DTYPES:
    name = "batch_isend_irecv/both_directions/%s" % dname(dtype)
    for n in SIZES:
      fwd = make_input(n, dtype, "batch_fwd", n, r).to(ctx.device)
      bwd = make_input(n + 3, dtype, "batch_bwd", n, r).to(ctx.device)
      from_prv, from_nxt = empty(ctx, n, dtype), empty(ctx, n + 3, dtype)
      ops = [dist.P2POp(dist.isend, fwd, nxt), dist.P2POp(dist.irecv, from_prv, prv),
             dist.P2POp(dist.isend, bwd, prv), dist.P2POp(dist.irecv, from_nxt, nxt)]
      for q in dist.batch_isend_irecv(ops):
        q.wait()
      torch.cuda.synchronize()
      ok1, d1 = compare(from_prv, exact(make_input(n, dtype, "batch_fwd", n, prv)))
      ok2, d2 = compare(from_nxt, exact(make_input(n + 3, dtype, "batch_bwd", n, nxt)))
      rep.check(name, ok1 and ok2, "n=%d: fwd %s; bwd %s" % (n, d1, d2))


def test_blocking_pairs(ctx):
  """Pairs (0,1), (2,3), ...: the even rank sends then receives, the odd rank the reverse."""
  rep, r, w = ctx.report, ctx.rank, ctx.world
  peer = r ^ 1
  if peer >= w:
    rep.skip("send_recv_blocking_pairs", "odd world size, rank %d has no partner" % r)
    return
  for dtype in DTYPES:
    name = "send_recv_blocking_pairs/%s" % dname(dtype)
    n = 262147
    mine = make_input(n, dtype, "pair", r).to(ctx.device)
    out = empty(ctx, n, dtype)
    if r % 2 == 0:
      dist.send(mine, dst=peer)
      dist.recv(out, src=peer)
    else:
      dist.recv(out, src=peer)
      dist.send(mine, dst=peer)
    torch.cuda.synchronize()
    rep.check(name, *compare(out, exact(make_input(n, dtype, "pair", peer))))


def test_gather_scatter(ctx):
  rep, r, w = ctx.report, ctx.rank, ctx.world
  for dtype in DTYPES:
    for root in (0, w - 1):
      n = 4099
      name = "gather/%s" % dname(dtype)
      x = make_input(n, dtype, "gather", root, r).to(ctx.device)
      outs = [empty(ctx, n, dtype) for _ in range(w)] if r == root else None
      dist.gather(x, gather_list=outs, dst=root)
      torch.cuda.synchronize()
      if r == root:
        ref = torch.cat([exact(make_input(n, dtype, "gather", root, p)) for p in range(w)])
        ok, detail = compare(torch.cat(outs), ref)
        rep.check(name, ok, "root=%d: %s" % (root, detail))
      else:
        rep.ok(name)

      name = "scatter/%s" % dname(dtype)
      ins = ([make_input(n, dtype, "scatter", root, p).to(ctx.device) for p in range(w)]
             if r == root else None)
      out = empty(ctx, n, dtype)
      dist.scatter(out, scatter_list=ins, src=root)
      torch.cuda.synchronize()
      ok, detail = compare(out, exact(make_input(n, dtype, "scatter", root, r)))
      rep.check(name, ok, "root=%d: %s" % (root, detail))


def test_all_to_all_list(ctx):
  rep, r, w = ctx.report, ctx.rank, ctx.world

  def count(i, j):  # elements rank i sends to rank j
    return [5, 0, 4099, 17, 65536][(i + 2 * j) % 5]

  for dtype in DTYPES:
    name = "all_to_all_list/%s" % dname(dtype)
    ins = [make_input(count(r, j), dtype, "a2a_list", r, j).to(ctx.device) for j in range(w)]
    outs = [empty(ctx, count(i, r), dtype) for i in range(w)]
    dist.all_to_all(outs, ins)
    torch.cuda.synchronize()
    ref = torch.cat([exact(make_input(count(i, r), dtype, "a2a_list", i, r)) for i in range(w)])
    rep.check(name, *compare(torch.cat(outs), ref))


def main():
  ctx = Ctx("test_p2p")
  rep = ctx.report
  steps = [("isend_irecv_ring/forward", lambda c: test_ring(c, 1, "isend_irecv_ring/forward")),
           ("isend_irecv_ring/backward", lambda c: test_ring(c, -1, "isend_irecv_ring/backward")),
           ("batch_isend_irecv", test_batch), ("send_recv_blocking_pairs", test_blocking_pairs),
           ("gather_scatter", test_gather_scatter), ("all_to_all_list", test_all_to_all_list)]
  for label, fn in steps:
    t0 = time.time()
    rep.run(label, fn, ctx)
    if ctx.rank == 0:
      log("[test_p2p] %s done in %.1fs" % (label, time.time() - t0))
  rep.run("no_call_reaches_real_libnccl", nccl_binding_check, rep,
          require=("ncclSend", "ncclRecv"), verbose=True)
  ctx.finish()


if __name__ == "__main__":
  main()
