"""The fused GEMM + collective calls on torch tensors.

Each function is a collective over `group` (every rank calls it, in the same order as its other
collectives on that group), runs on torch.cuda.current_stream(), and uses the communicator of
the group's ProcessGroupNCCL, which must be mkernel's (the process runs with
LD_PRELOAD=libmkernel.so). Inputs: contiguous CUDA bf16/fp16 tensors on the group's device;
accumulation in fp32. No autograd: the results do not track gradients.

Common keyword arguments:
  out        preallocated result (else allocated); its dtype is the output dtype
  bias       [N] tensor of the output dtype, added once to the final result
  out_dtype  torch.bfloat16 / torch.float16 / torch.float32 (default: out's, else the input's)
  b_layout   'nk': b is [N, K] (a torch.nn.Linear weight, default); 'kn': b is [K, N]
  algo       'auto' (cost model), 'fused' (one persistent kernel), 'sequential' (GEMM, then the
             collective)
  comm_sms   -1: the cost model picks the SMs that communicate; >= 0 forces it
"""

from . import _lib, _plan, _torch


def _run(op, a, b, group, out, gathered, bias, out_dtype, b_layout, algo, comm_sms):
  import torch
  # Checks that need no process group first, so that a wrong call fails the same way
  # everywhere; then the group's size and rank for the shape rules.
  _plan.plan(op, a, b, 1, out=None, gathered=None, bias=None, out_dtype=out_dtype,
             b_layout=b_layout, algo=algo, comm_sms=comm_sms)
  g, rank, size = _torch.group_rank_size(group)
  p = _plan.plan(op, a, b, size, rank=rank, out=out, gathered=gathered, bias=bias,
                 out_dtype=out_dtype, b_layout=b_layout, algo=algo, comm_sms=comm_sms)
  lib = _lib.library()
  comm = _torch.comm_of_group(lib, g, rank, size, p.device)
  if out is None:
    out = torch.empty(p.out_shape, dtype=getattr(torch, p.out_dtype_name), device=p.device)
  stream = torch.cuda.current_stream(p.device).cuda_stream
  _plan.invoke(lib, p, a, b, out, comm, stream, gathered=gathered, bias=bias)
  return out


def gemm_all_reduce(a, b, group=None, out=None, bias=None, out_dtype=None, b_layout="nk",
                    algo="auto", comm_sms=-1):
  """out[M, N] = sum over the group's ranks of a_r @ B_r (+ bias): a row-parallel linear layer.

  a: [M, K] on every rank; b: [N, K] ('nk') or [K, N] ('kn'). Bit-identical on every rank.
  Returns out.
  """
  return _run("gemm_all_reduce", a, b, group, out, None, bias, out_dtype, b_layout, algo,
              comm_sms)


def all_gather_gemm(a_shard, b, group=None, out=None, gathered=None, bias=None, out_dtype=None,
                    b_layout="nk", algo="auto", comm_sms=-1):
  """out[M, N] = A @ B (+ bias) with A [M, K] gathered from the ranks' a_shard [M/n, K] (rank r
  holds rows r*M/n .. (r+1)*M/n): a column-parallel linear layer.

  gathered: optional [M, K] tensor of the input dtype that receives A (a_shard may be this
  rank's block of it: in place). Returns out.
  """
  return _run("all_gather_gemm", a_shard, b, group, out, gathered, bias, out_dtype, b_layout,
              algo, comm_sms)


def gemm_reduce_scatter(a, b, group=None, out=None, bias=None, out_dtype=None, b_layout="nk",
                        algo="auto", comm_sms=-1):
  """out[M/n, N] = rows rank*M/n .. (rank+1)*M/n of sum over ranks of a_r @ B_r (+ bias).

  a: [M, K] with M a multiple of the group size. Returns out.
  """
  return _run("gemm_reduce_scatter", a, b, group, out, None, bias, out_dtype, b_layout, algo,
              comm_sms)
