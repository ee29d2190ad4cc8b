"""20 steps of DistributedDataParallel training through LD_PRELOAD=libmkernel.so.

torchrun --nproc-per-node=4 tests/torch/test_ddp.py   (all ranks may share one GPU)

A small MLP (32-64-64-8, float32, TF32 off) is trained with SGD + momentum on per-rank batches
drawn from seeded generators. Ranks other than 0 start from *different* weights, so the check also
proves DDP's initial broadcast of rank 0's parameters. Small buckets (bucket_cap_mb=0.01) make DDP
issue several gradient all-reduces per step.

Reference: every rank trains the same MLP (rank 0's initial weights) in one process, without
torch.distributed, on the concatenation of all ranks' batches: the gradient of the mean loss over
the concatenated batch equals the mean over ranks of the per-rank gradients, which is what DDP
all-reduces. Checks: after 20 steps max |p_ddp - p_ref| <= 1e-5 for every parameter, and the DDP
parameters are bit-identical on all ranks (compared through the TCPStore).
"""

import hashlib
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from mk_common import Ctx, BASE_SEED, seed_of, nccl_binding_check, log

STEPS = 20
BATCH = 16
TOL = 1e-5


class MLP(nn.Module):

  def __init__(self):
    super().__init__()
    self.net = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                             nn.Linear(64, 8))

  def forward(self, x):
    return self.net(x)


def build_model(seed, device):
  torch.manual_seed(seed)  # parameters are created on the CPU: identical on every rank
  return MLP().to(device)


def batch(step, rank, device):
  g = torch.Generator()
  g.manual_seed(seed_of("ddp_batch", step, rank))
  x = torch.randn(BATCH, 32, generator=g)
  y = torch.randn(BATCH, 8, generator=g)
  return x.to(device), y.to(device)


def make_optimizer(params):
  return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def main():
  ctx = Ctx("test_ddp")
  rep = ctx.report
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  torch.set_float32_matmul_precision("highest")

  # DDP model: rank 0 seeds with BASE_SEED, the other ranks deliberately with something else.
  init_seed = BASE_SEED if ctx.rank == 0 else BASE_SEED + 1000 + ctx.rank
  model = build_model(init_seed, ctx.device)
  ddp = DDP(model, device_ids=[ctx.dev_index], bucket_cap_mb=0.01)
  opt = make_optimizer(ddp.parameters())
  loss_fn = nn.MSELoss()

  # Check DDP's initial broadcast: every rank must now hold rank 0's initial weights.
  ref_init = build_model(BASE_SEED, ctx.device)
  diff0 = max(float((p - q).abs().max()) for p, q in zip(model.parameters(),
                                                          ref_init.parameters()))
  rep.check("ddp/initial_broadcast_of_rank0_weights", diff0 == 0.0,
            "max|diff| after DDP construction = %.3g" % diff0)

  t0 = time.time()
  losses = []
  for step in range(STEPS):
    x, y = batch(step, ctx.rank, ctx.device)
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(ddp(x), y)
    loss.backward()
    opt.step()
    losses.append(float(loss))
  torch.cuda.synchronize()
  if ctx.rank == 0:
    log("[test_ddp] %d DDP steps in %.2fs, local loss %.4f -> %.4f" %
        (STEPS, time.time() - t0, losses[0], losses[-1]))

  # Single-process reference on the concatenated batches.
  ref = build_model(BASE_SEED, ctx.device)
  ref_opt = make_optimizer(ref.parameters())
  for step in range(STEPS):
    xs, ys = zip(*[batch(step, r, ctx.device) for r in range(ctx.world)])
    ref_opt.zero_grad(set_to_none=True)
    loss = loss_fn(ref(torch.cat(xs)), torch.cat(ys))
    loss.backward()
    ref_opt.step()
  torch.cuda.synchronize()

  worst, worst_name = 0.0, ""
  for (pname, p), q in zip(model.named_parameters(), ref.parameters()):
    d = float((p.detach() - q.detach()).abs().max())
    if d > worst or d != d:
      worst, worst_name = d, pname
  moved = max(float((p.detach() - q.detach()).abs().max())
              for p, q in zip(model.parameters(), ref_init.parameters()))
  rep.check("ddp/params_match_single_process_reference", worst <= TOL and moved > 1e-3,
            "max|p_ddp - p_ref| = %.3g (%s), tol %.0e; params moved %.3g from init" %
            (worst, worst_name or "-", TOL, moved))

  # Bit-identical parameters on every rank.
  flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
  digest = hashlib.sha256(bytes(flat.view(torch.uint8).tolist())).hexdigest()
  ctx.store.set("mk_ddp_digest/%d" % ctx.rank, digest)
  ctx.store.wait(["mk_ddp_digest/%d" % r for r in range(ctx.world)])
  digests = [ctx.store.get("mk_ddp_digest/%d" % r).decode() for r in range(ctx.world)]
  rep.check("ddp/params_bit_identical_on_all_ranks", len(set(digests)) == 1,
            "sha256 %s" % (digest[:16] if len(set(digests)) == 1 else
                           ", ".join(d[:12] for d in digests)))

  rep.run("no_call_reaches_real_libnccl", nccl_binding_check, rep, require=("ncclAllReduce",))
  ctx.finish()


if __name__ == "__main__":
  main()
