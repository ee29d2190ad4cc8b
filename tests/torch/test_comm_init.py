"""Communicator life cycle as PyTorch drives it, through LD_PRELOAD=libmkernel.so.

torchrun --nproc-per-node=4 tests/torch/test_comm_init.py   (all ranks may share one GPU)

  * subgroups with new_group: {0,2}, {1,3}, {0} (one rank) - with an eagerly initialised default
    group torch derives them with ncclCommSplit (non-members pass NCCL_SPLIT_NOCOLOR), otherwise
    (MK_TORCH_EAGER=0) with fresh ncclGetUniqueId + ncclCommInitRankConfig;
  * dist.split_group (torch >= 2.7), when available;
  * destroying a subgroup (ncclCommAbort/ncclCommDestroy) while the default group keeps working;
  * NCCL memory pool: tensors from ProcessGroupNCCL.mem_allocator (ncclMemAlloc) registered with
    register_mem_pool (ncclCommRegister / window registration) used in all_reduce;
  * destroy_process_group() of the default group and a second init_process_group in the same
    process.
The runner also starts this file with TORCH_NCCL_RANKS_PER_ROOT=1 (ncclCommInitRankScalable),
TORCH_NCCL_USE_COMM_NONBLOCKING=1 (nonblocking config: ncclInProgress + ncclCommGetAsyncError),
TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 (ncclCommRegister on every caching-allocator
segment) and MK_TORCH_EAGER=0 (lazy init); MK_TORCH_VARIANT names the variant in the output.
"""

import os

import torch
import torch.distributed as dist

from mk_common import Ctx, compare, make_input, sum_tolerance, nccl_binding_check, log


def check_sum(ctx, name, group, members, n=4099, tag="grp"):
  """all_reduce in `group`; expected: the sum of the members' seeded inputs."""
  xs = {r: make_input(n, torch.float32, tag, name, r) for r in members}
  x64 = torch.stack([xs[r].to(torch.float64) for r in members])
  ref = x64.sum(0)
  t = xs[ctx.rank].to(ctx.device, copy=True)
  dist.all_reduce(t, group=group)
  torch.cuda.synchronize()
  ctx.report.check(name, *compare(t, ref, sum_tolerance(torch.float32, x64.abs().sum(0),
                                                         len(members) + 1, ref)))


def test_new_group(ctx):
  w = ctx.world
  evens = list(range(0, w, 2))
  odds = list(range(1, w, 2))
  g_even = dist.new_group(evens)
  g_odd = dist.new_group(odds)
  g_zero = dist.new_group([0])
  mine, mine_ranks = (g_even, evens) if ctx.rank % 2 == 0 else (g_odd, odds)
  check_sum(ctx, "new_group/even_odd_all_reduce", mine, mine_ranks)
  if ctx.rank == 0:
    check_sum(ctx, "new_group/single_rank_group", g_zero, [0])
  else:
    ctx.report.ok("new_group/single_rank_group")
  check_sum(ctx, "new_group/default_group_still_works", None, list(range(w)))
  # Broadcast inside a subgroup from its last member (group-local root -> global rank mapping).
  src = mine_ranks[-1]
  x = make_input(1000, torch.int64, "grp_bcast", src)
  t = x.to(ctx.device, copy=True) if ctx.rank == src else torch.zeros(1000, dtype=torch.int64,
                                                            device=ctx.device)
  dist.broadcast(t, src=src, group=mine)
  torch.cuda.synchronize()
  ctx.report.check("new_group/broadcast_from_last_member", *compare(t, x))
  # Tear the subgroups down; the default group must keep working.
  for g in (g_even, g_odd, g_zero):
    dist.destroy_process_group(g)
  check_sum(ctx, "new_group/default_group_after_subgroup_destroy", None, list(range(w)),
            tag="after_destroy")


def test_split_group(ctx):
  split = getattr(dist, "split_group", None)
  if split is None:
    ctx.report.skip("split_group/halves_all_reduce", "torch.distributed.split_group missing")
    return
  if os.environ.get("MK_TORCH_EAGER", "1") == "0":
    ctx.report.skip("split_group/halves_all_reduce", "needs a default group bound to a device")
    return
  w = ctx.world
  halves = [list(range(0, w // 2)), list(range(w // 2, w))]
  try:
    g = split(split_ranks=halves)
  except (TypeError, ValueError) as e:  # API differences between torch versions / eager mode
    ctx.report.skip("split_group/halves_all_reduce", "split_group unusable here: %s" % e)
    return
  members = halves[0] if ctx.rank in halves[0] else halves[1]
  check_sum(ctx, "split_group/halves_all_reduce", g, members)
  dist.destroy_process_group(g)


def test_mem_pool(ctx):
  name = "nccl_mem_pool/register_and_all_reduce"
  try:
    backend = dist.group.WORLD._get_backend(ctx.device)
    use_pool = torch.cuda.use_mem_pool
    register, deregister = backend.register_mem_pool, backend.deregister_mem_pool
  except (AttributeError, TypeError) as e:
    ctx.report.skip(name, "NCCL MemPool API not available in this torch: %s" % e)
    return
  try:
    # torch hands out its ncclMemAlloc-backed allocator only where the device supports
    # multicast (its own check, made before any NCCL call); elsewhere the registration path
    # (ncclCommRegister on every segment of the pool) is exercised with a plain pool.
    pool = torch.cuda.MemPool(backend.mem_allocator)
  except RuntimeError as e:
    if "not supported" not in str(e):
      raise
    name += "[plain pool: %s]" % str(e).split(" in this")[0]
    pool = torch.cuda.MemPool()
  # With TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 torch registers every segment of
  # every pool itself (and deregisters it when the segment is freed); registering the pool
  # by hand on top makes torch's own bookkeeping abort the process when the pool is freed
  # ("Segment ... is not registered on ncclComm_", seen on the H200).
  by_hook = os.environ.get("TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK") == "1"
  if by_hook:
    name += "[registered by torch's allocator hook]"
  n = 1 << 20
  xs = [make_input(n, torch.float32, "mempool", r) for r in range(ctx.world)]
  with use_pool(pool):
    t = torch.empty(n, dtype=torch.float32, device=ctx.device)
  if not by_hook:
    register(pool)
  t.copy_(xs[ctx.rank])
  dist.all_reduce(t)
  torch.cuda.synchronize()
  x64 = torch.stack([x.to(torch.float64) for x in xs])
  ref = x64.sum(0)
  ctx.report.check(name, *compare(t, ref, sum_tolerance(torch.float32, x64.abs().sum(0),
                                                         ctx.world + 1, ref)))
  if not by_hook:
    deregister(pool)
  del t
  torch.cuda.synchronize()
  del pool


def test_reinit(ctx):
  # A fresh key prefix: the new group's ncclUniqueId exchange must not read the first group's
  # keys, which are still in the (shared) store.
  store = dist.PrefixStore("mk_reinit", ctx.store)
  dist.destroy_process_group()
  ctx.init_pg(store=store)
  check_sum(ctx, "reinit/all_reduce_after_destroy_and_init", None, list(range(ctx.world)),
            tag="reinit")


def main():
  variant = os.environ.get("MK_TORCH_VARIANT", "")
  ctx = Ctx("test_comm_init" + ("[%s]" % variant if variant else ""))
  rep = ctx.report
  if ctx.rank == 0:
    log("[%s] variant env: %s" % (ctx.test, {k: os.environ[k] for k in os.environ if k in (
        "TORCH_NCCL_RANKS_PER_ROOT", "TORCH_NCCL_USE_COMM_NONBLOCKING",
        "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", "MK_TORCH_EAGER")}))
  rep.run("default_group/all_reduce", check_sum, ctx, "default_group/all_reduce", None,
          list(range(ctx.world)), tag="default")
  # The memory pool test runs before any subgroup is destroyed: with
  # TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 torch registers every new allocator segment
  # with every communicator it has created, and after destroy_process_group(subgroup) it
  # still tries the aborted subgroup's one and raises "NCCL communicator was aborted on rank
  # <subgroup rank>" from torch.empty (seen on the H200: the rank named is the subgroup's).
  rep.run("nccl_mem_pool", test_mem_pool, ctx)
  rep.run("new_group", test_new_group, ctx)
  rep.run("split_group", test_split_group, ctx)
  rep.run("no_call_reaches_real_libnccl", nccl_binding_check, rep, require=("ncclAllReduce",),
          verbose=True)
  rep.run("reinit", test_reinit, ctx)
  ctx.finish()


if __name__ == "__main__":
  main()
