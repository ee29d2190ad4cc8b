"""Expert-parallel MoE calls on torch tensors (ncclMoeDispatchGemm, ncclMoeDispatchFfnCombine).

Each function is a collective over `group` (every rank calls it, in the same order as its other
collectives on that group), runs on torch.cuda.current_stream() with the communicator of the
group's ProcessGroupNCCL (mkernel's: the process runs with LD_PRELOAD=libmkernel.so), and never
synchronises the host: routing counts are exchanged on the device, so the calls can be captured
in a CUDA graph (after one eager call on the group). No autograd.

Inputs per rank: tokens x [T, H] (bf16/fp16), routing topk_idx [T, k] (int32 expert ids in
[0, E), -1 = unused slot) and topk_weights [T, k] (fp32), the weights of this rank's E/n local
experts (rank r owns experts r*E/n .. (r+1)*E/n - 1): w1 [E/n, N, H] (w_layout='nk', the layout
of stacked torch.nn.Linear weights) or [E/n, H, N] ('kn'), and for moe_ffn w2 [E/n, H, I] ('nk')
or [E/n, I, H] ('kn'). E = (E/n) * group size.

max_rows bounds the rows (padding included) a rank may receive; mkernel.moe_max_rows gives a
bound that never overflows. When the group's ranks do not all share one process and GPU (torchrun
processes, several GPUs, nodes), the library's AllToAll path sizes its per-pair buffers with
max_rows, and on one node the fused kernels their windows: every rank must then pass the same
max_rows (e.g. moe_max_rows of the largest token count). A rank whose rows would exceed it receives nothing and its
communicator reports ncclInvalidUsage through ncclCommGetAsyncError (torch's watchdog then
aborts the process group); so is an expert id outside [-1, E).
"""

import collections
import threading

from . import _lib, _moe, _plan, _torch

# The packed layout (include/mkernel/fused.h, ncclMoeRecv_t): local expert e owns rows
# expert_offset[e] .. expert_offset[e] + expert_count[e] - 1 (offsets multiples of 128, then
# padding rows: y unspecified, row_source -1); expert_offset[E/n] = rows spanned. Inside an
# expert: source rank 0's rows first, then rank 1's, ...; inside a source, token order, then
# slot. row_source[i] = (source rank, token, slot), row_weight[i] = its routing weight.
MoeDispatchResult = collections.namedtuple("MoeDispatchResult", _moe.RECV_FIELDS)
MoeDispatchResult.__doc__ = ("moe_dispatch_gemm's result: x_recv [max_rows, H], y [max_rows, N], "
                             "expert_count [E/n], expert_offset [E/n + 1], row_source "
                             "[max_rows, 3] (int32), row_weight [max_rows] (fp32, or None)")


class MoeFfnBuffers:
  """The rows a rank receives in moe_ffn (ncclMoeFfnBuffers_t): x_recv [max_rows, H], h
  [max_rows, 2I], act [max_rows, I] (input dtype), out [max_rows, H] (fp32), expert_count [E/n],
  expert_offset [E/n + 1] (int32). Peers read `out` during the call: keep the object alive and
  unused by anything else until every rank's call has completed."""

  __slots__ = _moe.FFN_BUFFER_FIELDS + ("max_rows",)

  def __init__(self, max_rows, **tensors):
    self.max_rows = max_rows
    for f in _moe.FFN_BUFFER_FIELDS:
      setattr(self, f, tensors[f])

  def __repr__(self):
    return "MoeFfnBuffers(max_rows=%d, hidden=%d, inter=%d, local_experts=%d, dtype=%s)" % (
        self.max_rows, self.x_recv.shape[1], self.act.shape[1], self.expert_count.shape[0],
        self.x_recv.dtype)


def moe_max_rows(tokens, topk, local_experts, nranks):
  """A max_rows that never overflows when no rank holds more than `tokens` tokens: every routed
  slot of every rank lands on one rank, each local expert padded to 128 rows."""
  return _moe.max_rows_bound(tokens, topk, local_experts, nranks)


def _empty(spec, device):
  import torch
  shape, dn, _ = spec
  return torch.empty(shape, dtype=getattr(torch, dn), device=device)


def moe_ffn_buffers(max_rows, hidden, inter, local_experts, dtype=None, device=None):
  """Buffers for moe_ffn(..., buffers=...), to reuse across calls and in CUDA graphs.

  dtype: the tokens' dtype (default torch.bfloat16); device: default the current CUDA device.
  """
  import torch
  op = "moe_ffn_buffers"
  _moe.check_max_rows(op, max_rows)
  for name, v in (("hidden", hidden), ("inter", inter), ("local_experts", local_experts)):
    if not _moe._is_int(v) or v < 1:
      raise _plan._err(op, ValueError, "%s=%r must be a positive int", name, v)
  dn = _plan.dtype_name(dtype if dtype is not None else torch.bfloat16)
  if dn not in _plan.IN_TYPES:
    raise _plan._err(op, TypeError, "dtype=%s unsupported; expected bfloat16 or float16", dn)
  device = torch.device("cuda", torch.cuda.current_device()) if device is None else \
      torch.device(device)
  if device.type != "cuda":
    raise _plan._err(op, ValueError, "device %s; the buffers must be on a CUDA device", device)
  specs = _moe.ffn_buffer_specs(max_rows, hidden, inter, local_experts, dn)
  return MoeFfnBuffers(max_rows, **{f: _empty(s, device) for f, s in specs.items()})


# moe_ffn without `buffers`: one set per (communicator, stream, shapes), kept for later calls.
# Peers read a rank's buffers during its call, after the rank's own stream may have moved on,
# so buffers freed after the call could be handed to other tensors while a peer still reads
# them; reused by the next call with the same key they are safe (each rank's next call
# overwrites them only after every rank has finished reading them: fused.h's ordering).
_cache = {}
_cache_lock = threading.Lock()


def moe_release_buffers():
  """Drops the buffers moe_ffn allocated itself. Only when no moe_ffn call is in flight on any
  rank of any group (e.g. after torch.cuda.synchronize() and a barrier on every rank)."""
  with _cache_lock:
    n = len(_cache)
    _cache.clear()
  return n


def _cached_buffers(p, comm, stream):
  key = (comm, stream, p.device.index, p.in_dtype_name, p.H, p.I, p.local_experts, p.max_rows)
  with _cache_lock:
    b = _cache.get(key)
    if b is None:
      specs = _moe.ffn_buffer_specs(p.max_rows, p.H, p.I, p.local_experts, p.in_dtype_name)
      b = _cache[key] = MoeFfnBuffers(p.max_rows,
                                      **{f: _empty(s, p.device) for f, s in specs.items()})
    return b


def _plan_call(op, x, topk_idx, topk_weights, w1, w2, max_rows, group, out_dtype, w_layout,
               comm_sms, algo):
  if max_rows is None:
    raise _plan._err(op, TypeError, "max_rows is required (or %s that fixes it)",
                     "out=" if op == "moe_dispatch_gemm" else "buffers=")
  kw = dict(w2=w2, out_dtype=out_dtype, w_layout=w_layout, comm_sms=comm_sms, algo=algo)
  # Checks that need no process group first, so that a wrong call fails the same way
  # everywhere; then the group's size for the expert count.
  _moe.plan(op, x, topk_idx, topk_weights, w1, 1, max_rows, **kw)
  g, rank, size = _torch.group_rank_size(group)
  return _moe.plan(op, x, topk_idx, topk_weights, w1, size, max_rows, **kw), g, rank, size


def _comm_and_stream(p, g, rank, size):
  import torch
  lib = _lib.library()
  lib.require(_moe.C_API[p.op])
  comm = _torch.comm_of_group(lib, g, rank, size, p.device)
  return lib, comm, torch.cuda.current_stream(p.device).cuda_stream


def moe_dispatch_gemm(x, topk_idx, topk_weights, w1, *, max_rows=None, group=None,
                      out_dtype=None, w_layout="nk", comm_sms=-1, algo="auto", out=None):
  """Sends each routed slot's token row to the rank owning its expert and multiplies it there by
  the expert's w1: returns a MoeDispatchResult with this rank's received rows in the packed
  layout (x_recv), their products y = x_recv[i] @ w1[e]^T (out_dtype, default x's; fp32
  accumulation), the per-expert counts and offsets, and each row's (source rank, token, slot)
  and weight, what a combine needs to send results back.

  topk_weights may be None (row_weight is then None). max_rows: see the module doc. out: a
  MoeDispatchResult of the same shapes to write into (e.g. an earlier result), else allocated;
  its row_source and row_weight may be None (not written).
  algo: 'auto', 'fused' or 'sequential' (ncclMoeConfig_t::algo). 'fused' runs one fused kernel
  per rank where the group's ranks are on one node, either all in one process on one GPU or
  each in its own process (as under torchrun), and where they span (virtual) nodes (since
  session 35; slower than the sequential path there); moe_ffn's fused kernel also needs w_layout 'nk'.
  Elsewhere, and with 'sequential', the layout's sequential path runs.
  'auto' runs the sequential path here, and for moe_ffn the fused layer where the ranks are
  processes of one node and w_layout is 'nk' (include/mkernel/fused.h). comm_sms: -1
  (automatic) or >= 1, the CTAs of the dispatch.
  """
  op = "moe_dispatch_gemm"
  if max_rows is None and out is not None and getattr(out, "x_recv", None) is not None:
    max_rows = int(out.x_recv.shape[0])
  p, g, rank, size = _plan_call(op, x, topk_idx, topk_weights, w1, None, max_rows, group,
                                out_dtype, w_layout, comm_sms, algo)
  if out is not None:
    _moe.check_recv(p, out, x, topk_idx, topk_weights, w1)
  lib, comm, stream = _comm_and_stream(p, g, rank, size)
  if out is None:
    specs = _moe.recv_specs(p)
    out = MoeDispatchResult(**{f: None if s is None else _empty(s, p.device)
                               for f, s in specs.items()})
  _moe.invoke_dispatch(lib, p, x, topk_idx, topk_weights, w1, out, comm, stream)
  return out


def moe_ffn(x, topk_idx, topk_weights, w1, w2, *, max_rows=None, group=None, out_dtype=None,
            w_layout="nk", comm_sms=-1, algo="auto", buffers=None, out=None):
  """The whole MoE layer: returns y [T, H] (out_dtype, default x's) with
      y[t] = sum over the slots j of token t with an expert id of
             topk_weights[t, j] * (silu(x_t W1gate^T) * (x_t W1up^T)) W2^T
  of expert topk_idx[t, j], computed on the rank that owns it. w1 holds 2I outputs per expert:
  gate (the first I), then up. Rounding: h = x W1^T and act = silu(gate) * up are stored in
  x's dtype, the experts' outputs in fp32 and taken by the combine rounded to x's dtype (as
  torch's grouped GEMM returns them); the slots are added in slot order in fp32 and rounded
  once. A token whose slots are all -1 gets zeros.

  buffers: from moe_ffn_buffers(max_rows, H, I, E/n, x.dtype), for repeated calls and CUDA
  graphs; they must stay alive and untouched until every rank's call has completed (peers
  read them). Without it the call uses buffers it keeps for later calls with the same
  shapes on the same group and stream (moe_release_buffers drops them). out: a [T, H] tensor
  of the output dtype to write into, else allocated. max_rows (default buffers.max_rows),
  algo, comm_sms: as for moe_dispatch_gemm.
  """
  import torch
  op = "moe_ffn"
  if max_rows is None and buffers is not None:
    max_rows = getattr(buffers, "max_rows", None)
  p, g, rank, size = _plan_call(op, x, topk_idx, topk_weights, w1, w2, max_rows, group,
                                out_dtype, w_layout, comm_sms, algo)
  _moe.check_ffn(p, buffers, out, x, topk_idx, topk_weights, w1, w2)
  lib, comm, stream = _comm_and_stream(p, g, rank, size)
  if buffers is None:
    buffers = _cached_buffers(p, comm, stream)
  if out is None:
    out = torch.empty((p.T, p.H), dtype=getattr(torch, p.out_dtype_name), device=p.device)
  _moe.invoke_ffn(lib, p, x, topk_idx, topk_weights, w1, w2, out, buffers, comm, stream)
  return out
