"""The ncclComm_t of a torch ProcessGroupNCCL, proven to be one that libmkernel created.

torch's ProcessGroupNCCL calls ncclCommInitRankConfig through the dynamic linker; with
LD_PRELOAD=libmkernel.so those calls land in mkernel and the communicator is mkernel's. This
module never creates a communicator: it borrows the process group's one and refuses it unless
libmkernel recognises it (ncclCommCount succeeds only on communicators in mkernel's registry of
live communicators; a foreign pointer is only looked up, never dereferenced).
"""

import os
import time

from . import _lib


def _dist():
  import torch.distributed as dist  # noqa: WPS433 - torch is optional for the package
  return dist


def group_rank_size(group):
  dist = _dist()
  if not dist.is_available() or not dist.is_initialized():
    raise _lib.MkernelError("torch.distributed is not initialised: call "
                            "torch.distributed.init_process_group('nccl', ...) first")
  g = group if group is not None else dist.group.WORLD
  rank = dist.get_rank(g)
  if rank < 0:
    raise _lib.MkernelError("this process (global rank %d) is not a member of the process group "
                            "passed as group=" % dist.get_rank())
  return g, rank, dist.get_world_size(g)


def _raw_comm_ptr(group, device):
  import torch
  try:
    backend = group._get_backend(torch.device("cuda"))
  except Exception as e:  # noqa: BLE001 - torch raises RuntimeError/ValueError by version
    raise _lib.MkernelError("the process group has no CUDA backend (%s): the fused calls need a "
                            "'nccl' process group" % e) from None
  kind = type(backend).__name__
  if "NCCL" not in kind:
    raise _lib.MkernelError("the group's CUDA backend is %s, not ProcessGroupNCCL: the fused "
                            "calls need a 'nccl' process group" % kind)
  get = getattr(backend, "_comm_ptr", None)
  if get is None:
    raise _lib.MkernelError("%s has no _comm_ptr(): this torch (%s) does not expose the raw "
                            "ncclComm_t of a ProcessGroupNCCL (torch >= 2.8 does)" %
                            (kind, torch.__version__))
  # The map behind _comm_ptr is keyed by the current device.
  with torch.cuda.device(device):
    return int(get() or 0)


def _explain_foreign(lib):
  addr, obj = _lib.global_symbol("ncclCommInitRankConfig")
  where = ("torch's ncclCommInitRankConfig resolves to %s" % obj) if obj else \
      "no ncclCommInitRankConfig in the global scope (NCCL linked statically into torch?)"
  mine = os.path.realpath(lib.path) if lib.path else "?"
  return ("%s; libmkernel in use: %s (%s). Run the process with LD_PRELOAD=%s so that "
          "ProcessGroupNCCL creates its communicators in mkernel" % (where, lib.path, lib.how,
                                                                     mine))


def comm_of_group(lib, group, rank, size, device, init_timeout_s=60.0):
  """The raw ncclComm_t (int) of `group` on `device`, checked to be libmkernel's, of `size`
  ranks with this process as `rank`, and on `device`."""
  import torch
  ptr = _raw_comm_ptr(group, device)
  bound = getattr(group, "bound_device_id", None)
  if ptr == 0 and bound is not None and torch.device(bound) != device:
    # Eager initialisation (device_id= at init_process_group): the communicator lives on that
    # device, and a collective issued here alone would wait for peers that never join it.
    raise _lib.MkernelError("the process group is bound to %s (init_process_group(device_id=...)) "
                            "but the tensors are on %s" % (bound, device))
  if ptr == 0:
    # Lazy initialisation (no device_id at init_process_group): torch creates the communicator
    # at the group's first collective. Every rank is inside this same fused call, so every rank
    # issues this one-element all_reduce too.
    _dist().all_reduce(torch.zeros(1, device=device), group=group)
    ptr = _raw_comm_ptr(group, device)
    if ptr == 0:
      raise _lib.MkernelError("ProcessGroupNCCL has no communicator on %s even after a "
                              "collective" % device)
  try:
    n = lib.comm_query("ncclCommCount", ptr)
  except _lib.MkernelError as e:
    raise _lib.MkernelError(
        "the communicator of this ProcessGroupNCCL (0x%x) was not created by libmkernel (%s): "
        "%s" % (ptr, e, _explain_foreign(lib)), result=e.result) from None
  r = lib.comm_query("ncclCommUserRank", ptr)
  dev = lib.comm_query("ncclCommCuDevice", ptr)
  if (n, r) != (size, rank):
    raise _lib.MkernelError("communicator 0x%x has rank %d of %d but the process group says %d of "
                            "%d" % (ptr, r, n, rank, size))
  if dev != device.index:
    raise _lib.MkernelError("the group's communicator is on cuda:%d but the tensors are on %s" %
                            (dev, device))
  # TORCH_NCCL_USE_COMM_NONBLOCKING: the communicator may still be initialising (bounded wait).
  deadline = time.monotonic() + init_timeout_s
  while True:
    state = lib.comm_query("ncclCommGetAsyncError", ptr)
    if state != _lib.NCCL_IN_PROGRESS:
      break
    if time.monotonic() > deadline:
      raise _lib.MkernelError("communicator 0x%x still initialising after %.0f s" %
                              (ptr, init_timeout_s), result=state)
    time.sleep(0.001)
  if state != _lib.NCCL_SUCCESS:
    lib.check("ncclCommGetAsyncError (communicator 0x%x)" % ptr, state)
  return ptr
