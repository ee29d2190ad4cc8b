"""Argument checks and the C call of ncclRingAttention (include/mkernel/fused.h), in Python,
before anything reaches C; and the layouts of a sequence split over ranks.

Pure Python on duck-typed tensors, like _plan and _moe: the rules are unit-tested without torch
or a GPU. The C library checks them again.
"""

import collections
import ctypes
import math

from . import _lib, _plan

OP = "ring_attention"
C_API = "ncclRingAttention"
LAYOUTS = {"contiguous": _lib.RING_ATTN_CONTIGUOUS, "zigzag": _lib.RING_ATTN_ZIGZAG}

AttnPlan = collections.namedtuple("AttnPlan", [
    "B", "S", "Hq", "Hkv", "D", "nranks", "dtype_name", "in_type", "causal", "scale", "layout",
    "algo", "comm_sms", "device", "out_shape", "lse_shape"
])


def _err(msg, *args, exc=ValueError):
  return _plan._err(OP, exc, msg, *args)


def _is_int(v):
  return isinstance(v, int) and not isinstance(v, bool)


def layout_value(layout, op=OP):
  return _plan._enum(op, "layout", layout, LAYOUTS)


def positions(rank, nranks, seq_local, layout="contiguous"):
  """Global positions of the seq_local rows that `rank` holds (a list of ints), as fused.h
  defines them: contiguous, rank r holds [r*S, (r+1)*S); zigzag (S even, C = S/2), rows [0, C)
  are chunk r and rows [C, S) chunk 2n-1-r of the 2n chunks of C positions."""
  lay = layout_value(layout, "positions")
  if not (_is_int(nranks) and nranks >= 1 and _is_int(rank) and 0 <= rank < nranks):
    raise ValueError("mkernel.positions: rank=%r must be in [0, nranks=%r)" % (rank, nranks))
  if not _is_int(seq_local) or seq_local < 1:
    raise ValueError("mkernel.positions: seq_local=%r must be an int >= 1" % (seq_local,))
  if lay == _lib.RING_ATTN_CONTIGUOUS:
    return list(range(rank * seq_local, (rank + 1) * seq_local))
  if seq_local % 2:
    raise ValueError("mkernel.positions: seq_local=%d must be even with layout='zigzag' (two "
                     "chunks per rank)" % seq_local)
  c = seq_local // 2
  last = 2 * nranks - 1 - rank
  return list(range(rank * c, (rank + 1) * c)) + list(range(last * c, (last + 1) * c))


def zigzag_chunk_size(op, length, nranks):
  """C, the chunk length, of a full sequence of `length` positions over nranks ranks."""
  if not _is_int(nranks) or nranks < 1:
    raise ValueError("mkernel.%s: nranks=%r must be an int >= 1" % (op, nranks))
  if length % (2 * nranks):
    raise ValueError("mkernel.%s: the sequence has %d positions; zigzag needs a multiple of "
                     "2*nranks=%d (two chunks per rank)" % (op, length, 2 * nranks))
  return length // (2 * nranks)


def _scale_value(scale):
  """None -> 0.0 (the library's 1/sqrt(D)); else a finite positive float."""
  if scale is None:
    return 0.0
  if isinstance(scale, bool) or not isinstance(scale, (int, float)):
    raise _err("scale=%r must be a float (or None for 1/sqrt(head_dim))", scale, exc=TypeError)
  # The config stores a C float: a double that rounds to 0 (which the library reads as
  # "1/sqrt(head_dim)") or to inf would change its meaning.
  s = ctypes.c_float(float(scale)).value
  if not math.isfinite(s) or s <= 0:
    raise _err("scale=%r must be finite and > 0 as a 32-bit float (None selects "
               "1/sqrt(head_dim))", scale)
  return s


def plan(q, k, v, nranks, causal=False, scale=None, layout="contiguous", algo="auto",
         comm_sms=-1, out=None, lse=None):
  """Checks a call for a group of `nranks` ranks; returns an AttnPlan. Raises TypeError /
  ValueError naming the argument and the rule of fused.h it breaks."""
  dn = _plan._check_tensor(OP, "q", q, 4, _plan.IN_TYPES)
  dev = q.device
  for name, t in (("k", k), ("v", v)):
    got = _plan._check_tensor(OP, name, t, 4, _plan.IN_TYPES, dev)
    if got != dn:
      raise _err("q is %s but %s is %s: q, k and v must have the same dtype", dn, name, got,
                 exc=TypeError)
  B, S, Hq, D = (int(s) for s in q.shape)
  kshape = tuple(int(s) for s in k.shape)
  if tuple(int(s) for s in v.shape) != kshape:
    raise _err("k has shape %s but v has %s: they must be equal ([B, S_local, Hkv, D])", kshape,
               tuple(v.shape))
  Hkv = kshape[2]
  if (kshape[0], kshape[1], kshape[3]) != (B, S, D):
    raise _err("q is %s ([B, S_local, Hq, D]) but k is %s: B, S_local and D must agree",
               tuple(q.shape), kshape)
  if D not in _lib.RING_ATTN_HEAD_DIMS:
    raise _err("head dim D=%d unsupported; expected 64, 128 or 256", D)
  if Hq < 1 or Hkv < 1 or Hq % Hkv:
    raise _err("Hq=%d (q) must be a positive multiple of Hkv=%d (k, v): grouped-query "
               "attention", Hq, Hkv)
  if B < 1 or S < 1:
    raise _err("batch=%d and S_local=%d must be >= 1", B, S)
  if not isinstance(causal, bool) and causal not in (0, 1):
    raise _err("causal=%r must be a bool", causal, exc=TypeError)
  sc = _scale_value(scale)
  lay = layout_value(layout)
  algo_v = _plan._enum(OP, "algo", algo, _plan.ALGOS)
  if not _is_int(comm_sms) or not (comm_sms == -1 or comm_sms >= 1):
    raise _err("comm_sms=%r; expected -1 (automatic) or an int >= 1", comm_sms)
  if not _is_int(nranks) or nranks < 1:
    raise _err("the group has %r ranks", nranks)
  if lay == _lib.RING_ATTN_ZIGZAG and S % 2:
    raise _err("S_local=%d must be even with layout='zigzag' (rank r holds chunks r and "
               "2n-1-r of S_local/2 positions each)", S)
  lim = _plan.MAX_DIM
  if B * S * Hq * D >= lim:
    raise _err("q has %d elements; at most 2^31-1", B * S * Hq * D)
  if nranks * S >= lim:
    raise _err("the whole sequence, nranks*S_local=%d*%d, must be below 2^31", nranks, S)
  if nranks * B * S * Hkv * D >= lim:
    raise _err("the gathered k (and v), nranks*B*S_local*Hkv*D=%d elements, must be below 2^31",
               nranks * B * S * Hkv * D)

  out_shape, lse_shape = (B, S, Hq, D), (B, Hq, S)
  if out is not None:
    got = _plan._check_tensor(OP, "out", out, 4, _plan.IN_TYPES, dev)
    if got != dn:
      raise _err("out has dtype %s; it must be q's (%s)", got, dn, exc=TypeError)
    if tuple(int(s) for s in out.shape) != out_shape:
      raise _err("out has shape %s; expected %s like q", tuple(out.shape), out_shape)
  if lse is not None:
    _plan._check_tensor(OP, "lse", lse, 3, ("float32",), dev)
    if tuple(int(s) for s in lse.shape) != lse_shape:
      raise _err("lse has shape %s; expected [B, Hq, S_local] = %s", tuple(lse.shape), lse_shape)
    if lse.data_ptr() % 4:
      raise _err("lse must be 4-byte aligned (data_ptr 0x%x)", lse.data_ptr())
  for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
    _plan._aligned(OP, name, t)
  for name, t in (("q", q), ("k", k), ("v", v)):
    if _plan._overlap(out, t):
      raise _err("out must not overlap %s", name)
  for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
    if _plan._overlap(lse, t):
      raise _err("lse must not overlap %s", name)
  return AttnPlan(B=B, S=S, Hq=Hq, Hkv=Hkv, D=D, nranks=nranks, dtype_name=dn,
                  in_type=_plan.IN_TYPES[dn], causal=bool(causal), scale=sc, layout=lay,
                  algo=algo_v, comm_sms=comm_sms, device=dev, out_shape=out_shape,
                  lse_shape=lse_shape)


def invoke(lib, p, q, k, v, out, lse, comm, stream):
  """ncclRingAttention on raw pointers (comm, stream: ints). MkernelError with the library's
  message when it refuses or fails the call."""
  cfg = _lib.make_ring_attn_config(p.causal, p.scale, p.layout, p.comm_sms, p.algo)
  fn = lib.require(C_API)
  r = fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
         lse.data_ptr() if lse is not None else None, p.B, p.S, p.Hq, p.Hkv, p.D, p.in_type, cfg,
         comm, stream)
  lib.check(C_API, r)
