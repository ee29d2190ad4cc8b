"""Argument checks of the fused calls, in Python, before anything reaches C.

Pure Python on duck-typed tensors (shape, dtype, device, is_contiguous(), data_ptr(),
element_size(), numel()), so that the rules are unit-tested without torch or a GPU. The rules
are those of include/mkernel/fused.h; the C library checks them again.
"""

import collections

from . import _lib

OPS = ("gemm_all_reduce", "all_gather_gemm", "gemm_reduce_scatter")
C_API = {"gemm_all_reduce": "ncclGemmAllReduce", "all_gather_gemm": "ncclAllGatherGemm",
         "gemm_reduce_scatter": "ncclGemmReduceScatter"}

# dtype name (torch.bfloat16 -> "bfloat16") -> ncclDataType_t
IN_TYPES = {"bfloat16": _lib.NCCL_BFLOAT16, "float16": _lib.NCCL_FLOAT16}
OUT_TYPES = dict(IN_TYPES, float32=_lib.NCCL_FLOAT32)
DTYPE_ALIASES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16",
                 "float16": "float16", "half": "float16", "fp32": "float32", "float32": "float32",
                 "float": "float32"}
LAYOUTS = {"nk": _lib.LAYOUT_NK, "kn": _lib.LAYOUT_KN}
ALGOS = {"auto": _lib.ALGO_AUTO, "fused": _lib.ALGO_FUSED, "sequential": _lib.ALGO_SEQUENTIAL}
MAX_DIM = 1 << 31

# What the C call needs, and what the caller must allocate when out/gathered are None.
Plan = collections.namedtuple("Plan", [
    "op", "M", "N", "K", "in_type", "out_type", "out_dtype_name", "out_shape", "gathered_shape",
    "b_layout", "algo", "comm_sms", "device"
])


def dtype_name(dtype):
  """'bfloat16' for torch.bfloat16 (or the string 'torch.bfloat16', 'bf16', ...)."""
  s = str(dtype)
  s = s[len("torch."):] if s.startswith("torch.") else s
  return DTYPE_ALIASES.get(s, s)


def _err(op, exc, msg, *args):
  return exc(("mkernel.%s: " % op) + (msg % args if args else msg))


def _is_tensor(t):
  return all(hasattr(t, a) for a in ("shape", "dtype", "device", "data_ptr", "is_contiguous"))


def _nbytes(t):
  return int(t.numel()) * int(t.element_size())


def _overlap(x, y):
  if x is None or y is None:
    return False
  a, na, b, nb = x.data_ptr(), _nbytes(x), y.data_ptr(), _nbytes(y)
  return na > 0 and nb > 0 and a < b + nb and b < a + na


def _check_tensor(op, name, t, ndim, dtypes, device=None):
  if not _is_tensor(t):
    raise _err(op, TypeError, "%s must be a torch.Tensor, got %s", name, type(t).__name__)
  if len(t.shape) != ndim:
    raise _err(op, ValueError, "%s must be %d-D, got shape %s", name, ndim, tuple(t.shape))
  dn = dtype_name(t.dtype)
  if dn not in dtypes:
    raise _err(op, TypeError, "%s has dtype %s; expected %s", name, dn, " or ".join(dtypes))
  if getattr(t.device, "type", None) != "cuda":
    raise _err(op, ValueError, "%s is on device %s; the fused calls take CUDA tensors", name,
               t.device)
  if device is not None and t.device != device:
    raise _err(op, ValueError, "%s is on %s but the first input is on %s: all tensors must be "
               "on the communicator's device", name, t.device, device)
  if not t.is_contiguous():
    raise _err(op, ValueError, "%s must be contiguous (row-major); call .contiguous() first",
               name)
  return dn


def _aligned(op, name, t):
  if t is not None and t.data_ptr() % 16 != 0:
    raise _err(op, ValueError, "%s must be 16-byte aligned (data_ptr 0x%x; a view at an element "
               "offset is not)", name, t.data_ptr())


def _enum(op, name, value, table):
  if isinstance(value, str) and value.lower() in table:
    return table[value.lower()]
  if isinstance(value, int) and not isinstance(value, bool) and value in table.values():
    return value
  raise _err(op, ValueError, "%s=%r; expected one of %s", name, value, ", ".join(sorted(table)))


def plan(op, a, b, nranks, rank=0, out=None, gathered=None, bias=None, out_dtype=None,
         b_layout="nk", algo="auto", comm_sms=-1):
  """Checks a call of `op` (one of OPS) for a communicator of `nranks` ranks; returns a Plan.

  Raises TypeError / ValueError naming the argument and the rule.
  """
  if op not in OPS:
    raise ValueError("unknown fused op %r" % (op,))
  aname = "a_shard" if op == "all_gather_gemm" else "a"
  in_dn = _check_tensor(op, aname, a, 2, IN_TYPES)
  dev = a.device
  b_dn = _check_tensor(op, "b", b, 2, IN_TYPES, dev)
  if b_dn != in_dn:
    raise _err(op, TypeError, "%s is %s but b is %s: both inputs must have the same dtype",
               aname, in_dn, b_dn)
  layout = _enum(op, "b_layout", b_layout, LAYOUTS)
  algo_v = _enum(op, "algo", algo, ALGOS)
  if not isinstance(comm_sms, int) or isinstance(comm_sms, bool) or comm_sms < -1:
    raise _err(op, ValueError, "comm_sms=%r; expected -1 (cost model) or an int >= 0", comm_sms)
  if not isinstance(nranks, int) or nranks < 1:
    raise _err(op, ValueError, "the group has %r ranks", nranks)

  rows, K = int(a.shape[0]), int(a.shape[1])
  if layout == _lib.LAYOUT_NK:
    N, Kb = int(b.shape[0]), int(b.shape[1])
    bdesc = "[N, K] (b_layout='nk', a Linear weight)"
  else:
    Kb, N = int(b.shape[0]), int(b.shape[1])
    bdesc = "[K, N] (b_layout='kn')"
  if Kb != K:
    raise _err(op, ValueError, "%s is %s and b %s must be %s: K differs (%d vs %d)", aname,
               tuple(a.shape), tuple(b.shape), bdesc, K, Kb)
  M = rows * nranks if op == "all_gather_gemm" else rows
  if min(M, N, K) <= 0:
    raise _err(op, ValueError, "M, N and K must be positive (M=%d N=%d K=%d)", M, N, K)
  if max(M, N, K) >= MAX_DIM:
    raise _err(op, ValueError, "M, N and K must each be below 2^31 (M=%d N=%d K=%d)", M, N, K)
  if K % 8 != 0:
    raise _err(op, ValueError, "K=%d must be a multiple of 8 (16-byte rows of a and b)", K)
  if layout == _lib.LAYOUT_KN and N % 8 != 0:
    raise _err(op, ValueError, "N=%d must be a multiple of 8 with b_layout='kn'", N)
  if op == "gemm_reduce_scatter" and M % nranks != 0:
    raise _err(op, ValueError, "M=%d must be a multiple of the group size %d (each rank gets "
               "M/%d rows)", M, nranks, nranks)

  # Output type: out_dtype, else out's dtype, else the input dtype; out must agree.
  if out_dtype is not None:
    out_dn = dtype_name(out_dtype)
    if out_dn not in OUT_TYPES:
      raise _err(op, TypeError, "out_dtype=%s unsupported; expected bfloat16, float16 or float32",
                 out_dn)
  elif out is not None:
    out_dn = dtype_name(out.dtype)
  else:
    out_dn = in_dn
  out_shape = (M // nranks if op == "gemm_reduce_scatter" else M, N)
  if out is not None:
    got = _check_tensor(op, "out", out, 2, OUT_TYPES, dev)
    if got != out_dn:
      raise _err(op, TypeError, "out has dtype %s but out_dtype is %s", got, out_dn)
    if tuple(int(s) for s in out.shape) != out_shape:
      raise _err(op, ValueError, "out has shape %s; expected %s", tuple(out.shape), out_shape)
  if bias is not None:
    got = _check_tensor(op, "bias", bias, 1, OUT_TYPES, dev)
    if got != out_dn:
      raise _err(op, TypeError, "bias has dtype %s; it must have the output dtype %s", got, out_dn)
    if int(bias.shape[0]) != N:
      raise _err(op, ValueError, "bias has %d elements; expected N=%d", int(bias.shape[0]), N)
  gathered_shape = (M, K) if op == "all_gather_gemm" else None
  if gathered is not None:
    if op != "all_gather_gemm":
      raise _err(op, ValueError, "gathered is only an argument of all_gather_gemm")
    got = _check_tensor(op, "gathered", gathered, 2, IN_TYPES, dev)
    if got != in_dn:
      raise _err(op, TypeError, "gathered has dtype %s; it must have the input dtype %s", got,
                 in_dn)
    if tuple(int(s) for s in gathered.shape) != gathered_shape:
      raise _err(op, ValueError, "gathered has shape %s; expected %s", tuple(gathered.shape),
                 gathered_shape)

  for name, t in ((aname, a), ("b", b), ("out", out), ("gathered", gathered)):
    _aligned(op, name, t)
  if _overlap(out, a) or _overlap(out, b):
    raise _err(op, ValueError, "out must not overlap %s or b", aname)
  if _overlap(out, bias):
    raise _err(op, ValueError, "out must not overlap bias")
  if gathered is not None:
    if _overlap(gathered, out) or _overlap(gathered, b):
      raise _err(op, ValueError, "gathered must not overlap b or out")
    own = gathered.data_ptr() + rank * _nbytes(a)
    if _overlap(gathered, a) and a.data_ptr() != own:
      raise _err(op, ValueError, "a_shard may overlap gathered only in place, as this rank's "
                 "block: gathered[%d:%d]", rank * rows, (rank + 1) * rows)
  return Plan(op=op, M=M, N=N, K=K, in_type=IN_TYPES[in_dn], out_type=OUT_TYPES[out_dn],
              out_dtype_name=out_dn, out_shape=out_shape, gathered_shape=gathered_shape,
              b_layout=layout, algo=algo_v, comm_sms=comm_sms, device=dev)


def invoke(lib, p, a, b, out, comm, stream, gathered=None, bias=None):
  """Calls the C function of plan p on raw pointers (comm, stream: ints). Raises MkernelError
  with ncclGetLastError's message when the library refuses or fails the call."""
  cfg = _lib.make_config(p.b_layout, p.out_type, bias.data_ptr() if bias is not None else None,
                         p.comm_sms, p.algo)
  api = C_API[p.op]
  fn = getattr(lib, api)
  ptr = lambda t: t.data_ptr() if t is not None else None  # noqa: E731
  if p.op == "all_gather_gemm":
    res = fn(ptr(a), ptr(b), ptr(out), ptr(gathered), p.M, p.N, p.K, p.in_type, cfg, comm,
             stream)
  else:
    res = fn(ptr(a), ptr(b), ptr(out), p.M, p.N, p.K, p.in_type, cfg, comm, stream)
  lib.check(api, res)
