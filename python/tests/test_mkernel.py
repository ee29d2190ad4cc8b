"""CPU-only tests of the mkernel Python package: argument checks (on stand-in tensors, no torch
needed), the ctypes config struct against include/mkernel/fused.h, the C call marshalling and
error mapping (through a stand-in library), and, when MKERNEL_LIB names a built libmkernel.so,
real ctypes calls into it (refused before any CUDA call, so no GPU is needed).

    python3 -m unittest discover -s python/tests -v
"""

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the package from the source tree

from mkernel import _lib, _plan  # noqa: E402
import mkernel  # noqa: E402

HEADER = os.path.join(HERE, "..", "..", "include", "mkernel", "fused.h")

try:
  import torch  # noqa: F401
  HAVE_TORCH = True
except ImportError:
  HAVE_TORCH = False


# ---------------------------------------------------------------------------------------------
class Dev:

  def __init__(self, type_, index=None):
    self.type, self.index = type_, index

  def __eq__(self, o):
    return isinstance(o, Dev) and (self.type, self.index) == (o.type, o.index)

  def __ne__(self, o):
    return not self == o

  def __str__(self):
    return self.type if self.index is None else "%s:%d" % (self.type, self.index)


class DT:

  def __init__(self, name, size):
    self.name, self.size = name, size

  def __str__(self):
    return "torch." + self.name


BF16, F16, F32, I32 = DT("bfloat16", 2), DT("float16", 2), DT("float32", 4), DT("int32", 4)
CUDA0, CUDA1, CPU = Dev("cuda", 0), Dev("cuda", 1), Dev("cpu")
_next_ptr = [0x7F0000000000]


class T:
  """Stand-in tensor: what the checks read of a torch.Tensor."""

  def __init__(self, shape, dtype=BF16, device=CUDA0, ptr=None, contiguous=True):
    self.shape, self.dtype, self.device, self.contig = tuple(shape), dtype, device, contiguous
    n = 1
    for s in shape:
      n *= s
    self.n = n
    if ptr is None:
      ptr = _next_ptr[0]
      _next_ptr[0] += (n * dtype.size + 0xFFFF) & ~0xFFF
    self.ptr = ptr

  def data_ptr(self):
    return self.ptr

  def is_contiguous(self):
    return self.contig

  def numel(self):
    return self.n

  def element_size(self):
    return self.dtype.size


# ---------------------------------------------------------------------------------------------
class PlanTest(unittest.TestCase):

  def expect(self, exc, pattern, *args, **kwargs):
    with self.assertRaises(exc) as cm:
      _plan.plan(*args, **kwargs)
    self.assertRegex(str(cm.exception), pattern)
    self.assertTrue(str(cm.exception).startswith("mkernel."), str(cm.exception))

  def test_shapes_and_types(self):
    p = _plan.plan("gemm_all_reduce", T((100, 64)), T((48, 64)), 4)
    self.assertEqual((p.M, p.N, p.K, p.out_shape), (100, 48, 64, (100, 48)))
    self.assertEqual((p.in_type, p.out_type, p.b_layout, p.algo, p.comm_sms),
                     (_lib.NCCL_BFLOAT16, _lib.NCCL_BFLOAT16, _lib.LAYOUT_NK, _lib.ALGO_AUTO, -1))
    p = _plan.plan("gemm_all_reduce", T((100, 64), F16), T((64, 40), F16), 3, b_layout="kn",
                   out_dtype="fp32", algo="sequential", comm_sms=8)
    self.assertEqual((p.N, p.K, p.in_type, p.out_type, p.out_dtype_name, p.b_layout, p.algo),
                     (40, 64, _lib.NCCL_FLOAT16, _lib.NCCL_FLOAT32, "float32", _lib.LAYOUT_KN,
                      _lib.ALGO_SEQUENTIAL))
    p = _plan.plan("all_gather_gemm", T((25, 64)), T((48, 64)), 4, rank=2)
    self.assertEqual((p.M, p.out_shape, p.gathered_shape), (100, (100, 48), (100, 64)))
    p = _plan.plan("gemm_reduce_scatter", T((100, 64)), T((48, 64)), 4, algo=1)
    self.assertEqual((p.M, p.out_shape, p.algo), (100, (25, 48), _lib.ALGO_FUSED))
    # out's dtype is the output type when out_dtype is not given.
    p = _plan.plan("gemm_all_reduce", T((8, 16)), T((8, 16)), 2, out=T((8, 8), F32))
    self.assertEqual(p.out_type, _lib.NCCL_FLOAT32)

  def test_tensor_rules(self):
    b = T((48, 64))
    self.expect(TypeError, "a must be a torch.Tensor", "gemm_all_reduce", [1, 2], b, 2)
    self.expect(ValueError, "a must be 2-D", "gemm_all_reduce", T((100, 64, 1)), b, 2)
    self.expect(TypeError, "a has dtype float32; expected", "gemm_all_reduce", T((100, 64), F32),
                b, 2)
    self.expect(TypeError, "same dtype", "gemm_all_reduce", T((100, 64), F16), b, 2)
    self.expect(ValueError, "device cpu; the fused calls take CUDA", "gemm_all_reduce",
                T((100, 64), device=CPU), b, 2)
    self.expect(ValueError, "b is on cuda:1 but the first input is on cuda:0", "gemm_all_reduce",
                T((100, 64)), T((48, 64), device=CUDA1), 2)
    self.expect(ValueError, "a_shard must be contiguous", "all_gather_gemm",
                T((100, 64), contiguous=False), b, 2)
    self.expect(ValueError, "16-byte aligned", "gemm_all_reduce", T((100, 64), ptr=0x1000 + 2),
                b, 2)

  def test_shape_rules(self):
    self.expect(ValueError, r"K differs \(64 vs 32\)", "gemm_all_reduce", T((100, 64)),
                T((48, 32)), 2)
    self.expect(ValueError, r"K differs \(64 vs 48\)", "gemm_all_reduce", T((100, 64)),
                T((48, 64)), 2, b_layout="kn")
    self.expect(ValueError, "K=60 must be a multiple of 8", "gemm_all_reduce", T((100, 60)),
                T((48, 60)), 2)
    self.expect(ValueError, "N=44 must be a multiple of 8 with b_layout='kn'", "gemm_all_reduce",
                T((100, 64)), T((64, 44)), 2, b_layout="kn")
    _plan.plan("gemm_all_reduce", T((100, 64)), T((44, 64)), 2)  # N tail fine with [N, K]
    self.expect(ValueError, "M=100 must be a multiple of the group size 3",
                "gemm_reduce_scatter", T((100, 64)), T((48, 64)), 3)
    _plan.plan("gemm_all_reduce", T((100, 64)), T((48, 64)), 3)  # no M rule for the all-reduce
    self.expect(ValueError, "must be positive", "gemm_all_reduce", T((0, 64)), T((48, 64)), 2)
    self.expect(ValueError, "below 2", "all_gather_gemm", T((1 << 30, 8)), T((8, 8)), 2)

  def test_out_bias_gathered(self):
    a, b = T((100, 64)), T((48, 64))
    self.expect(ValueError, r"out has shape \(100, 48\); expected \(50, 48\)",
                "gemm_reduce_scatter", a, b, 2, out=T((100, 48)))
    self.expect(TypeError, "out has dtype bfloat16 but out_dtype is float32", "gemm_all_reduce",
                a, b, 2, out=T((100, 48)), out_dtype="float32")
    self.expect(TypeError, "out_dtype=int32 unsupported", "gemm_all_reduce", a, b, 2,
                out_dtype=I32)
    self.expect(TypeError, "bias has dtype bfloat16; it must have the output dtype float32",
                "gemm_all_reduce", a, b, 2, bias=T((48,)), out_dtype=F32)
    self.expect(ValueError, "bias has 47 elements; expected N=48", "gemm_all_reduce", a, b, 2,
                bias=T((47,)))
    self.expect(ValueError, "bias must be 1-D", "gemm_all_reduce", a, b, 2, bias=T((1, 48)))
    self.expect(ValueError, "gathered is only an argument of all_gather_gemm", "gemm_all_reduce",
                a, b, 2, gathered=T((100, 64)))
    self.expect(ValueError, r"gathered has shape \(100, 64\); expected \(200, 64\)",
                "all_gather_gemm", a, b, 2, gathered=T((100, 64)))
    self.expect(TypeError, "gathered has dtype float16", "all_gather_gemm", a, b, 2,
                gathered=T((200, 64), F16))

  def test_overlap_rules(self):
    a, b = T((100, 64)), T((48, 64))
    self.expect(ValueError, "out must not overlap a or b", "gemm_all_reduce", a, b, 2,
                out=T((100, 48), ptr=a.ptr + 64))
    bias = T((48,))
    self.expect(ValueError, "out must not overlap bias", "gemm_all_reduce", a, b, 2,
                out=T((100, 48), ptr=bias.ptr - 32), bias=bias)
    g = T((200, 64))
    # In place: rank 1's shard is rows 100..199 of gathered.
    _plan.plan("all_gather_gemm", T((100, 64), ptr=g.ptr + 100 * 64 * 2), b, 2, rank=1,
               gathered=g)
    self.expect(ValueError, "only in place", "all_gather_gemm", T((100, 64), ptr=g.ptr), b, 2,
                rank=1, gathered=g)
    self.expect(ValueError, "gathered must not overlap b or out", "all_gather_gemm", a, b, 2,
                gathered=T((200, 64), ptr=b.ptr))

  def test_enum_rules(self):
    a, b = T((8, 16)), T((8, 16))
    self.expect(ValueError, "b_layout='mn'; expected one of kn, nk", "gemm_all_reduce", a, b, 2,
                b_layout="mn")
    self.expect(ValueError, "algo='fast'", "gemm_all_reduce", a, b, 2, algo="fast")
    self.expect(ValueError, "algo=7", "gemm_all_reduce", a, b, 2, algo=7)
    self.expect(ValueError, "comm_sms=-2", "gemm_all_reduce", a, b, 2, comm_sms=-2)
    self.expect(ValueError, "comm_sms=1.5", "gemm_all_reduce", a, b, 2, comm_sms=1.5)
    with self.assertRaises(ValueError):
      _plan.plan("gemm_all_gather", a, b, 2)


# ---------------------------------------------------------------------------------------------
class StandInLib:
  """In place of the loaded library: every call returns `result`, ncclGetLastError `message`;
  subclasses record their calls in `calls`."""

  path, how = "fake", "test"

  def __init__(self, result=0, message=""):
    self.calls, self.result, self.message = [], result, message

  def last_error(self):
    return self.message

  def error_string(self, r):
    return "stand-in string"

  require = _lib.Library.require
  check = _lib.Library.check


def plain_arg(a):
  """A recorded C argument: a ctypes struct as a dict of its fields, anything else as is."""
  if isinstance(a, ctypes.Structure):
    return {f: getattr(a, f) for f, _ in a._fields_}
  return a


class FakeLib(StandInLib):
  """Records the C calls (name, leading args, the config's fields, the comm and stream)."""

  def __init__(self, result=0, message=""):
    super().__init__(result, message)
    for name in _plan.C_API.values():
      setattr(self, name, self._recorder(name))

  def _recorder(self, name):

    def fn(*args):
      self.calls.append((name, args[:-3], plain_arg(args[-3]), args[-2:]))
      return self.result

    return fn


class InvokeTest(unittest.TestCase):

  def test_marshalling(self):
    a, b, bias = T((100, 64)), T((48, 64)), T((48,), F32)
    p = _plan.plan("gemm_all_reduce", a, b, 2, bias=bias, out_dtype="float32", algo="fused",
                   comm_sms=6)
    out = T(p.out_shape, F32)
    lib = FakeLib()
    _plan.invoke(lib, p, a, b, out, 0xC0FFEE, 0x5EED, bias=bias)
    name, args, cfg, tail = lib.calls[0]
    self.assertEqual(name, "ncclGemmAllReduce")
    self.assertEqual(args, (a.ptr, b.ptr, out.ptr, 100, 48, 64, _lib.NCCL_BFLOAT16))
    self.assertEqual(tail, (0xC0FFEE, 0x5EED))
    self.assertEqual(cfg, {"size": ctypes.sizeof(_lib.FusedConfig), "magic": 0x6D6B4663,
                           "version": 1, "bLayout": 0, "outType": _lib.NCCL_FLOAT32,
                           "bias": bias.ptr, "commSms": 6, "algo": _lib.ALGO_FUSED})
    g = T((200, 64))
    p = _plan.plan("all_gather_gemm", a, T((64, 48)), 2, gathered=g, b_layout="kn")
    _plan.invoke(lib, p, a, b, out, 1, 2, gathered=g)
    name, args, cfg, _ = lib.calls[1]
    self.assertEqual(name, "ncclAllGatherGemm")
    self.assertEqual(args, (a.ptr, b.ptr, out.ptr, g.ptr, 200, 48, 64, _lib.NCCL_BFLOAT16))
    self.assertEqual((cfg["bias"], cfg["bLayout"], cfg["algo"]), (None, 1, 0))
    p = _plan.plan("gemm_reduce_scatter", a, b, 4)
    _plan.invoke(lib, p, a, b, out, 1, 2)
    self.assertEqual(lib.calls[2][0], "ncclGemmReduceScatter")
    self.assertEqual(lib.calls[2][1][3:6], (100, 48, 64))

  def test_error_mapping(self):
    a, b = T((100, 64)), T((48, 64))
    p = _plan.plan("gemm_reduce_scatter", a, b, 2)
    lib = FakeLib(result=4, message="ncclGemmReduceScatter: C must not overlap A or B")
    with self.assertRaises(mkernel.MkernelError) as cm:
      _plan.invoke(lib, p, a, b, T((50, 48)), 1, 2)
    e = cm.exception
    self.assertEqual((e.result, e.result_name, e.api),
                     (4, "ncclInvalidArgument", "ncclGemmReduceScatter"))
    self.assertIn("C must not overlap A or B", str(e))


# ---------------------------------------------------------------------------------------------
class HeaderTest(unittest.TestCase):
  """The ctypes mirror of ncclFusedConfig_t and the constants match include/mkernel/fused.h."""

  def setUp(self):
    if not os.path.isfile(HEADER):
      self.skipTest("include/mkernel/fused.h not next to this package (installed copy)")
    with open(HEADER) as f:
      self.text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)

  def test_config_fields(self):
    body = re.search(r"typedef struct\s*{(.*?)}\s*ncclFusedConfig_t;", self.text, re.S).group(1)
    fields = re.findall(r"(\w[\w\s\*]*?)\s*\b(\w+)\s*;", body)
    ctype = {"size_t": ctypes.c_size_t, "unsigned int": ctypes.c_uint, "int": ctypes.c_int,
             "ncclDataType_t": ctypes.c_int, "const void*": ctypes.c_void_p}
    got = [(n, t) for n, t in _lib.FusedConfig._fields_]
    want = [(name, ctype[" ".join(t.split())]) for t, name in fields]
    self.assertEqual(got, want)
    self.assertEqual(ctypes.sizeof(_lib.FusedConfig), 40 if ctypes.sizeof(ctypes.c_void_p) == 8
                     else ctypes.sizeof(_lib.FusedConfig))

  def test_constants(self):

    def val(name):
      return int(re.search(r"\b%s\s*=?\s*(0x[0-9a-fA-F]+|\d+)u?\b" % name, self.text).group(1), 0)

    self.assertEqual(val("NCCL_FUSED_CONFIG_MAGIC"), _lib.FUSED_CONFIG_MAGIC)
    self.assertEqual(val("NCCL_FUSED_CONFIG_VERSION"), _lib.FUSED_CONFIG_VERSION)
    self.assertEqual((val("ncclFusedLayoutNK"), val("ncclFusedLayoutKN")),
                     (_lib.LAYOUT_NK, _lib.LAYOUT_KN))
    self.assertEqual((val("ncclFusedAuto"), val("ncclFusedFused"), val("ncclFusedSequential")),
                     (_lib.ALGO_AUTO, _lib.ALGO_FUSED, _lib.ALGO_SEQUENTIAL))
    for fn in ("ncclGemmAllReduce", "ncclAllGatherGemm", "ncclGemmReduceScatter"):
      self.assertIn("ncclResult_t %s(" % fn, self.text)


# ---------------------------------------------------------------------------------------------
LIB = os.environ.get("MKERNEL_LIB", "")


@unittest.skipUnless(LIB and os.path.isfile(LIB), "MKERNEL_LIB does not name a built library")
class RealLibraryTest(unittest.TestCase):
  """ctypes calls into the built libmkernel.so; refused on the host, so no GPU is needed."""

  def setUp(self):
    _lib._reset_for_tests()
    self.lib = _lib.library()

  def test_loaded_from_env(self):
    self.assertEqual((self.lib.path, self.lib.how), (LIB, "MKERNEL_LIB"))

  def test_foreign_comm_refused_with_message(self):
    junk = ctypes.create_string_buffer(4096)  # not a communicator: looked up, never read
    junk_ptr = ctypes.addressof(junk)
    with self.assertRaises(mkernel.MkernelError) as cm:
      self.lib.comm_query("ncclCommCount", junk_ptr)
    self.assertEqual(cm.exception.result, _lib.NCCL_INVALID_ARGUMENT)
    self.assertIn("invalid communicator", str(cm.exception))
    for op in _plan.OPS:
      a, b = T((64, 64), ptr=0x10000), T((64, 64), ptr=0x20000)
      p = _plan.plan(op, a, b, 1)
      with self.assertRaises(mkernel.MkernelError) as cm:
        _plan.invoke(self.lib, p, a, b, T(p.out_shape, ptr=0x40000), junk_ptr, 0)
      self.assertEqual(cm.exception.result, _lib.NCCL_INVALID_ARGUMENT, str(cm.exception))
      self.assertIn("invalid communicator", str(cm.exception))
      self.assertIn(_plan.C_API[op], str(cm.exception))

  def test_found_when_preloaded(self):
    env = dict(os.environ, LD_PRELOAD=LIB, PYTHONPATH=os.path.dirname(HERE))
    env.pop("MKERNEL_LIB")
    code = ("import os, mkernel._lib as l; x = l.library(); "
            "print(os.path.realpath(x.path)); print(x.how)")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    self.assertEqual(r.returncode, 0, r.stderr)
    path, how = r.stdout.strip().splitlines()[-2:]
    self.assertEqual(path, os.path.realpath(LIB))
    self.assertIn("LD_PRELOAD", how)

  def test_env_differing_from_preloaded_copy_refused(self):
    # A second copy beside the preloaded one would have an empty registry of communicators.
    other = os.path.join(tempfile.mkdtemp(), "libmkernel_copy.so")
    shutil.copyfile(LIB, other)
    env = dict(os.environ, LD_PRELOAD=LIB, MKERNEL_LIB=other, PYTHONPATH=os.path.dirname(HERE))
    code = "import mkernel._lib as l; l.library()"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    shutil.rmtree(os.path.dirname(other))
    self.assertNotEqual(r.returncode, 0)
    self.assertIn("already has libmkernel loaded from", r.stderr)
    env["MKERNEL_LIB"] = LIB  # the same file: fine
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    self.assertEqual(r.returncode, 0, r.stderr)

  def test_real_nccl_refused(self):
    # A library without the fused symbols (libc stands in for the real libnccl) is refused.
    with self.assertRaises(mkernel.MkernelError) as cm:
      _lib.Library(ctypes.CDLL(None), "libc", "test")
    self.assertIn("is not libmkernel", str(cm.exception))


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchCpuTest(unittest.TestCase):
  """With torch installed (no GPU needed): real torch tensors go through the same checks."""

  def test_cpu_tensors_refused(self):
    import torch
    a = torch.zeros(16, 32, dtype=torch.bfloat16)
    b = torch.zeros(8, 32, dtype=torch.bfloat16)
    with self.assertRaisesRegex(ValueError, "CUDA tensors"):
      mkernel.gemm_all_reduce(a, b)
    with self.assertRaisesRegex(TypeError, "a has dtype float32"):
      mkernel.gemm_all_reduce(a.float(), b)

  def test_dtype_names(self):
    import torch
    self.assertEqual(_plan.dtype_name(torch.bfloat16), "bfloat16")
    self.assertEqual(_plan.dtype_name(torch.half), "float16")
    self.assertEqual(_plan.dtype_name(torch.float), "float32")


if __name__ == "__main__":
  unittest.main()
