"""Correctness of the collectives ProcessGroupNCCL issues, through LD_PRELOAD=libmkernel.so.

torchrun --nproc-per-node=4 tests/torch/test_collectives.py   (all ranks may share one GPU)

For float32, bfloat16 and int64 and several sizes (1 .. 2M elements per rank):
  all_reduce SUM / AVG / PREMUL_SUM (host and device factor) / MAX / MIN, async, unaligned views,
  empty tensors, 64 back-to-back calls; reduce to every root; all_gather (tensor and list);
  reduce_scatter_tensor SUM / MAX / PREMUL_SUM; broadcast from every root; all_to_all_single with
  even and uneven (incl. zero) splits; barrier (no rank leaves before the last one arrives).
Outputs are poisoned (NaN / 0x5A..) first; every element is compared with a float64 (exact int64)
reference built on each rank from every rank's seeded inputs. Float tolerance per element:
  sum-like ops: n * eps * sum_r |x_r| + eps * |ref|   (eps = 2^-23 fp32, 2^-8 bf16; n = ranks)
  MAX / MIN / broadcast / gather / all-to-all: exact.
Ends with the GOT check that no NCCL symbol of any loaded object is bound to the real libnccl.
"""

import os
import struct
import time

import torch
import torch.distributed as dist

from mk_common import Ctx, compare, make_input, poison_like, sum_tolerance, nccl_binding_check, log

DTYPES = [torch.float32, torch.bfloat16, torch.int64]
SIZES = [int(s) for s in os.environ.get("MK_TORCH_SIZES", "1,5,4099,262147,2097152").split(",")]


def dname(dtype):
  return str(dtype).replace("torch.", "")


def inputs_all_ranks(ctx, n, dtype, *tag):
  return [make_input(n, dtype, *tag, r) for r in range(ctx.world)]


def sum_reference(xs, dtype, scale=1.0, divide=1):
  """float64 (or exact int64) reference of scale * sum(xs) / divide, and its float tolerance."""
  if not dtype.is_floating_point:
    return torch.stack(xs).sum(0), None
  x64 = torch.stack([x.to(torch.float64) for x in xs])
  ref = x64.sum(0) * scale / divide
  tol = sum_tolerance(dtype, x64.abs().sum(0) / divide, len(xs) + 1, ref, scale)
  return ref, tol


# PREMUL_SUM factor. ncclRedOpCreatePreMulSum reads ncclTypeSize(datatype) bytes at `scalar`, but
# for bfloat16 tensors torch passes a *float* (unpackPreMulSum<float, ncclBfloat16>), so NCCL
# uses the low 16 bits of the float32 as the bf16 factor. The float32 with bits 0x3F003F00
# (0.50096...) makes both readings agree: its low half 0x3F00 is bf16 0.5, and 0.50096 rounds to
# bf16 0.5 as well. float32 tensors use the full 0.50096130...
PREMUL_F = struct.unpack("<f", struct.pack("<I", 0x3F003F00))[0]


def premul_factor(dtype, f):
  """The factor as the library applies it: f for float32, the bf16 read of float32(f)'s first two
  bytes for bfloat16 (torch/NCCL quirk above, equal to round-to-bf16 for PREMUL_F)."""
  if dtype == torch.bfloat16:
    bits = struct.unpack("<I", struct.pack("<f", f))[0] & 0xFFFF
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]
  return float(torch.tensor(f, dtype=torch.float64).to(dtype).to(torch.float64))


def make_premul_op(ctx, dtype, f, on_device):
  mk = getattr(dist, "_make_nccl_premul_sum", None)
  if mk is None:
    try:
      from torch._C._distributed_c10d import _make_nccl_premul_sum as mk
    except ImportError:
      return None, "_make_nccl_premul_sum not available in this torch"
  if not on_device:
    return mk(f), None
  # torch reads a device factor as const_data_ptr<T>() with T = float for float32 and bfloat16.
  t = torch.tensor([f], dtype=torch.float32 if dtype == torch.bfloat16 else dtype,
                   device=ctx.device)
  for arg in ([t], t):
    try:
      return mk(arg), None
    except (TypeError, RuntimeError):
      continue
  return None, "_make_nccl_premul_sum does not accept a tensor factor in this torch"


# ---------------------------------------------------------------------------------------------
def test_all_reduce(ctx):
  rep = ctx.report
  for dtype in DTYPES:
    ops = [("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN)]
    if dtype.is_floating_point:
      ops += [("avg", dist.ReduceOp.AVG), ("premul_sum_host", None), ("premul_sum_device", None)]
    for opname, op in ops:
      name = "all_reduce/%s/%s" % (opname, dname(dtype))
      for n in SIZES:
        xs = inputs_all_ranks(ctx, n, dtype, "all_reduce", opname, n)
        if opname.startswith("premul"):
          nccl_op, why = make_premul_op(ctx, dtype, PREMUL_F, opname == "premul_sum_device")
          if nccl_op is None:
            rep.skip(name, why)
            break
          ref, tol = sum_reference(xs, dtype, scale=premul_factor(dtype, PREMUL_F))
        elif opname == "sum":
          nccl_op = op
          ref, tol = sum_reference(xs, dtype)
        elif opname == "avg":
          nccl_op = op
          ref, tol = sum_reference(xs, dtype, divide=ctx.world)
        else:
          nccl_op = op
          st = torch.stack([x.to(torch.float64) if dtype.is_floating_point else x for x in xs])
          ref = st.max(0).values if opname == "max" else st.min(0).values
          tol = None
        t = xs[ctx.rank].to(ctx.device, copy=True)
        dist.all_reduce(t, op=nccl_op)
        torch.cuda.synchronize()
        ok, detail = compare(t, ref, tol)
        rep.check(name, ok, "n=%d: %s" % (n, detail))

  # Async handle, unaligned (offset by one element) views, empty tensors.
  for dtype in DTYPES:
    name = "all_reduce/async_wait/%s" % dname(dtype)
    xs = inputs_all_ranks(ctx, 65537, dtype, "ar_async")
    ref, tol = sum_reference(xs, dtype)
    t = xs[ctx.rank].to(ctx.device, copy=True)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    torch.cuda.current_stream().synchronize()
    rep.check(name, *compare(t, ref, tol))

    name = "all_reduce/unaligned_view/%s" % dname(dtype)
    for n in (7, 100003):
      xs = inputs_all_ranks(ctx, n + 1, dtype, "ar_unaligned", n)
      ref, tol = sum_reference([x[1:] for x in xs], dtype)
      buf = xs[ctx.rank].to(ctx.device, copy=True)
      view = buf[1:]
      dist.all_reduce(view)
      torch.cuda.synchronize()
      ok, detail = compare(view, ref, tol)
      head_ok = compare(buf[:1], xs[ctx.rank][:1].to(torch.float64)
                        if dtype.is_floating_point else xs[ctx.rank][:1])[0]
      rep.check(name, ok and head_ok, "n=%d: %s%s" % (
          n, detail, "" if head_ok else "; element before the view was modified"))

  name = "all_reduce/empty_tensor"
  t = torch.empty(0, device=ctx.device)
  dist.all_reduce(t)
  torch.cuda.synchronize()
  rep.ok(name, "returned")

  # 64 calls back to back without host synchronisation, then one check of all results.
  name = "all_reduce/back_to_back_x64/float32"
  ts, refs = [], []
  for i in range(64):
    n = [1, 33, 1024, 40000][i % 4]
    xs = inputs_all_ranks(ctx, n, torch.float32, "ar_b2b", i)
    refs.append(sum_reference(xs, torch.float32))
    ts.append(xs[ctx.rank].to(ctx.device, copy=True))
  works = [dist.all_reduce(t, async_op=True) for t in ts]
  for w in works:
    w.wait()
  torch.cuda.synchronize()
  bad = [(i, d) for i, (t, (ref, tol)) in enumerate(zip(ts, refs))
         for ok, d in [compare(t, ref, tol)] if not ok]
  rep.check(name, not bad, "64 calls ok" if not bad else "call %d: %s" % bad[0])


def test_reduce(ctx):
  rep = ctx.report
  for dtype in DTYPES:
    name = "reduce/sum/%s" % dname(dtype)
    for n in (5, 262147):
      for root in range(ctx.world):
        xs = inputs_all_ranks(ctx, n, dtype, "reduce", n, root)
        ref, tol = sum_reference(xs, dtype)
        t = xs[ctx.rank].to(ctx.device, copy=True)
        dist.reduce(t, dst=root)
        torch.cuda.synchronize()
        if ctx.rank == root:
          rep.check(name, *compare(t, ref, tol))
        else:
          rep.ok(name)


def test_all_gather(ctx):
  rep = ctx.report
  for dtype in DTYPES:
    for n in SIZES:
      xs = inputs_all_ranks(ctx, n, dtype, "all_gather", n)
      ref = torch.cat([x.to(torch.float64) if dtype.is_floating_point else x for x in xs])
      inp = xs[ctx.rank].to(ctx.device, copy=True)

      name = "all_gather_into_tensor/%s" % dname(dtype)
      out = poison_like(torch.empty(n * ctx.world, dtype=dtype, device=ctx.device))
      dist.all_gather_into_tensor(out, inp)
      torch.cuda.synchronize()
      ok, detail = compare(out, ref)
      rep.check(name, ok, "n=%d: %s" % (n, detail))

      name = "all_gather_list/%s" % dname(dtype)
      outs = [poison_like(torch.empty(n, dtype=dtype, device=ctx.device))
              for _ in range(ctx.world)]
      dist.all_gather(outs, inp)
      torch.cuda.synchronize()
      ok, detail = compare(torch.cat(outs), ref)
      rep.check(name, ok, "n=%d: %s" % (n, detail))


def test_reduce_scatter(ctx):
  rep = ctx.report
  for dtype in DTYPES:
    ops = [("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX)]
    if dtype.is_floating_point:
      ops.append(("premul_sum_host", None))
    for opname, op in ops:
      name = "reduce_scatter_tensor/%s/%s" % (opname, dname(dtype))
      for n in SIZES:
        xs = inputs_all_ranks(ctx, n * ctx.world, dtype, "reduce_scatter", opname, n)
        mine = slice(ctx.rank * n, (ctx.rank + 1) * n)
        if opname == "premul_sum_host":
          nccl_op, why = make_premul_op(ctx, dtype, PREMUL_F, False)
          if nccl_op is None:
            rep.skip(name, why)
            break
          ref, tol = sum_reference([x[mine] for x in xs], dtype,
                                   scale=premul_factor(dtype, PREMUL_F))
        elif opname == "sum":
          nccl_op = op
          ref, tol = sum_reference([x[mine] for x in xs], dtype)
        else:
          nccl_op = op
          st = torch.stack([x[mine].to(torch.float64) if dtype.is_floating_point else x[mine]
                            for x in xs])
          ref, tol = st.max(0).values, None
        out = poison_like(torch.empty(n, dtype=dtype, device=ctx.device))
        dist.reduce_scatter_tensor(out, xs[ctx.rank].to(ctx.device, copy=True), op=nccl_op)
        torch.cuda.synchronize()
        ok, detail = compare(out, ref, tol)
        rep.check(name, ok, "n=%d: %s" % (n, detail))


def test_broadcast(ctx):
  rep = ctx.report
  for dtype in DTYPES:
    name = "broadcast/%s" % dname(dtype)
    for n in SIZES:
      for root in range(ctx.world):
        x = make_input(n, dtype, "broadcast", n, root)
        t = x.to(ctx.device, copy=True) if ctx.rank == root else poison_like(
            torch.empty(n, dtype=dtype, device=ctx.device))
        dist.broadcast(t, src=root)
        torch.cuda.synchronize()
        ok, detail = compare(t, x.to(torch.float64) if dtype.is_floating_point else x)
        rep.check(name, ok, "n=%d root=%d: %s" % (n, root, detail))
    name = "broadcast/unaligned_view/%s" % dname(dtype)
    x = make_input(4099, dtype, "broadcast_unaligned")
    buf = x.to(ctx.device, copy=True) if ctx.rank == 1 % ctx.world else poison_like(
        torch.empty(4099, dtype=dtype, device=ctx.device))
    dist.broadcast(buf[3:], src=1 % ctx.world)
    torch.cuda.synchronize()
    ref = x[3:].to(torch.float64) if dtype.is_floating_point else x[3:]
    rep.check(name, *compare(buf[3:], ref))


def split_sizes(world, scale):
  """Elements rank i sends to rank j: a fixed pattern with zeros and odd sizes."""
  pattern = [0, 1, 3, 7, 64, 1000, 4097]
  return [[pattern[(i * 3 + j * 5) % len(pattern)] * scale for j in range(world)]
          for i in range(world)]


def test_all_to_all(ctx):
  rep = ctx.report
  w = ctx.world
  for dtype in DTYPES:
    name = "all_to_all_single/even/%s" % dname(dtype)
    for n in (1, 4099, 262147):
      xs = inputs_all_ranks(ctx, n * w, dtype, "a2a_even", n)
      ref = torch.cat([x[ctx.rank * n:(ctx.rank + 1) * n] for x in xs])
      out = poison_like(torch.empty(n * w, dtype=dtype, device=ctx.device))
      dist.all_to_all_single(out, xs[ctx.rank].to(ctx.device, copy=True))
      torch.cuda.synchronize()
      ok, detail = compare(out, ref.to(torch.float64) if dtype.is_floating_point else ref)
      rep.check(name, ok, "n=%d: %s" % (n, detail))

    name = "all_to_all_single/uneven/%s" % dname(dtype)
    for scale in (1, 37):
      s = split_sizes(w, scale)
      xs = [make_input(sum(s[i]), dtype, "a2a_uneven", scale, i) for i in range(w)]
      parts = []
      for i in range(w):
        off = sum(s[i][:ctx.rank])
        parts.append(xs[i][off:off + s[i][ctx.rank]])
      ref = torch.cat(parts)
      out = poison_like(torch.empty(sum(s[i][ctx.rank] for i in range(w)), dtype=dtype,
                                    device=ctx.device))
      dist.all_to_all_single(out, xs[ctx.rank].to(ctx.device, copy=True),
                             output_split_sizes=[s[i][ctx.rank] for i in range(w)],
                             input_split_sizes=s[ctx.rank])
      torch.cuda.synchronize()
      ok, detail = compare(out, ref.to(torch.float64) if dtype.is_floating_point else ref)
      rep.check(name, ok, "scale=%d splits(rank0)=%s: %s" % (scale, s[0], detail))


def test_barrier(ctx):
  """Rank r arrives r*0.3 s late and counts itself in the store just before barrier(); after
  barrier() every rank must read the full count (store.add(key, 0) reads without blocking)."""
  name = "barrier/waits_for_last_rank"
  for rnd in range(2):
    key = "mk_barrier/%d" % rnd
    time.sleep(0.3 * ctx.rank)
    ctx.store.add(key, 1)
    dist.barrier()
    arrived = ctx.store.add(key, 0)
    ctx.report.check(name, arrived == ctx.world, "round %d: %d of %d ranks had arrived" %
                     (rnd, arrived, ctx.world))


def main():
  ctx = Ctx("test_collectives")
  rep = ctx.report
  for fn in (test_all_reduce, test_reduce, test_all_gather, test_reduce_scatter, test_broadcast,
             test_all_to_all, test_barrier):
    t0 = time.time()
    rep.run(fn.__name__, fn, ctx)
    if ctx.rank == 0:
      log("[test_collectives] %s done in %.1fs" % (fn.__name__, time.time() - t0))
  rep.run("no_call_reaches_real_libnccl", nccl_binding_check, rep,
          require=("ncclAllReduce", "ncclAllGather", "ncclReduceScatter"),
          verbose=True)
  ctx.finish()


if __name__ == "__main__":
  main()
