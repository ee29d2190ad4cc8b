"""CPU-only tests of the MoE wrappers (mkernel.moe_dispatch_gemm / moe_ffn): argument checks on
stand-in tensors, the ctypes mirrors of ncclMoeConfig_t / ncclMoeRecv_t / ncclMoeFfnBuffers_t
and of the two prototypes against include/mkernel/fused.h (by parsing it, and by offsetof and
sizeof from a C program compiled with the system's C compiler), the marshalling of the calls and
the error mapping through a stand-in library, and with MKERNEL_LIB a real call into the library.

    python3 -m unittest discover -s python/tests -v
"""

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import test_mkernel as tm
from mkernel import _lib, _moe
import mkernel

T, BF16, F16, F32, I32 = tm.T, tm.BF16, tm.F16, tm.F32, tm.I32
I64 = tm.DT("int64", 8)
HEADER = tm.HEADER
INCLUDE = os.path.dirname(os.path.dirname(HEADER))
LIB = tm.LIB


def dispatch_args(T_=100, H=64, N=48, L=2, k=4, layout="nk", dt=BF16):
  x = T((T_, H), dt)
  idx, w = T((T_, k), I32), T((T_, k), F32)
  w1 = T((L, N, H) if layout == "nk" else (L, H, N), dt)
  return x, idx, w, w1


def ffn_args(T_=100, H=64, I=32, L=2, k=4, layout="nk", dt=BF16):
  x, idx, w, w1 = dispatch_args(T_, H, 2 * I, L, k, layout, dt)
  w2 = T((L, H, I) if layout == "nk" else (L, I, H), dt)
  return x, idx, w, w1, w2


class MoePlanTest(unittest.TestCase):

  def expect(self, exc, pattern, *args, **kwargs):
    with self.assertRaises(exc) as cm:
      _moe.plan(*args, **kwargs)
    self.assertRegex(str(cm.exception), pattern)
    self.assertTrue(str(cm.exception).startswith("mkernel.moe_"), str(cm.exception))

  def test_shapes(self):
    x, idx, w, w1 = dispatch_args()
    p = _moe.plan("moe_dispatch_gemm", x, idx, w, w1, 4, 1024)
    self.assertEqual((p.T, p.H, p.N, p.I, p.k, p.local_experts, p.experts, p.max_rows),
                     (100, 64, 48, 0, 4, 2, 8, 1024))
    self.assertEqual((p.in_type, p.out_type, p.w_layout, p.algo, p.comm_sms, p.has_weights),
                     (_lib.NCCL_BFLOAT16, _lib.NCCL_BFLOAT16, _lib.LAYOUT_NK, _lib.ALGO_AUTO, -1,
                      True))
    self.assertEqual(_moe.recv_specs(p), {
        "x_recv": ((1024, 64), "bfloat16", 16), "y": ((1024, 48), "bfloat16", 16),
        "expert_count": ((2,), "int32", 4), "expert_offset": ((3,), "int32", 4),
        "row_source": ((1024, 3), "int32", 4), "row_weight": ((1024,), "float32", 4)})
    x, idx, w, w1 = dispatch_args(N=40, layout="kn", dt=F16)
    p = _moe.plan("moe_dispatch_gemm", x, idx, None, w1, 3, 7, out_dtype="fp32", w_layout="kn",
                  algo="sequential", comm_sms=8)
    self.assertEqual((p.N, p.experts, p.in_type, p.out_dtype_name, p.w_layout, p.algo,
                      p.comm_sms, p.has_weights),
                     (40, 6, _lib.NCCL_FLOAT16, "float32", _lib.LAYOUT_KN, _lib.ALGO_SEQUENTIAL, 8,
                      False))
    self.assertIsNone(_moe.recv_specs(p)["row_weight"])
    for layout in ("nk", "kn"):
      x, idx, w, w1, w2 = ffn_args(layout=layout)
      p = _moe.plan("moe_ffn", x, idx, w, w1, 2, 512, w2=w2, w_layout=layout, algo="fused")
      self.assertEqual((p.H, p.N, p.I, p.experts, p.algo), (64, 64, 32, 4, _lib.ALGO_FUSED))
    self.assertEqual(_moe.ffn_buffer_specs(512, 64, 32, 2, "float16"), {
        "x_recv": ((512, 64), "float16", 16), "h": ((512, 64), "float16", 16),
        "act": ((512, 32), "float16", 16), "out": ((512, 64), "float32", 16),
        "expert_count": ((2,), "int32", 4), "expert_offset": ((3,), "int32", 4)})
    # No tokens on this rank: x may be a NULL, zero-row tensor.
    _moe.plan("moe_dispatch_gemm", T((0, 64), ptr=0), T((0, 4), I32, ptr=0), None, w1, 1, 128)

  def test_tensor_rules(self):
    x, idx, w, w1 = dispatch_args()
    op = "moe_dispatch_gemm"
    self.expect(TypeError, "x must be a torch.Tensor", op, "x", idx, w, w1, 2, 64)
    self.expect(ValueError, "x is on device cpu", op, T((100, 64), device=tm.CPU), idx, w, w1, 2,
                64)
    self.expect(TypeError, "x has dtype float32", op, T((100, 64), F32), idx, w, w1, 2, 64)
    self.expect(TypeError, r"topk_idx has dtype int64; expected int32 .*\.int\(\)", op, x,
                T((100, 4), I64), w, w1, 2, 64)
    self.expect(ValueError, "topk_idx has 99 rows but x has 100 tokens", op, x, T((99, 4), I32),
                w, w1, 2, 64)
    self.expect(ValueError, "k=17; k must be in 1..16", op, x, T((100, 17), I32), w, w1, 2, 64)
    self.expect(ValueError, "k=0", op, x, T((100, 0), I32), w, w1, 2, 64)
    self.expect(ValueError, "topk_idx is on cuda:1", op, x, T((100, 4), I32, tm.CUDA1), w, w1, 2,
                64)
    self.expect(ValueError, "topk_idx must be contiguous", op, x,
                T((100, 4), I32, contiguous=False), w, w1, 2, 64)
    self.expect(ValueError, r"topk_weights has shape \(100, 3\)", op, x, idx, T((100, 3), F32),
                w1, 2, 64)
    self.expect(TypeError, "topk_weights has dtype bfloat16", op, x, idx, T((100, 4)), w1, 2, 64)
    self.expect(TypeError, "x is bfloat16 but w1 is float16", op, x, idx, w, T((2, 48, 64), F16),
                2, 64)
    self.expect(ValueError, "w1 must be 3-D", op, x, idx, w, T((48, 64)), 2, 64)
    self.expect(ValueError, r"H differs \(64 vs 32\)", op, x, idx, w, T((2, 48, 32)), 2, 64)
    self.expect(ValueError, r"H differs \(64 vs 48\)", op, x, idx, w, w1, 2, 64, w_layout="kn")
    self.expect(ValueError, "16-byte aligned", op, T((100, 64), ptr=0x10002), idx, w, w1, 2, 64)
    self.expect(ValueError, "topk_idx must be 4-byte aligned", op, x, T((100, 4), I32, ptr=0x2002),
                w, w1, 2, 64)

  def test_size_rules(self):
    op = "moe_dispatch_gemm"
    x, idx, w, w1 = dispatch_args()
    self.expect(ValueError, "300 local experts x 4 ranks = 1200 experts; at most 1024", op, x, idx,
                w, T((300, 48, 64)), 4, 64)
    self.expect(ValueError, "300 local experts; at most 256", op, x, idx, w, T((300, 48, 64)), 1,
                64)
    self.expect(ValueError, "no expert", op, x, idx, w, T((0, 48, 64)), 1, 64)
    x60 = T((100, 60))
    self.expect(ValueError, "H=60 must be a multiple of 8", op, x60, idx, w, T((2, 48, 60)), 1, 64)
    self.expect(ValueError, "N=44 must be a multiple of 8 with w_layout='kn'", op, x, idx, w,
                T((2, 64, 44)), 1, 64, w_layout="kn")
    _moe.plan(op, x, idx, w, T((2, 44, 64)), 1, 64)  # any N with [E/n, N, H]
    for bad in (0, -1, True, 1.5, 1 << 31, None):
      self.expect(ValueError, "max_rows=.* must be an int in 1..2\\^31-1", op, x, idx, w, w1, 1,
                  bad)
    self.expect(ValueError, "comm_sms=0; expected -1 .* or an int >= 1", op, x, idx, w, w1, 1, 64,
                comm_sms=0)
    self.expect(ValueError, "comm_sms=-2", op, x, idx, w, w1, 1, 64, comm_sms=-2)
    self.expect(ValueError, "w_layout='mn'", op, x, idx, w, w1, 1, 64, w_layout="mn")
    self.expect(ValueError, "algo='fast'", op, x, idx, w, w1, 1, 64, algo="fast")
    self.expect(TypeError, "out_dtype=int32 unsupported", op, x, idx, w, w1, 1, 64, out_dtype=I32)
    with self.assertRaises(ValueError):
      _moe.plan("moe_combine", x, idx, w, w1, 1, 64)

  def test_ffn_rules(self):
    op = "moe_ffn"
    x, idx, w, w1, w2 = ffn_args()
    self.expect(TypeError, "topk_weights is required", op, x, idx, None, w1, 2, 64, w2=w2)
    # A rank without tokens may pass no weights (fused.h allows NULL topkWeights at T = 0).
    _moe.plan(op, T((0, 64)), T((0, 2), I32), None, w1, 2, 64, w2=w2)
    self.expect(TypeError, "w2 must be a torch.Tensor", op, x, idx, w, w1, 2, 64)
    self.expect(TypeError, "x is bfloat16 but w2 is float16", op, x, idx, w, w1, 2, 64,
                w2=T((2, 64, 32), F16))
    self.expect(ValueError, "w1 holds 2 experts but w2 holds 3", op, x, idx, w, w1, 2, 64,
                w2=T((3, 64, 32)))
    self.expect(ValueError, r"w2 \(2, 48, 32\) must be \[E/n, H, I\].*H differs", op, x, idx, w,
                w1, 2, 64, w2=T((2, 48, 32)))
    self.expect(ValueError, "it must be 2\\*inter=48", op, x, idx, w, w1, 2, 64,
                w2=T((2, 64, 24)))
    self.expect(ValueError, "inter=12 .* positive multiple of 8", op, x, idx, w, T((2, 24, 64)),
                2, 64, w2=T((2, 64, 12)))
    x, idx, w, w1, w2 = ffn_args(layout="kn")
    self.expect(ValueError, r"must be \[E/n, I, H\]", op, x, idx, w, w1, 2, 64,
                w2=T((2, 32, 48)), w_layout="kn")

  def test_out_and_buffers(self):
    x, idx, w, w1 = dispatch_args()
    p = _moe.plan("moe_dispatch_gemm", x, idx, w, w1, 2, 256)
    specs = _moe.recv_specs(p)

    class R:
      pass

    def recv(**over):
      r = R()
      for f, s in specs.items():
        setattr(r, f, T(s[0], tm.DT(s[1], 2 if s[1] == "bfloat16" else 4)))
      for f, v in over.items():
        setattr(r, f, v)
      return r

    _moe.check_recv(p, recv(), x, idx, w, w1)
    _moe.check_recv(p, recv(row_weight=None), x, idx, w, w1)
    _moe.check_recv(p, recv(row_source=None), x, idx, w, w1)  # fused.h allows NULL rowSource
    with self.assertRaisesRegex(ValueError, r"out.y has shape \(256, 40\); expected \(256, 48\)"):
      _moe.check_recv(p, recv(y=T((256, 40))), x, idx, w, w1)
    with self.assertRaisesRegex(TypeError, "out.expert_count has dtype float32; expected int32"):
      _moe.check_recv(p, recv(expert_count=T((2,), F32)), x, idx, w, w1)
    with self.assertRaisesRegex(ValueError, "out.y must not overlap x"):
      _moe.check_recv(p, recv(y=T((256, 48), ptr=x.ptr)), x, idx, w, w1)
    pn = _moe.plan("moe_dispatch_gemm", x, idx, None, w1, 2, 256)
    with self.assertRaisesRegex(ValueError, "out.row_weight needs topk_weights"):
      _moe.check_recv(pn, recv(), x, idx, None, w1)

    x, idx, w, w1, w2 = ffn_args()
    p = _moe.plan("moe_ffn", x, idx, w, w1, 2, 256, w2=w2)
    fs = _moe.ffn_buffer_specs(256, 64, 32, 2, "bfloat16")

    def bufs(max_rows=256, **over):
      b = R()
      b.max_rows = max_rows
      for f, s in fs.items():
        setattr(b, f, T(s[0], tm.DT(s[1], 2 if s[1] == "bfloat16" else 4)))
      for f, v in over.items():
        setattr(b, f, v)
      return b

    _moe.check_ffn(p, bufs(), T((100, 64)), x, idx, w, w1, w2)
    _moe.check_ffn(p, None, None, x, idx, w, w1, w2)
    with self.assertRaisesRegex(ValueError, "buffers hold 128 rows but max_rows=256"):
      _moe.check_ffn(p, bufs(128), None, x, idx, w, w1, w2)
    with self.assertRaisesRegex(ValueError, r"buffers.h has shape \(256, 32\)"):
      _moe.check_ffn(p, bufs(h=T((256, 32))), None, x, idx, w, w1, w2)
    with self.assertRaisesRegex(TypeError, "buffers.out has dtype bfloat16; expected float32"):
      _moe.check_ffn(p, bufs(out=T((256, 64))), None, x, idx, w, w1, w2)
    with self.assertRaisesRegex(TypeError, "out has dtype float32; expected bfloat16"):
      _moe.check_ffn(p, None, T((100, 64), F32), x, idx, w, w1, w2)
    with self.assertRaisesRegex(ValueError, "buffers.out must not overlap w2"):
      _moe.check_ffn(p, bufs(out=T((256, 64), F32, ptr=w2.ptr)), None, x, idx, w, w1, w2)
    h = T((256, 64))
    with self.assertRaisesRegex(ValueError, "buffers.h must not overlap buffers.act"):
      _moe.check_ffn(p, bufs(h=h, act=T((256, 32), ptr=h.ptr + 64)), None, x, idx, w, w1, w2)

  def test_max_rows_bound(self):
    self.assertEqual(mkernel.moe_max_rows(100, 4, 2, 4), 1920)  # 1600 + 2 * 127 -> 1920
    self.assertEqual(mkernel.moe_max_rows(0, 1, 1, 1), 128)
    self.assertEqual(mkernel.moe_max_rows(1, 1, 1, 1), 128)


# ---------------------------------------------------------------------------------------------
class FakeMoeLib(tm.StandInLib):
  """Records the MoE C calls (with the structs' fields)."""

  def __init__(self, result=0, message=""):
    super().__init__(result, message)
    for name in _lib.MOE_APIS:
      setattr(self, name, self._recorder(name))

  def _recorder(self, name):

    def fn(*args):
      self.calls.append((name, [tm.plain_arg(a) for a in args]))
      return self.result

    return fn


class MoeInvokeTest(unittest.TestCase):

  def test_dispatch_marshalling(self):
    x, idx, w, w1 = dispatch_args(layout="kn")
    p = _moe.plan("moe_dispatch_gemm", x, idx, w, w1, 4, 384, w_layout="kn", out_dtype=F32,
                  comm_sms=3, algo="fused")
    res = mkernel.MoeDispatchResult(T((384, 64)), T((384, 48), F32), T((2,), I32), T((3,), I32),
                                    T((384, 3), I32), None)
    lib = FakeMoeLib()
    _moe.invoke_dispatch(lib, p, x, idx, w, w1, res, 0xC0FFEE, 0x5EED)
    name, a = lib.calls[0]
    self.assertEqual(name, "ncclMoeDispatchGemm")
    self.assertEqual(a[:4], [x.ptr, idx.ptr, w.ptr, w1.ptr])
    self.assertEqual(a[4], {"xRecv": res.x_recv.ptr, "y": res.y.ptr,
                            "expertCount": res.expert_count.ptr,
                            "expertOffset": res.expert_offset.ptr, "rowSource": res.row_source.ptr,
                            "rowWeight": None, "maxRows": 384})
    self.assertEqual(a[5:11], [100, 64, 48, 8, 4, _lib.NCCL_BFLOAT16])
    self.assertEqual(a[11], {"size": ctypes.sizeof(_lib.MoeConfig), "magic": 0x6D6B4D63,
                             "version": 1, "wLayout": _lib.LAYOUT_KN,
                             "outType": _lib.NCCL_FLOAT32, "commSms": 3,
                             "algo": _lib.ALGO_FUSED})
    self.assertEqual(a[12:], [0xC0FFEE, 0x5EED])

  def test_ffn_marshalling(self):
    x, idx, w, w1, w2 = ffn_args(dt=F16)
    p = _moe.plan("moe_ffn", x, idx, w, w1, 2, 256, w2=w2)
    fs = _moe.ffn_buffer_specs(256, 64, 32, 2, "float16")
    b = mkernel.MoeFfnBuffers(256, **{f: T(s[0], F16 if s[1] == "float16" else
                                           (F32 if s[1] == "float32" else I32))
                                      for f, s in fs.items()})
    y = T((100, 64), F16)
    lib = FakeMoeLib()
    _moe.invoke_ffn(lib, p, x, idx, w, w1, w2, y, b, 7, 9)
    name, a = lib.calls[0]
    self.assertEqual(name, "ncclMoeDispatchFfnCombine")
    self.assertEqual(a[:6], [x.ptr, idx.ptr, w.ptr, w1.ptr, w2.ptr, y.ptr])
    self.assertEqual(a[6], {"xRecv": b.x_recv.ptr, "h": b.h.ptr, "act": b.act.ptr,
                            "out": b.out.ptr, "expertCount": b.expert_count.ptr,
                            "expertOffset": b.expert_offset.ptr, "maxRows": 256})
    self.assertEqual(a[7:13], [100, 64, 32, 4, 4, _lib.NCCL_FLOAT16])
    self.assertEqual((a[13]["outType"], a[13]["wLayout"], a[13]["commSms"], a[13]["algo"]),
                     (_lib.NCCL_FLOAT16, _lib.LAYOUT_NK, -1, _lib.ALGO_AUTO))
    self.assertEqual(a[14:], [7, 9])
    # A rank without tokens: torch's empty tensors have data_ptr 0, the C call wants a y.
    x, idx, w = T((0, 64), F16, ptr=0), T((0, 4), I32, ptr=0), T((0, 4), F32, ptr=0)
    p = _moe.plan("moe_ffn", x, idx, w, w1, 2, 256, w2=w2)
    _moe.invoke_ffn(lib, p, x, idx, w, w1, w2, T((0, 64), F16, ptr=0), b, 7, 9)
    a = lib.calls[1][1]
    self.assertEqual(a[:6], [None, None, None, w1.ptr, w2.ptr, b.out.ptr])
    self.assertEqual(a[7], 0)

  def test_error_mapping(self):
    x, idx, w, w1 = dispatch_args()
    p = _moe.plan("moe_dispatch_gemm", x, idx, w, w1, 2, 128)
    res = mkernel.MoeDispatchResult(*[T((128, 64))] * 6)
    lib = FakeMoeLib(result=5, message="ncclMoeDispatchGemm: rank 1: this version runs only ...")
    with self.assertRaises(mkernel.MkernelError) as cm:
      _moe.invoke_dispatch(lib, p, x, idx, w, w1, res, 1, 2)
    e = cm.exception
    self.assertEqual((e.result, e.result_name, e.api),
                     (5, "ncclInvalidUsage", "ncclMoeDispatchGemm"))
    self.assertIn("this version runs only", str(e))

  def test_library_without_moe(self):

    class Old:
      path, how = "/old/libmkernel.so", "MKERNEL_LIB"

    with self.assertRaisesRegex(mkernel.MkernelError, "does not export ncclMoeDispatchFfnCombine"):
      _lib.Library.require(Old(), "ncclMoeDispatchFfnCombine")


# ---------------------------------------------------------------------------------------------
STRUCTS = {"ncclMoeConfig_t": _lib.MoeConfig, "ncclMoeRecv_t": _lib.MoeRecv,
           "ncclMoeFfnBuffers_t": _lib.MoeFfnBuffers, "ncclFusedConfig_t": _lib.FusedConfig}


def _ctype_of(ctype):
  ctype = " ".join(ctype.replace("*", " * ").split()).replace(" *", "*")
  if ctype.endswith("*"):
    base = ctype[:-1].replace("const ", "").strip()
    return ctypes.POINTER(STRUCTS[base]) if base in STRUCTS else ctypes.c_void_p
  return {"size_t": ctypes.c_size_t, "unsigned int": ctypes.c_uint, "int": ctypes.c_int,
          "ncclDataType_t": ctypes.c_int, "ncclComm_t": ctypes.c_void_p,
          "cudaStream_t": ctypes.c_void_p}[ctype]


class MoeHeaderTest(unittest.TestCase):
  """The ctypes mirrors match include/mkernel/fused.h."""

  def setUp(self):
    if not os.path.isfile(HEADER):
      self.skipTest("include/mkernel/fused.h not next to this package (installed copy)")
    with open(HEADER) as f:
      self.text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)

  def test_struct_fields(self):
    for cname, st in STRUCTS.items():
      body = re.search(r"typedef struct\s*{([^{}]*)}\s*%s;" % cname, self.text).group(1)
      want = [(n, _ctype_of(t)) for t, n in re.findall(r"(\w[\w\s\*]*?)\s*\b(\w+)\s*;", body)]
      self.assertEqual(list(st._fields_), want, cname)

  def test_prototypes(self):
    for name, argtypes in _lib.MOE_PROTOS.items():
      m = re.search(r"ncclResult_t %s\((.*?)\);" % name, self.text, re.S)
      self.assertIsNotNone(m, name)
      params = [p.strip() for p in m.group(1).split(",")]
      want = [_ctype_of(re.match(r"(.*?)\s*\b\w+$", p).group(1)) for p in params]
      self.assertEqual(argtypes, want, name)
      self.assertIn("ncclResult_t p%s(" % name, self.text)

  def test_constants(self):

    def val(name):
      return int(re.search(r"\b%s\s*=?\s*(0x[0-9a-fA-F]+|\d+)u?\b" % name, self.text).group(1), 0)

    self.assertEqual((val("NCCL_MOE_CONFIG_MAGIC"), val("NCCL_MOE_CONFIG_VERSION")),
                     (_lib.MOE_CONFIG_MAGIC, _lib.MOE_CONFIG_VERSION))
    self.assertEqual((val("NCCL_MOE_ROW_ALIGN"), val("NCCL_MOE_MAX_EXPERTS"),
                      val("NCCL_MOE_MAX_TOPK"), val("NCCL_MOE_MAX_LOCAL_EXPERTS")),
                     (_lib.MOE_ROW_ALIGN, _lib.MOE_MAX_EXPERTS, _lib.MOE_MAX_TOPK,
                      _lib.MOE_MAX_LOCAL_EXPERTS))


STUB_NCCL = """typedef enum { ncclSuccess = 0, ncclInvalidArgument = 4 } ncclResult_t;
typedef enum { ncclFloat16 = 6, ncclFloat32 = 7, ncclBfloat16 = 9, ncclNumTypes = 12 }
    ncclDataType_t;
typedef struct ncclComm* ncclComm_t;
"""
STUB_CUDA = "typedef struct CUstream_st* cudaStream_t;\n"


def _real_include_dirs():
  """Include folders with the real cuda_runtime.h and nccl.h, or None."""
  cands = [os.path.join(os.environ[v], "include") for v in ("NCCL_HOME", "CUDA_HOME")
           if os.environ.get(v)] + ["/usr/local/cuda/include", "/usr/include", "/usr/local/include"]
  cuda = next((d for d in cands if os.path.isfile(os.path.join(d, "cuda_runtime.h"))), None)
  nccl = next((d for d in cands if os.path.isfile(os.path.join(d, "nccl.h"))), None)
  return [nccl, cuda] if cuda and nccl else None


class MoeLayoutFromCompilerTest(unittest.TestCase):
  """offsetof / sizeof of every field from a C program that includes fused.h, against the
  ctypes mirrors: field order, types, padding and total size. The real cuda_runtime.h and
  nccl.h when found, else two-line stand-ins (the structs use only ncclDataType_t of them)."""

  def test_offsets_and_sizes(self):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc or not os.path.isfile(HEADER):
      self.skipTest("no C compiler or no include/mkernel/fused.h")
    lines = []
    for cname, st in STRUCTS.items():
      lines.append('printf("%s sizeof %%zu\\n", sizeof(%s));' % (cname, cname))
      for f, _ in st._fields_:
        lines.append('printf("%s %s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s*)0)->%s));' %
                     (cname, f, cname, f, cname, f))
    src = ("#include <stddef.h>\n#include <stdio.h>\n#include \"mkernel/fused.h\"\n"
           "int main(void) {\n%s\nreturn 0;\n}\n" % "\n".join(lines))
    with tempfile.TemporaryDirectory() as d:
      incs = _real_include_dirs()
      if incs is None:
        for name, text in (("nccl.h", STUB_NCCL), ("cuda_runtime.h", STUB_CUDA)):
          with open(os.path.join(d, name), "w") as f:
            f.write(text)
        incs = [d]
      with open(os.path.join(d, "layout.c"), "w") as f:
        f.write(src)
      exe = os.path.join(d, "layout")
      cmd = [cc, "-std=c99", "-o", exe, os.path.join(d, "layout.c"), "-I", INCLUDE]
      for i in incs:
        cmd += ["-I", i]
      r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
      self.assertEqual(r.returncode, 0, "%s\n%s" % (" ".join(cmd), r.stderr))
      out = subprocess.run([exe], capture_output=True, text=True, timeout=60, check=True).stdout
    got = {}
    for line in out.splitlines():
      parts = line.split()
      got[(parts[0], parts[1])] = tuple(int(v) for v in parts[2:])
    for cname, st in STRUCTS.items():
      self.assertEqual(got[(cname, "sizeof")], (ctypes.sizeof(st),), cname)
      for f, _ in st._fields_:
        desc = getattr(st, f)
        self.assertEqual(got[(cname, f)], (desc.offset, desc.size), "%s.%s" % (cname, f))


# ---------------------------------------------------------------------------------------------
@unittest.skipUnless(LIB and os.path.isfile(LIB), "MKERNEL_LIB does not name a built library")
class MoeRealLibraryTest(unittest.TestCase):
  """ctypes calls into the built libmkernel.so, refused on the host (no GPU needed)."""

  def setUp(self):
    _lib._reset_for_tests()
    self.lib = _lib.library()
    if getattr(self.lib, "ncclMoeDispatchGemm", None) is None:
      self.skipTest("%s predates the MoE calls" % LIB)

  def test_foreign_comm_refused_with_message(self):
    junk = ctypes.create_string_buffer(4096)  # not a communicator: looked up, never read
    x, idx, w, w1, w2 = ffn_args()
    for p in (_moe.plan("moe_dispatch_gemm", x, idx, w, w1, 1, 128),
              _moe.plan("moe_ffn", x, idx, w, w1, 1, 128, w2=w2)):
      with self.assertRaises(mkernel.MkernelError) as cm:
        if p.op == "moe_ffn":
          b = mkernel.MoeFfnBuffers(128, **{f: T((1,)) for f in _moe.FFN_BUFFER_FIELDS})
          _moe.invoke_ffn(self.lib, p, x, idx, w, w1, w2, T((100, 64)), b,
                          ctypes.addressof(junk), 0)
        else:
          res = mkernel.MoeDispatchResult(*[T((1,))] * 6)
          _moe.invoke_dispatch(self.lib, p, x, idx, w, w1, res, ctypes.addressof(junk), 0)
      self.assertEqual(cm.exception.result, _lib.NCCL_INVALID_ARGUMENT, str(cm.exception))
      self.assertIn("invalid communicator", str(cm.exception))
      self.assertIn(_moe.C_API[p.op], str(cm.exception))


@unittest.skipUnless(tm.HAVE_TORCH, "torch is not installed")
class MoeTorchCpuTest(unittest.TestCase):
  """Real torch tensors (CPU) go through the same checks, before any process group is needed."""

  def test_cpu_tensors_refused(self):
    import torch
    x = torch.zeros(16, 64, dtype=torch.bfloat16)
    idx = torch.zeros(16, 2, dtype=torch.int32)
    w = torch.zeros(16, 2)
    w1 = torch.zeros(2, 64, 64, dtype=torch.bfloat16)
    w2 = torch.zeros(2, 64, 32, dtype=torch.bfloat16)
    with self.assertRaisesRegex(ValueError, "x is on device cpu"):
      mkernel.moe_dispatch_gemm(x, idx, w, w1, max_rows=256)
    with self.assertRaisesRegex(ValueError, "x is on device cpu"):
      mkernel.moe_ffn(x, idx, w, w1, w2, max_rows=256)
    with self.assertRaisesRegex(TypeError, "max_rows is required"):
      mkernel.moe_ffn(x, idx, w, w1, w2)
    with self.assertRaisesRegex(ValueError, "CUDA device"):
      mkernel.moe_ffn_buffers(256, 64, 32, 2, torch.bfloat16, device="cpu")
    with self.assertRaisesRegex(TypeError, "dtype=float32 unsupported"):
      mkernel.moe_ffn_buffers(256, 64, 32, 2, torch.float32, device="cpu")
    with self.assertRaisesRegex(ValueError, "inter=0 must be a positive int"):
      mkernel.moe_ffn_buffers(256, 64, 0, 2)


if __name__ == "__main__":
  unittest.main()
