"""Small torchrun workload for the dynamic-linker proof that no NCCL call reaches the real libnccl.

The runner starts it as
  LD_PRELOAD=libmkernel.so LD_BIND_NOW=1 LD_DEBUG=bindings torchrun --nproc-per-node=4 \
      tests/torch/nccl_binding_probe.py 2> >(grep nccl > bindings.log)
and then parses the log with check_ld_bindings.py. LD_BIND_NOW=1 makes ld.so resolve every
imported symbol at load time, so the log lists *every* nccl* symbol torch imports (not only those
called) and where each one is bound; a symbol libmkernel does not export shows up bound to
libnccl.so. The probe itself runs one of each main collective and the in-process GOT check.
"""

import torch
import torch.distributed as dist

from mk_common import Ctx, compare, make_input, nccl_binding_check


def main():
  ctx = Ctx("nccl_binding_probe")
  rep = ctx.report
  n, w, r = 1024, ctx.world, ctx.rank
  xs = [make_input(n, torch.int64, "probe", p) for p in range(w)]
  t = xs[r].to(ctx.device, copy=True)
  dist.all_reduce(t)
  torch.cuda.synchronize()
  rep.check("probe/all_reduce", *compare(t, torch.stack(xs).sum(0)))
  out = torch.empty(n * w, dtype=torch.int64, device=ctx.device)
  dist.all_gather_into_tensor(out, xs[r].to(ctx.device, copy=True))
  torch.cuda.synchronize()
  rep.check("probe/all_gather", *compare(out, torch.cat(xs)))
  rs = torch.empty(n // w, dtype=torch.int64, device=ctx.device)
  dist.reduce_scatter_tensor(rs, xs[r].to(ctx.device, copy=True))
  torch.cuda.synchronize()
  part = slice(r * (n // w), (r + 1) * (n // w))
  rep.check("probe/reduce_scatter", *compare(rs, torch.stack([x[part] for x in xs]).sum(0)))
  b = xs[r].to(ctx.device, copy=True)
  dist.broadcast(b, src=w - 1)
  torch.cuda.synchronize()
  rep.check("probe/broadcast", *compare(b, xs[w - 1]))
  recv = torch.empty(n, dtype=torch.int64, device=ctx.device)
  ops = [dist.P2POp(dist.isend, xs[r].to(ctx.device, copy=True), (r + 1) % w),
         dist.P2POp(dist.irecv, recv, (r - 1) % w)]
  for q in dist.batch_isend_irecv(ops):
    q.wait()
  torch.cuda.synchronize()
  rep.check("probe/send_recv", *compare(recv, xs[(r - 1) % w]))
  dist.barrier()
  rep.run("no_call_reaches_real_libnccl", nccl_binding_check, rep,
          require=("ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclSend", "ncclRecv"),
          verbose=True)
  ctx.finish()


if __name__ == "__main__":
  main()
