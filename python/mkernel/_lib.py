"""ctypes binding of libmkernel.so: where the library comes from, the C prototypes of the fused
calls (include/mkernel/fused.h) and the communicator queries, and C errors as exceptions.

No torch here: everything in this module works (and is unit-tested) without it.
"""

import ctypes
import ctypes.util
import os
import threading

# ncclResult_t (nccl.h; the values are part of NCCL's ABI).
RESULT_NAMES = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}
NCCL_SUCCESS = 0
NCCL_INVALID_ARGUMENT = 4
NCCL_IN_PROGRESS = 7

# ncclDataType_t values of the types the fused calls take (stable across NCCL versions).
NCCL_FLOAT16 = 6
NCCL_FLOAT32 = 7
NCCL_BFLOAT16 = 9

# include/mkernel/fused.h
FUSED_CONFIG_MAGIC = 0x6D6B4663  # "mkFc"
FUSED_CONFIG_VERSION = 1
LAYOUT_NK = 0
LAYOUT_KN = 1
ALGO_AUTO = 0
ALGO_FUSED = 1
ALGO_SEQUENTIAL = 2
MOE_CONFIG_MAGIC = 0x6D6B4D63  # "mkMc"
MOE_CONFIG_VERSION = 1
MOE_ROW_ALIGN = 128  # NCCL_MOE_ROW_ALIGN: the packed layout's expert offsets are multiples of it
MOE_MAX_EXPERTS = 1024
MOE_MAX_TOPK = 16
MOE_MAX_LOCAL_EXPERTS = 256  # NCCL_MOE_MAX_LOCAL_EXPERTS: the grouped GEMM's group limit
# The MoE calls came later than the fused GEMM ones: a libmkernel without them still loads.
MOE_APIS = ("ncclMoeDispatchGemm", "ncclMoeDispatchFfnCombine")
RING_ATTN_CONFIG_MAGIC = 0x6D6B5261  # "mkRa"
RING_ATTN_CONFIG_VERSION = 1
RING_ATTN_CONTIGUOUS = 0  # ncclRingAttnLayout_t
RING_ATTN_ZIGZAG = 1
RING_ATTN_HEAD_DIMS = (64, 128, 256)
# Later still: a libmkernel without it still loads (ring_attention then says to rebuild).
ATTN_APIS = ("ncclRingAttention",)

# The symbol that tells libmkernel from the real libnccl: only mkernel exports it.
MKERNEL_ONLY_SYMBOL = "ncclGemmAllReduce"


class MkernelError(RuntimeError):
  """A call into libmkernel failed, or libmkernel / its communicator could not be used.

  result: the ncclResult_t (int) when the C library returned one, else None.
  """

  def __init__(self, message, result=None, api=None):
    super().__init__(message)
    self.result = result
    self.api = api

  @property
  def result_name(self):
    return RESULT_NAMES.get(self.result, "ncclResult %r" % (self.result,))


class FusedConfig(ctypes.Structure):
  """ncclFusedConfig_t, field for field (a unit test compares it with the header)."""
  _fields_ = [
      ("size", ctypes.c_size_t),
      ("magic", ctypes.c_uint),
      ("version", ctypes.c_uint),
      ("bLayout", ctypes.c_int),
      ("outType", ctypes.c_int),
      ("bias", ctypes.c_void_p),
      ("commSms", ctypes.c_int),
      ("algo", ctypes.c_int),
  ]


def make_config(b_layout, out_type, bias_ptr, comm_sms, algo):
  """A filled ncclFusedConfig_t (out_type is always explicit, so the header's default value,
  (ncclDataType_t)-1 for "the input type", is never needed here)."""
  c = FusedConfig()
  c.size = ctypes.sizeof(FusedConfig)
  c.magic = FUSED_CONFIG_MAGIC
  c.version = FUSED_CONFIG_VERSION
  c.bLayout = b_layout
  c.outType = out_type
  c.bias = bias_ptr or None
  c.commSms = comm_sms
  c.algo = algo
  return c


class MoeConfig(ctypes.Structure):
  """ncclMoeConfig_t, field for field."""
  _fields_ = [
      ("size", ctypes.c_size_t),
      ("magic", ctypes.c_uint),
      ("version", ctypes.c_uint),
      ("wLayout", ctypes.c_int),
      ("outType", ctypes.c_int),
      ("commSms", ctypes.c_int),
      ("algo", ctypes.c_int),
  ]


class MoeRecv(ctypes.Structure):
  """ncclMoeRecv_t: where ncclMoeDispatchGemm puts the rows this rank receives."""
  _fields_ = [
      ("xRecv", ctypes.c_void_p),
      ("y", ctypes.c_void_p),
      ("expertCount", ctypes.c_void_p),
      ("expertOffset", ctypes.c_void_p),
      ("rowSource", ctypes.c_void_p),
      ("rowWeight", ctypes.c_void_p),
      ("maxRows", ctypes.c_size_t),
  ]


class MoeFfnBuffers(ctypes.Structure):
  """ncclMoeFfnBuffers_t: the received rows of ncclMoeDispatchFfnCombine and their products."""
  _fields_ = [
      ("xRecv", ctypes.c_void_p),
      ("h", ctypes.c_void_p),
      ("act", ctypes.c_void_p),
      ("out", ctypes.c_void_p),
      ("expertCount", ctypes.c_void_p),
      ("expertOffset", ctypes.c_void_p),
      ("maxRows", ctypes.c_size_t),
  ]


# Argument types of the MoE calls, in the header's order (a unit test compares them with it).
_vp, _sz, _i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
MOE_PROTOS = {
    # x, topkIdx, topkWeights, w1, recv, tokens, hidden, n, experts, topk, inType, config,
    # comm, stream
    "ncclMoeDispatchGemm": [
        _vp, _vp, _vp, _vp, ctypes.POINTER(MoeRecv), _sz, _sz, _sz, _i, _i, _i,
        ctypes.POINTER(MoeConfig), _vp, _vp
    ],
    # x, topkIdx, topkWeights, w1, w2, y, buf, tokens, hidden, inter, experts, topk, inType,
    # config, comm, stream
    "ncclMoeDispatchFfnCombine": [
        _vp, _vp, _vp, _vp, _vp, _vp, ctypes.POINTER(MoeFfnBuffers), _sz, _sz, _sz, _i, _i, _i,
        ctypes.POINTER(MoeConfig), _vp, _vp
    ],
}


def make_moe_config(w_layout, out_type, comm_sms, algo):
  c = MoeConfig()
  c.size = ctypes.sizeof(MoeConfig)
  c.magic = MOE_CONFIG_MAGIC
  c.version = MOE_CONFIG_VERSION
  c.wLayout = w_layout
  c.outType = out_type
  c.commSms = comm_sms
  c.algo = algo
  return c


class RingAttnConfig(ctypes.Structure):
  """ncclRingAttnConfig_t, field for field."""
  _fields_ = [
      ("size", ctypes.c_size_t),
      ("magic", ctypes.c_uint),
      ("version", ctypes.c_uint),
      ("causal", ctypes.c_int),
      ("scale", ctypes.c_float),
      ("seqLayout", ctypes.c_int),
      ("commSms", ctypes.c_int),
      ("algo", ctypes.c_int),
  ]


# q, k, v, out, lse (float*), batch, seqLocal, hq, hkv, headDim, inType, config, comm, stream
ATTN_PROTOS = {
    "ncclRingAttention": [
        _vp, _vp, _vp, _vp, _vp, _sz, _sz, _i, _i, _i, _i, ctypes.POINTER(RingAttnConfig), _vp,
        _vp
    ],
}


def make_ring_attn_config(causal, scale, seq_layout, comm_sms, algo):
  """scale <= 0 (the initializer's 0.0f) lets the library use 1/sqrt(headDim)."""
  c = RingAttnConfig()
  c.size = ctypes.sizeof(RingAttnConfig)
  c.magic = RING_ATTN_CONFIG_MAGIC
  c.version = RING_ATTN_CONFIG_VERSION
  c.causal = 1 if causal else 0
  c.scale = scale
  c.seqLayout = seq_layout
  c.commSms = comm_sms
  c.algo = algo
  return c


# ---------------------------------------------------------------------------------------------
# Which object holds an address (dladdr), to name libraries in messages and to find the object
# that defines a symbol of the process's global scope.
class _DlInfo(ctypes.Structure):
  _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
              ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _dladdr_fn():
  for name in (None, "libdl.so.2"):  # glibc < 2.34 keeps dladdr in libdl
    try:
      fn = ctypes.CDLL(name).dladdr
    except (OSError, AttributeError):
      continue
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    fn.restype = ctypes.c_int
    return fn
  return None


def object_of_address(addr):
  """Path of the loaded object containing addr, or '' when unknown."""
  fn = _dladdr_fn()
  if not addr or fn is None:
    return ""
  info = _DlInfo()
  if fn(ctypes.c_void_p(addr), ctypes.byref(info)) == 0 or not info.dli_fname:
    return ""
  return info.dli_fname.decode(errors="replace")


def global_symbol(name):
  """(address, defining object) of `name` in the process's global scope (what an undefined
  reference of torch's libraries binds to), or (None, '') when no object defines it."""
  try:
    fn = getattr(ctypes.CDLL(None), name)
  except AttributeError:
    return None, ""
  addr = ctypes.cast(fn, ctypes.c_void_p).value
  return addr, object_of_address(addr)


def symbol_address(cdll, name):
  try:
    return ctypes.cast(getattr(cdll, name), ctypes.c_void_p).value
  except AttributeError:
    return None


# ---------------------------------------------------------------------------------------------
class Library:
  """libmkernel.so with the prototypes set. `how` says where it was found (for messages)."""

  def __init__(self, cdll, path, how):
    self.cdll = cdll
    self.path = path
    self.how = how
    if symbol_address(cdll, MKERNEL_ONLY_SYMBOL) is None:
      raise MkernelError("%s (%s) does not export %s: it is not libmkernel (the real libnccl has "
                         "no fused calls)" % (path, how, MKERNEL_ONLY_SYMBOL))
    vp, sz, i, cfg = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(FusedConfig)
    self._proto("ncclGemmAllReduce", [vp, vp, vp, sz, sz, sz, i, cfg, vp, vp])
    self._proto("ncclAllGatherGemm", [vp, vp, vp, vp, sz, sz, sz, i, cfg, vp, vp])
    self._proto("ncclGemmReduceScatter", [vp, vp, vp, sz, sz, sz, i, cfg, vp, vp])
    if all(symbol_address(cdll, n) is not None for n in MOE_APIS):
      for name, argtypes in MOE_PROTOS.items():
        self._proto(name, argtypes)
    for name, argtypes in ATTN_PROTOS.items():
      if symbol_address(cdll, name) is not None:
        self._proto(name, argtypes)
    ip = ctypes.POINTER(ctypes.c_int)
    for name in ("ncclCommCount", "ncclCommUserRank", "ncclCommCuDevice", "ncclCommGetAsyncError"):
      self._proto(name, [vp, ip])
    self._proto("ncclGetErrorString", [i], ctypes.c_char_p)
    self._proto("ncclGetLastError", [vp], ctypes.c_char_p)

  def _proto(self, name, argtypes, restype=ctypes.c_int):
    fn = getattr(self.cdll, name)
    fn.argtypes = argtypes
    fn.restype = restype
    setattr(self, name, fn)

  def require(self, api):
    """The C function `api`; MkernelError when this libmkernel predates it."""
    fn = getattr(self, api, None)
    if fn is None:
      raise MkernelError("%s (%s) does not export %s: it was built before that call existed; "
                         "rebuild libmkernel" % (self.path, self.how, api), api=api)
    return fn

  def last_error(self):
    s = self.ncclGetLastError(None)
    return s.decode(errors="replace") if s else ""

  def error_string(self, result):
    s = self.ncclGetErrorString(result)
    return s.decode(errors="replace") if s else RESULT_NAMES.get(result, str(result))

  def check(self, api, result):
    """Raises MkernelError (with ncclGetLastError's message) unless result is ncclSuccess."""
    if result == NCCL_SUCCESS:
      return
    # ncclGetLastError is the process's last message (as in NCCL), not this call's: another
    # thread's failure, or an asynchronous error that torch's watchdog polled, may have come
    # after it, so it is labelled rather than presented as this call's reason.
    msg = self.last_error()
    raise MkernelError(
        "%s failed: %s (%d, %s)%s" % (api, RESULT_NAMES.get(result, "ncclResult"), result,
                                      self.error_string(result),
                                      "; the library's last message: " + msg if msg else ""),
        result=result, api=api)

  def comm_query(self, name, comm):
    """ncclCommCount / ncclCommUserRank / ncclCommCuDevice / ncclCommGetAsyncError of comm."""
    v = ctypes.c_int(-1)
    self.check(name, getattr(self, name)(ctypes.c_void_p(comm), ctypes.byref(v)))
    return v.value


_lock = threading.Lock()
_cached = None


def _open(path, how):
  try:
    cdll = ctypes.CDLL(path)
  except OSError as e:
    raise MkernelError("cannot load libmkernel from %s (%s): %s" % (path, how, e)) from None
  return Library(cdll, path, how)


def find_library():
  """Finds libmkernel: $MKERNEL_LIB, else the copy already loaded in the process (the LD_PRELOAD
  case: found through the global scope's ncclGemmAllReduce), else ctypes.util.find_library."""
  env = os.environ.get("MKERNEL_LIB")
  addr, obj = global_symbol(MKERNEL_ONLY_SYMBOL)
  if env:
    # A second copy beside the preloaded one would have its own (empty) registry of
    # communicators: torch's would all be refused as foreign.
    if addr is not None and obj and os.path.realpath(obj) != os.path.realpath(env):
      raise MkernelError("MKERNEL_LIB=%s but the process already has libmkernel loaded from %s "
                         "(LD_PRELOAD): unset MKERNEL_LIB or point it at that file" % (env, obj))
    return _open(env, "MKERNEL_LIB")
  if addr is not None:
    if not obj:
      raise MkernelError("libmkernel's %s is in the process's global scope but dladdr names no "
                         "file for it: set MKERNEL_LIB to the preloaded libmkernel.so" %
                         MKERNEL_ONLY_SYMBOL)
    # Open that very object: a handle to it resolves every symbol inside libmkernel, whatever
    # else the global scope holds (a real libnccl loaded before it, for instance).
    return _open(obj, "already loaded in the process (LD_PRELOAD)")
  found = ctypes.util.find_library("mkernel")
  if found:
    return _open(found, "ctypes.util.find_library('mkernel')")
  raise MkernelError(
      "libmkernel not found: set MKERNEL_LIB=/path/to/libmkernel.so, or run the process with "
      "LD_PRELOAD=/path/to/libmkernel.so (needed anyway for torch's communicators to be "
      "mkernel's), or install it where the dynamic loader finds it")


def library():
  """The process's Library (loaded once)."""
  global _cached
  with _lock:
    if _cached is None:
      _cached = find_library()
    return _cached


def _reset_for_tests():
  global _cached
  with _lock:
    _cached = None
