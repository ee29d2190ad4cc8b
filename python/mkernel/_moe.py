"""Argument checks and C calls of the MoE operators (ncclMoeDispatchGemm,
ncclMoeDispatchFfnCombine in include/mkernel/fused.h), in Python, before anything reaches C.

Pure Python on duck-typed tensors, like _plan: the rules are unit-tested without torch or a GPU.
The C library checks them again; routing values (expert ids) live on the device and are checked
there (a bad id is reported through the communicator's async error, no host synchronisation).
"""

import collections

from . import _lib, _plan

OPS = ("moe_dispatch_gemm", "moe_ffn")
C_API = {"moe_dispatch_gemm": "ncclMoeDispatchGemm", "moe_ffn": "ncclMoeDispatchFfnCombine"}

MoePlan = collections.namedtuple("MoePlan", [
    "op", "T", "H", "N", "I", "k", "local_experts", "experts", "nranks", "in_dtype_name",
    "in_type", "out_dtype_name", "out_type", "w_layout", "algo", "comm_sms", "max_rows", "device",
    "has_weights"
])

# What moe_dispatch_gemm returns, field for field the tensors of ncclMoeRecv_t.
RECV_FIELDS = ("x_recv", "y", "expert_count", "expert_offset", "row_source", "row_weight")
# ncclMoeFfnBuffers_t.
FFN_BUFFER_FIELDS = ("x_recv", "h", "act", "out", "expert_count", "expert_offset")


def _err(op, exc, msg, *args):
  return _plan._err(op, exc, msg, *args)


def _is_int(v):
  return isinstance(v, int) and not isinstance(v, bool)


def max_rows_bound(tokens, topk, local_experts, nranks):
  """The most rows (padding included) a rank can receive when no rank has more than `tokens`:
  every routed slot of every rank lands on this rank's experts, each expert padded to
  NCCL_MOE_ROW_ALIGN rows. A bound that never overflows; real routing needs far fewer."""
  a = _lib.MOE_ROW_ALIGN
  rows = nranks * tokens * topk + local_experts * (a - 1)
  return max(a, (rows + a - 1) // a * a)


def check_max_rows(op, max_rows):
  if not _is_int(max_rows) or not 1 <= max_rows < _plan.MAX_DIM:
    raise _err(op, ValueError, "max_rows=%r must be an int in 1..2^31-1 (the most rows, padding "
               "included, this rank may receive; see mkernel.moe_max_rows)", max_rows)
  return max_rows


def _check_index(op, name, t, device):
  if _plan._is_tensor(t) and _plan.dtype_name(t.dtype) == "int64":
    raise _err(op, TypeError, "%s has dtype int64; expected int32 (torch.topk returns int64 "
               "indices: pass %s.int())", name, name)
  _plan._check_tensor(op, name, t, 2, ("int32",), device)


def _aligned4(op, name, t):
  if t is not None and t.data_ptr() % 4 != 0:
    raise _err(op, ValueError, "%s must be 4-byte aligned (data_ptr 0x%x)", name, t.data_ptr())


def plan(op, x, topk_idx, topk_weights, w1, nranks, max_rows, w2=None, out_dtype=None,
         w_layout="nk", comm_sms=-1, algo="auto"):
  """Checks a call of `op` (one of OPS) for a group of `nranks` ranks; returns a MoePlan.

  Raises TypeError / ValueError naming the argument and the rule.
  """
  if op not in OPS:
    raise ValueError("unknown MoE op %r" % (op,))
  ffn = op == "moe_ffn"
  in_dn = _plan._check_tensor(op, "x", x, 2, _plan.IN_TYPES)
  dev = x.device
  _check_index(op, "topk_idx", topk_idx, dev)
  T, H = int(x.shape[0]), int(x.shape[1])
  Ti, k = int(topk_idx.shape[0]), int(topk_idx.shape[1])
  if Ti != T:
    raise _err(op, ValueError, "topk_idx has %d rows but x has %d tokens", Ti, T)
  if not 1 <= k <= _lib.MOE_MAX_TOPK:
    raise _err(op, ValueError, "topk_idx is [T, k] with k=%d; k must be in 1..%d", k,
               _lib.MOE_MAX_TOPK)
  if topk_weights is None:
    if ffn and T > 0:
      raise _err(op, TypeError, "topk_weights is required (the combine weighs every slot)")
  else:
    _plan._check_tensor(op, "topk_weights", topk_weights, 2, ("float32",), dev)
    if tuple(int(s) for s in topk_weights.shape) != (T, k):
      raise _err(op, ValueError, "topk_weights has shape %s; expected %s like topk_idx",
                 tuple(topk_weights.shape), (T, k))
  w_dn = _plan._check_tensor(op, "w1", w1, 3, _plan.IN_TYPES, dev)
  if w_dn != in_dn:
    raise _err(op, TypeError, "x is %s but w1 is %s: tokens and weights must have the same dtype",
               in_dn, w_dn)
  layout = _plan._enum(op, "w_layout", w_layout, _plan.LAYOUTS)
  algo_v = _plan._enum(op, "algo", algo, _plan.ALGOS)
  if not _is_int(comm_sms) or not (comm_sms == -1 or comm_sms >= 1):
    raise _err(op, ValueError, "comm_sms=%r; expected -1 (automatic) or an int >= 1", comm_sms)
  if not _is_int(nranks) or nranks < 1:
    raise _err(op, ValueError, "the group has %r ranks", nranks)

  nk = layout == _lib.LAYOUT_NK
  L = int(w1.shape[0])
  N, Hw = (int(w1.shape[1]), int(w1.shape[2])) if nk else (int(w1.shape[2]), int(w1.shape[1]))
  wdesc = "[E/n, N, H] (w_layout='nk')" if nk else "[E/n, H, N] (w_layout='kn')"
  if Hw != H:
    raise _err(op, ValueError, "x is %s and w1 %s must be %s: H differs (%d vs %d)",
               tuple(x.shape), tuple(w1.shape), wdesc, H, Hw)
  inter = 0
  if ffn:
    w2_dn = _plan._check_tensor(op, "w2", w2, 3, _plan.IN_TYPES, dev)
    if w2_dn != in_dn:
      raise _err(op, TypeError, "x is %s but w2 is %s: tokens and weights must have the same "
                 "dtype", in_dn, w2_dn)
    inter, H2 = (int(w2.shape[2]), int(w2.shape[1])) if nk else (int(w2.shape[1]),
                                                                 int(w2.shape[2]))
    if int(w2.shape[0]) != L:
      raise _err(op, ValueError, "w1 holds %d experts but w2 holds %d", L, int(w2.shape[0]))
    if H2 != H:
      raise _err(op, ValueError, "w2 %s must be %s: H differs (%d vs %d)", tuple(w2.shape),
                 "[E/n, H, I] (w_layout='nk')" if nk else "[E/n, I, H] (w_layout='kn')", H2, H)
    if inter < 1 or inter % 8 != 0:
      raise _err(op, ValueError, "inter=%d (from w2) must be a positive multiple of 8", inter)
    if N != 2 * inter:
      raise _err(op, ValueError, "w1 has N=%d outputs per expert; it must be 2*inter=%d (gate, "
                 "then up)", N, 2 * inter)
  if L < 1:
    raise _err(op, ValueError, "w1 holds no expert (shape %s)", tuple(w1.shape))
  E = L * nranks
  if E > _lib.MOE_MAX_EXPERTS:
    raise _err(op, ValueError, "%d local experts x %d ranks = %d experts; at most %d", L, nranks,
               E, _lib.MOE_MAX_EXPERTS)
  if L > _lib.MOE_MAX_LOCAL_EXPERTS:
    raise _err(op, ValueError, "%d local experts; at most %d per rank (grouped GEMM groups)", L,
               _lib.MOE_MAX_LOCAL_EXPERTS)
  if H <= 0 or N <= 0:
    raise _err(op, ValueError, "H=%d and N=%d must be positive", H, N)
  if max(H, N) >= _plan.MAX_DIM or T * k >= _plan.MAX_DIM:
    raise _err(op, ValueError, "H=%d, N=%d and tokens*topk=%d must each be below 2^31", H, N,
               T * k)
  if H % 8 != 0:
    raise _err(op, ValueError, "H=%d must be a multiple of 8 (16-byte token rows)", H)
  if not nk and N % 8 != 0:
    raise _err(op, ValueError, "N=%d must be a multiple of 8 with w_layout='kn'", N)
  check_max_rows(op, max_rows)
  if out_dtype is None:
    out_dn = in_dn
  else:
    out_dn = _plan.dtype_name(out_dtype)
    if out_dn not in _plan.OUT_TYPES:
      raise _err(op, TypeError, "out_dtype=%s unsupported; expected bfloat16, float16 or float32",
                 out_dn)
  for name, t in (("x", x), ("w1", w1), ("w2", w2)):
    if t is not None and int(t.numel()) > 0:
      _plan._aligned(op, name, t)
  _aligned4(op, "topk_idx", topk_idx)
  _aligned4(op, "topk_weights", topk_weights)
  return MoePlan(op=op, T=T, H=H, N=N, I=inter, k=k, local_experts=L, experts=E, nranks=nranks,
                 in_dtype_name=in_dn, in_type=_plan.IN_TYPES[in_dn], out_dtype_name=out_dn,
                 out_type=_plan.OUT_TYPES[out_dn], w_layout=layout, algo=algo_v,
                 comm_sms=comm_sms, max_rows=max_rows, device=dev,
                 has_weights=topk_weights is not None)


# ---------------------------------------------------------------------------------------------
# Output and buffer tensors: (shape, dtype name) per field, and their checks.
def recv_specs(p):
  """moe_dispatch_gemm's result tensors (row_weight: None without topk_weights)."""
  R, L = p.max_rows, p.local_experts
  return {
      "x_recv": ((R, p.H), p.in_dtype_name, 16),
      "y": ((R, p.N), p.out_dtype_name, 16),
      "expert_count": ((L,), "int32", 4),
      "expert_offset": ((L + 1,), "int32", 4),
      "row_source": ((R, 3), "int32", 4),
      "row_weight": ((R,), "float32", 4) if p.has_weights else None,
  }


def ffn_buffer_specs(max_rows, hidden, inter, local_experts, in_dtype_name):
  R, L = max_rows, local_experts
  return {
      "x_recv": ((R, hidden), in_dtype_name, 16),
      "h": ((R, 2 * inter), in_dtype_name, 16),
      "act": ((R, inter), in_dtype_name, 16),
      "out": ((R, hidden), "float32", 16),
      "expert_count": ((L,), "int32", 4),
      "expert_offset": ((L + 1,), "int32", 4),
  }


def _check_spec(op, name, t, spec, device):
  """spec: (shape, dtype name, alignment in bytes)."""
  shape, dn, align = spec
  _plan._check_tensor(op, name, t, len(shape), (dn,), device)
  if tuple(int(s) for s in t.shape) != shape:
    raise _err(op, ValueError, "%s has shape %s; expected %s", name, tuple(t.shape), shape)
  if align == 16:
    _plan._aligned(op, name, t)
  else:
    _aligned4(op, name, t)


def _no_overlap(op, outputs, inputs):
  """No output overlaps another output or an input."""
  outs = [(n, t) for n, t in outputs if t is not None]
  for i, (n, t) in enumerate(outs):
    for m, u in outs[i + 1:] + [(m, u) for m, u in inputs if u is not None]:
      if _plan._overlap(t, u):
        raise _err(op, ValueError, "%s must not overlap %s", n, m)


def _inputs(x, topk_idx, topk_weights, w1, w2=None):
  return [("x", x), ("topk_idx", topk_idx), ("topk_weights", topk_weights), ("w1", w1),
          ("w2", w2)]


def check_recv(p, out, x, topk_idx, topk_weights, w1):
  """out: a result of an earlier moe_dispatch_gemm (fields RECV_FIELDS) reused for this call."""
  op = p.op
  specs = recv_specs(p)
  for f in RECV_FIELDS:
    t = getattr(out, f, None)
    if f in ("row_source", "row_weight") and t is None:
      continue  # not wanted: fused.h allows NULL rowSource and rowWeight
    if specs[f] is None:
      raise _err(op, ValueError, "out.row_weight needs topk_weights (pass them, or an out whose "
                 "row_weight is None)")
    _check_spec(op, "out." + f, t, specs[f], p.device)
  _no_overlap(op, [("out." + f, getattr(out, f, None)) for f in RECV_FIELDS],
              _inputs(x, topk_idx, topk_weights, w1))


def check_ffn(p, buffers, y, x, topk_idx, topk_weights, w1, w2):
  """buffers: from mkernel.moe_ffn_buffers (fields FFN_BUFFER_FIELDS, max_rows); y: [T, H] of
  the output dtype (or None)."""
  op = p.op
  if buffers is not None:
    if getattr(buffers, "max_rows", None) != p.max_rows:
      raise _err(op, ValueError, "buffers hold %r rows but max_rows=%d",
                 getattr(buffers, "max_rows", None), p.max_rows)
    specs = ffn_buffer_specs(p.max_rows, p.H, p.I, p.local_experts, p.in_dtype_name)
    for f in FFN_BUFFER_FIELDS:
      _check_spec(op, "buffers." + f, getattr(buffers, f, None), specs[f], p.device)
  if y is not None:
    _check_spec(op, "out", y, ((p.T, p.H), p.out_dtype_name, 16), p.device)
  outs = [("buffers." + f, getattr(buffers, f)) for f in FFN_BUFFER_FIELDS
         ] if buffers is not None else []
  _no_overlap(op, outs + [("out", y)], _inputs(x, topk_idx, topk_weights, w1, w2))


# ---------------------------------------------------------------------------------------------
def _ptr(t):
  return (t.data_ptr() or None) if t is not None else None


def invoke_dispatch(lib, p, x, topk_idx, topk_weights, w1, res, comm, stream):
  """ncclMoeDispatchGemm into res (fields RECV_FIELDS). MkernelError on a refusal/failure."""
  recv = _lib.MoeRecv()
  recv.xRecv, recv.y = _ptr(res.x_recv), _ptr(res.y)
  recv.expertCount, recv.expertOffset = _ptr(res.expert_count), _ptr(res.expert_offset)
  recv.rowSource, recv.rowWeight = _ptr(res.row_source), _ptr(res.row_weight)
  recv.maxRows = p.max_rows
  cfg = _lib.make_moe_config(p.w_layout, p.out_type, p.comm_sms, p.algo)
  api = C_API[p.op]
  fn = lib.require(api)
  r = fn(_ptr(x), _ptr(topk_idx), _ptr(topk_weights), _ptr(w1), recv, p.T, p.H, p.N, p.experts,
         p.k, p.in_type, cfg, comm, stream)
  lib.check(api, r)


def invoke_ffn(lib, p, x, topk_idx, topk_weights, w1, w2, y, buffers, comm, stream):
  """ncclMoeDispatchFfnCombine into y, with buffers (fields FFN_BUFFER_FIELDS)."""
  b = _lib.MoeFfnBuffers()
  b.xRecv, b.h, b.act, b.out = (_ptr(buffers.x_recv), _ptr(buffers.h), _ptr(buffers.act),
                                _ptr(buffers.out))
  b.expertCount, b.expertOffset = _ptr(buffers.expert_count), _ptr(buffers.expert_offset)
  b.maxRows = p.max_rows
  cfg = _lib.make_moe_config(p.w_layout, p.out_type, p.comm_sms, p.algo)
  api = C_API[p.op]
  fn = lib.require(api)
  # Without tokens nothing is written to y (fused.h allows NULL there); torch gives an empty
  # tensor data_ptr 0, and the buffers' out stands in as a valid aligned address anyway.
  y_ptr = _ptr(y) if p.T > 0 else b.out
  r = fn(_ptr(x), _ptr(topk_idx), _ptr(topk_weights), _ptr(w1), _ptr(w2), y_ptr, b, p.T, p.H,
         p.I, p.experts, p.k, p.in_type, cfg, comm, stream)
  lib.check(api, r)
