"""Self-check of the PyTorch test harness on a machine without GPU (not a test of mkernel).

usage: tests/torch/cpu_selfcheck.sh <test file> [nproc]    (e.g. test_collectives.py)

Runs a tests/torch file on CPU with the gloo backend (any torch >= 1.13, e.g. Debian's
python3-torch), so that the harness itself (seeded inputs, references, tolerances, report
merging, exit codes) can be checked where no GPU exists. CUDA calls become no-ops, and the
NCCL-only features gloo lacks are emulated: AVG and PREMUL_SUM (as SUM plus scaling),
bfloat16 (reductions in float32, data movement on uint8 views), all_gather_into_tensor,
reduce_scatter_tensor, all_to_all of lists. The GOT check is skipped (no libnccl here) unless
MK_SELFCHECK_GOT=1. MK_SELFCHECK_FAULT=1 corrupts one element of rank 2's reductions, to see
that the checks catch it.
"""

import datetime
import os
import runpy
import sys

import torch
import torch.distributed as dist
import torch.nn.parallel as tnp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
RO = dist.ReduceOp


class _Stream:

  def synchronize(self):
    pass


class _Done:

  def wait(self):
    return True

  def is_completed(self):
    return True


class PremulOp:
  """Stands for the ReduceOp of _make_nccl_premul_sum (gloo has none)."""

  def __init__(self, f):
    if isinstance(f, list):
      f = f[0]
    if isinstance(f, torch.Tensor):
      f = float(f.reshape(-1)[0])
    self.f = f


class CpuDDP(tnp.DistributedDataParallel):

  def __init__(self, module, device_ids=None, **kw):
    super().__init__(module, **kw)


def _bytes(t):
  return t.view(torch.uint8) if t.dtype == torch.bfloat16 else t


_orig = {n: getattr(dist, n) for n in ("all_reduce", "reduce", "broadcast", "all_gather",
                                       "all_to_all_single", "gather", "scatter")}


def _reduce_like(fn, t, op, group):
  avg = False
  x = t.float() if t.dtype == torch.bfloat16 else t.clone()
  if isinstance(op, PremulOp):
    f = (torch.tensor(op.f, dtype=torch.float32).to(t.dtype).float()
         if t.dtype == torch.bfloat16 else op.f)
    x = x * f
    op = RO.SUM
  elif op == RO.AVG:
    op, avg = RO.SUM, True
  fn(x, op)
  if avg:
    x = x / dist.get_world_size(group)
  if os.environ.get("MK_SELFCHECK_FAULT") and dist.get_rank() == 2 and x.numel() > 3:
    x[3] += 0.25 if t.dtype == torch.bfloat16 else (1 if not t.dtype.is_floating_point else
                                                      abs(float(x[3])) * 1e-5 + 1e-30)
  t.copy_(x)


def all_reduce(t, op=RO.SUM, group=None, async_op=False):
  _reduce_like(lambda x, o: _orig["all_reduce"](x, op=o, group=group), t, op, group)
  return _Done() if async_op else None


def reduce(t, dst, op=RO.SUM, group=None, async_op=False):
  before = t.clone()
  _reduce_like(lambda x, o: _orig["reduce"](x, dst, op=o, group=group), t, op, group)
  if dist.get_rank() != dst:
    t.copy_(before)
  return _Done() if async_op else None


def broadcast(t, src, group=None, async_op=False):
  _orig["broadcast"](_bytes(t), src, group=group)
  return _Done() if async_op else None


def all_gather(lst, t, group=None, async_op=False):
  _orig["all_gather"]([_bytes(x) for x in lst], _bytes(t), group=group)
  return _Done() if async_op else None


def all_gather_into_tensor(out, t, group=None, async_op=False):
  _orig["all_gather"](list(_bytes(out).chunk(dist.get_world_size(group))), _bytes(t), group=group)
  return _Done() if async_op else None


def reduce_scatter_tensor(out, inp, op=RO.SUM, group=None, async_op=False):
  x = inp.clone()
  all_reduce(x, op=op, group=group)
  out.copy_(x.chunk(dist.get_world_size(group))[dist.get_rank(group)])
  return _Done() if async_op else None


def all_to_all_single(out, inp, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
  if inp.dtype == torch.bfloat16:
    two = lambda s: None if s is None else [2 * v for v in s]
    _orig["all_to_all_single"](out.view(torch.uint8), inp.view(torch.uint8),
                               two(output_split_sizes), two(input_split_sizes), group=group)
  else:
    _orig["all_to_all_single"](out, inp, output_split_sizes, input_split_sizes, group=group)
  return _Done() if async_op else None


def gather(t, gather_list=None, dst=0, group=None, async_op=False):
  _orig["gather"](_bytes(t), [_bytes(x) for x in gather_list] if gather_list else None, dst=dst,
                  group=group)
  return _Done() if async_op else None


def scatter(t, scatter_list=None, src=0, group=None, async_op=False):
  _orig["scatter"](_bytes(t), [_bytes(x) for x in scatter_list] if scatter_list else None,
                   src=src, group=group)
  return _Done() if async_op else None


def all_to_all(outs, ins, group=None, async_op=False):
  r, n = dist.get_rank(), dist.get_world_size()
  reqs = []
  for p in range(n):
    if p == r:
      outs[p].copy_(ins[p])
      continue
    reqs.append(dist.isend(_bytes(ins[p]), p))
    reqs.append(dist.irecv(_bytes(outs[p]), p))
  for q in reqs:
    q.wait()
  return _Done() if async_op else None


def install():
  torch.cuda.device_count = lambda: 1
  torch.cuda.set_device = lambda d: None
  torch.cuda.synchronize = lambda *a, **k: None
  torch.cuda.current_stream = lambda *a, **k: _Stream()
  tnp.DistributedDataParallel = CpuDDP
  dist._make_nccl_premul_sum = PremulOp
  for name in ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter", "all_to_all"):
    setattr(dist, name, globals()[name])

  import mk_common  # after the patches, so that the test modules see them

  orig_init = mk_common.Ctx.__init__

  def ctx_init(self, name, init_pg=True):
    orig_init(self, name, init_pg=False)
    self.device = torch.device("cpu")
    if init_pg:
      self.init_pg()

  def init_pg(self, store=None):
    kw = dict(backend="gloo", timeout=datetime.timedelta(seconds=60))
    if store is not None:
      kw.update(store=store, rank=self.rank, world_size=self.world)
    dist.init_process_group(**kw)
    self.store = dist.distributed_c10d._get_default_store()

  mk_common.Ctx.__init__ = ctx_init
  mk_common.Ctx.init_pg = init_pg
  if os.environ.get("MK_SELFCHECK_GOT") != "1":
    mk_common.nccl_binding_check = (
        lambda report, name="no_call_reaches_real_libnccl", require=(), verbose=False:
        report.skip(name, "CPU self-check: no NCCL"))


if __name__ == "__main__":
  install()
  script = sys.argv[1]
  sys.argv = sys.argv[1:]
  runpy.run_path(os.path.join(HERE, script), run_name="__main__")
