"""CPU-only tests of mkernel.ring_attention and its helpers: argument checks on stand-in
tensors, the sequence layouts (positions, zigzag_split / zigzag_merge on CPU torch tensors),
the ctypes mirror of ncclRingAttnConfig_t and of the prototype against include/mkernel/fused.h
(by parsing it, and by offsetof / sizeof / the initializer's values from a C program compiled
with the system's C compiler), the marshalling of the call and the error mapping through a
stand-in library, and with MKERNEL_LIB a real call into the library (refused on the host).

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
import test_moe as tmoe
from mkernel import _attention, _lib
import mkernel

T, BF16, F16, F32, I32 = tm.T, tm.BF16, tm.F16, tm.F32, tm.I32
HEADER, INCLUDE, LIB = tm.HEADER, tmoe.INCLUDE, tm.LIB


def qkv(B=2, S=96, Hq=8, Hkv=2, D=128, dt=BF16, **kw):
  return T((B, S, Hq, D), dt, **kw), T((B, S, Hkv, D), dt), T((B, S, Hkv, D), dt)


class AttnPlanTest(unittest.TestCase):

  def expect(self, exc, pattern, *args, **kwargs):
    with self.assertRaises(exc) as cm:
      _attention.plan(*args, **kwargs)
    self.assertRegex(str(cm.exception), pattern)
    self.assertTrue(str(cm.exception).startswith("mkernel.ring_attention: "), str(cm.exception))

  def test_defaults_and_shapes(self):
    q, k, v = qkv()
    p = _attention.plan(q, k, v, 4)
    self.assertEqual((p.B, p.S, p.Hq, p.Hkv, p.D, p.nranks), (2, 96, 8, 2, 128, 4))
    self.assertEqual((p.in_type, p.causal, p.scale, p.layout, p.algo, p.comm_sms),
                     (_lib.NCCL_BFLOAT16, False, 0.0, _lib.RING_ATTN_CONTIGUOUS, _lib.ALGO_AUTO,
                      -1))
    self.assertEqual((p.out_shape, p.lse_shape), ((2, 96, 8, 128), (2, 8, 96)))
    q, k, v = qkv(B=1, S=130, Hq=4, Hkv=4, D=64, dt=F16)
    p = _attention.plan(q, k, v, 3, causal=True, scale=0.25, layout="contiguous",
                        algo="sequential", comm_sms=1)
    self.assertEqual((p.in_type, p.causal, p.scale, p.algo, p.comm_sms),
                     (_lib.NCCL_FLOAT16, True, 0.25, _lib.ALGO_SEQUENTIAL, 1))
    for D in (64, 128, 256):
      _attention.plan(*qkv(D=D), 1, layout="zigzag", algo="fused", comm_sms=8, causal=1)
    p = _attention.plan(*qkv(Hq=16, Hkv=16), 8, layout=1, algo=2, scale=2)
    self.assertEqual((p.layout, p.algo, p.scale), (_lib.RING_ATTN_ZIGZAG, 2, 2.0))

  def test_tensor_rules(self):
    q, k, v = qkv()
    self.expect(TypeError, "q must be a torch.Tensor", "q", k, v, 1)
    self.expect(ValueError, r"q must be 4-D, got shape \(2, 96, 1024\)", T((2, 96, 1024)), k, v,
                1)
    self.expect(TypeError, "q has dtype float32; expected bfloat16 or float16",
                T((2, 96, 8, 128), F32), k, v, 1)
    self.expect(TypeError, "q is bfloat16 but k is float16", q, T((2, 96, 2, 128), F16), v, 1)
    self.expect(TypeError, "q is bfloat16 but v is float16", q, k, T((2, 96, 2, 128), F16), 1)
    self.expect(ValueError, "q is on device cpu; the fused calls take CUDA tensors",
                T((2, 96, 8, 128), device=tm.CPU), k, v, 1)
    self.expect(ValueError, "v is on cuda:1 but the first input is on cuda:0", q, k,
                T((2, 96, 2, 128), device=tm.CUDA1), 1)
    self.expect(ValueError, "k must be contiguous", q, T((2, 96, 2, 128), contiguous=False), v, 1)
    self.expect(ValueError, "q must be 16-byte aligned", T((2, 96, 8, 128), ptr=0x10008), k, v, 1)
    self.expect(ValueError, "v must be 16-byte aligned", q, k, T((2, 96, 2, 128), ptr=0x20002), 1)

  def test_shape_rules(self):
    q, k, v = qkv()
    self.expect(ValueError, r"k has shape \(2, 96, 2, 128\) but v has \(2, 96, 4, 128\)", q, k,
                T((2, 96, 4, 128)), 1)
    for bad in ((1, 96, 2, 128), (2, 95, 2, 128), (2, 96, 2, 64)):
      self.expect(ValueError, "B, S_local and D must agree", q, T(bad), T(bad), 1)
    self.expect(ValueError, "head dim D=96 unsupported; expected 64, 128 or 256", *qkv(D=96), 1)
    self.expect(ValueError, "head dim D=32", *qkv(D=32), 1)
    self.expect(ValueError, "Hq=8 .* multiple of Hkv=3", *qkv(Hkv=3), 1)
    self.expect(ValueError, "Hq=2 .* multiple of Hkv=8", *qkv(Hq=2, Hkv=8), 1)
    self.expect(ValueError, "Hq=8 .* multiple of Hkv=0", *qkv(Hkv=0), 1)
    self.expect(ValueError, "batch=0 and S_local=96 must be >= 1", *qkv(B=0), 1)
    self.expect(ValueError, "S_local=0", *qkv(S=0), 1)
    self.expect(ValueError, "S_local=95 must be even with layout='zigzag'", *qkv(S=95), 2,
                layout="zigzag")
    _attention.plan(*qkv(S=95), 2, causal=True)  # any S_local when contiguous
    # 2^31 bounds: q itself, the whole sequence, the gathered k and v.
    self.expect(ValueError, "q has 2147483648 elements", *qkv(B=1, S=1 << 21, Hq=8, Hkv=1), 1)
    self.expect(ValueError, r"nranks\*S_local=128\*16777216, must be below 2\^31",
                *qkv(B=1, S=1 << 24, Hq=1, Hkv=1, D=64), 128)
    self.expect(ValueError, "the gathered k .* must be below 2\\^31",
                *qkv(B=1, S=1 << 16, Hq=32, Hkv=2, D=128), 128)
    _attention.plan(*qkv(B=1, S=1 << 16, Hq=32, Hkv=2, D=128), 64)

  def test_option_rules(self):
    q, k, v = qkv()
    # 1e-50 and 1e40 are finite doubles but 0 and inf as the config's 32-bit float.
    for bad in (0, -1.0, float("nan"), float("inf"), -float("inf"), 1e-50, 1e40):
      self.expect(ValueError, "scale=.* must be finite and > 0 as a 32-bit float \\(None "
                  "selects 1/sqrt", q, k, v, 1, scale=bad)
    self.assertAlmostEqual(_attention.plan(q, k, v, 1, scale=1e-30).scale, 1e-30, delta=1e-36)
    for bad in ("0.1", True, [0.1]):
      self.expect(TypeError, "scale=.* must be a float", q, k, v, 1, scale=bad)
    self.expect(TypeError, "causal=2 must be a bool", q, k, v, 1, causal=2)
    self.expect(TypeError, "causal='yes' must be a bool", q, k, v, 1, causal="yes")
    self.expect(ValueError, "layout='striped'; expected one of contiguous, zigzag", q, k, v, 1,
                layout="striped")
    self.expect(ValueError, "layout=2", q, k, v, 1, layout=2)
    self.expect(ValueError, "algo='ring'; expected one of auto, fused, sequential", q, k, v, 1,
                algo="ring")
    self.expect(ValueError, "comm_sms=-2; expected -1 \\(automatic\\) or an int >= 1", q, k, v, 1,
                comm_sms=-2)
    self.expect(ValueError, "comm_sms=0; expected -1", q, k, v, 1, comm_sms=0)
    self.expect(ValueError, "comm_sms=1.5", q, k, v, 1, comm_sms=1.5)
    self.expect(ValueError, "the group has 0 ranks", q, k, v, 0)

  def test_out_and_lse(self):
    q, k, v = qkv()
    out, lse = T((2, 96, 8, 128)), T((2, 8, 96), F32)
    _attention.plan(q, k, v, 2, out=out, lse=lse)
    self.expect(ValueError, r"out has shape \(2, 96, 2, 128\); expected \(2, 96, 8, 128\) like q",
                q, k, v, 2, out=T((2, 96, 2, 128)))
    self.expect(TypeError, "out has dtype float16; it must be q's \\(bfloat16\\)", q, k, v, 2,
                out=T((2, 96, 8, 128), F16))
    self.expect(ValueError, "out must be 16-byte aligned", q, k, v, 2,
                out=T((2, 96, 8, 128), ptr=0x30004))
    self.expect(ValueError, r"lse has shape \(2, 96, 8\); expected \[B, Hq, S_local\] = "
                r"\(2, 8, 96\)", q, k, v, 2, lse=T((2, 96, 8), F32))
    self.expect(TypeError, "lse has dtype bfloat16; expected float32", q, k, v, 2,
                lse=T((2, 8, 96)))
    self.expect(ValueError, "lse must be contiguous", q, k, v, 2,
                lse=T((2, 8, 96), F32, contiguous=False))
    self.expect(ValueError, "lse must be 4-byte aligned", q, k, v, 2,
                lse=T((2, 8, 96), F32, ptr=0x40002))
    _attention.plan(q, k, v, 2, lse=T((2, 8, 96), F32, ptr=0x40004))  # 4 bytes are enough
    for name, t in (("q", q), ("k", k), ("v", v)):
      self.expect(ValueError, "out must not overlap %s" % name, q, k, v, 2,
                  out=T((2, 96, 8, 128), ptr=t.ptr + 64))
    for name, t in (("q", q), ("v", v), ("out", out)):
      self.expect(ValueError, "lse must not overlap %s" % name, q, k, v, 2, out=out,
                  lse=T((2, 8, 96), F32, ptr=t.ptr + 32))
    # Adjacent, not overlapping: fine.
    nbytes = 2 * 96 * 8 * 128 * 2
    q = T((2, 96, 8, 128), ptr=0x7E0000000000)
    _attention.plan(q, k, v, 2, out=T((2, 96, 8, 128), ptr=q.ptr + nbytes),
                    lse=T((2, 8, 96), F32, ptr=q.ptr + 2 * nbytes))


class PositionsTest(unittest.TestCase):
  """The layouts of fused.h, without torch."""

  def test_contiguous(self):
    self.assertEqual(_attention.positions(0, 1, 3), [0, 1, 2])
    self.assertEqual(_attention.positions(2, 4, 3), [6, 7, 8])
    self.assertEqual(_attention.positions(1, 3, 5, 0), [5, 6, 7, 8, 9])

  def test_zigzag(self):
    # 3 ranks, C = 2: chunks 0..5; rank r holds chunks r and 5-r.
    got = [_attention.positions(r, 3, 4, "zigzag") for r in range(3)]
    self.assertEqual(got, [[0, 1, 10, 11], [2, 3, 8, 9], [4, 5, 6, 7]])
    self.assertEqual(sorted(sum(got, [])), list(range(12)))  # a permutation of the sequence
    self.assertEqual(_attention.positions(0, 1, 6, "zigzag"), list(range(6)))
    # Causal work per rank (keys at or before each query) is the same on every rank.
    n, S = 4, 16
    work = [sum(p + 1 for p in _attention.positions(r, n, S, "zigzag")) for r in range(n)]
    self.assertEqual(len(set(work)), 1, work)

  def test_rules(self):
    with self.assertRaisesRegex(ValueError, "seq_local=5 must be even with layout='zigzag'"):
      _attention.positions(0, 2, 5, "zigzag")
    with self.assertRaisesRegex(ValueError, r"rank=2 must be in \[0, nranks=2\)"):
      _attention.positions(2, 2, 4)
    with self.assertRaisesRegex(ValueError, "seq_local=0"):
      _attention.positions(0, 2, 0)
    with self.assertRaisesRegex(ValueError, "layout='zz'"):
      _attention.positions(0, 2, 4, "zz")
    with self.assertRaisesRegex(ValueError, "multiple of 2\\*nranks=6"):
      _attention.zigzag_chunk_size("zigzag_split", 16, 3)
    self.assertEqual(_attention.zigzag_chunk_size("zigzag_split", 18, 3), 3)


@unittest.skipUnless(tm.HAVE_TORCH, "torch is not installed")
class ZigzagTorchTest(unittest.TestCase):
  """zigzag_split / zigzag_merge / seq_positions on CPU tensors."""

  def test_split_matches_positions(self):
    import torch
    n, C = 3, 5
    full = torch.randn(2, 2 * n * C, 4, 8).to(torch.bfloat16)
    for r in range(n):
      part = mkernel.zigzag_split(full, r, n)
      self.assertEqual(tuple(part.shape), (2, 2 * C, 4, 8))
      self.assertTrue(part.is_contiguous())
      pos = mkernel.seq_positions(r, n, 2 * C, "zigzag")
      self.assertEqual(pos.dtype, torch.int64)
      self.assertTrue(torch.equal(part, full[:, pos]))
      self.assertTrue(torch.equal(mkernel.seq_positions(r, n, 2 * C),
                                  torch.arange(r * 2 * C, (r + 1) * 2 * C)))

  def test_merge_inverts_split(self):
    import torch
    for n in (1, 2, 4):
      full = torch.arange(3 * 8 * n * 2, dtype=torch.float32).view(3, 2, 8 * n)  # [B, H, S]
      parts = [mkernel.zigzag_split(full, r, n, dim=-1) for r in range(n)]
      self.assertTrue(torch.equal(mkernel.zigzag_merge(parts, dim=2), full))
      self.assertTrue(torch.equal(mkernel.zigzag_merge(parts, dim=-1), full))
      # The merged positions of every rank's slice are the whole sequence in order.
      pos = [mkernel.seq_positions(r, n, 8, "zigzag").view(1, 8) for r in range(n)]
      self.assertTrue(torch.equal(mkernel.zigzag_merge(pos), torch.arange(8 * n).view(1, -1)))

  def test_errors(self):
    import torch
    x = torch.zeros(1, 12, 2, 64)
    with self.assertRaisesRegex(ValueError, "zigzag_split: the sequence has 12 positions; zigzag "
                                "needs a multiple of 2\\*nranks=8"):
      mkernel.zigzag_split(x, 0, 4)
    with self.assertRaisesRegex(ValueError, r"rank=3 must be in \[0, nranks=3\)"):
      mkernel.zigzag_split(x, 3, 3)
    with self.assertRaisesRegex(ValueError, "dim=4 out of range for a 4-D tensor"):
      mkernel.zigzag_split(x, 0, 1, dim=4)
    with self.assertRaisesRegex(TypeError, "zigzag_split: expected a torch.Tensor"):
      mkernel.zigzag_split([1, 2], 0, 1)
    with self.assertRaisesRegex(ValueError, r"slice 1 has shape \(1, 6, 2, 64\)"):
      mkernel.zigzag_merge([x, torch.zeros(1, 6, 2, 64)])
    with self.assertRaisesRegex(ValueError, "even count"):
      mkernel.zigzag_merge([torch.zeros(1, 5, 2, 64)])
    with self.assertRaisesRegex(TypeError, "non-empty list"):
      mkernel.zigzag_merge([])

  def test_cpu_tensors_refused(self):
    import torch
    q = torch.zeros(1, 64, 4, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 64, 2, 64, dtype=torch.bfloat16)
    with self.assertRaisesRegex(ValueError, "q is on device cpu"):
      mkernel.ring_attention(q, k, k)
    with self.assertRaisesRegex(TypeError, "q has dtype float32"):
      mkernel.ring_attention(q.float(), k, k)
    with self.assertRaisesRegex(ValueError, "zigzag_split: the sequence has 12 positions"):
      mkernel.zigzag_split(torch.zeros(1, 12, 2, 64), 0, 4)


# ---------------------------------------------------------------------------------------------
class FakeAttnLib(tm.StandInLib):
  """Records ncclRingAttention's arguments (the config as a dict)."""

  def ncclRingAttention(self, *args):
    self.calls.append([tm.plain_arg(a) for a in args])
    return self.result


class AttnInvokeTest(unittest.TestCase):

  def test_marshalling(self):
    q, k, v = qkv(dt=F16)
    out, lse = T((2, 96, 8, 128), F16), T((2, 8, 96), F32)
    p = _attention.plan(q, k, v, 4, causal=True, scale=0.125, layout="zigzag", algo="fused",
                        comm_sms=6, out=out, lse=lse)
    lib = FakeAttnLib()
    _attention.invoke(lib, p, q, k, v, out, lse, 0xC0FFEE, 0x5EED)
    a = lib.calls[0]
    self.assertEqual(a[:5], [q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr])
    self.assertEqual(a[5:11], [2, 96, 8, 2, 128, _lib.NCCL_FLOAT16])
    self.assertEqual(a[11], {"size": ctypes.sizeof(_lib.RingAttnConfig), "magic": 0x6D6B5261,
                             "version": 1, "causal": 1, "scale": 0.125,
                             "seqLayout": _lib.RING_ATTN_ZIGZAG, "commSms": 6,
                             "algo": _lib.ALGO_FUSED})
    self.assertEqual(a[12:], [0xC0FFEE, 0x5EED])
    # Defaults: no lse (NULL), scale 0 (the library's 1/sqrt(D)), contiguous, auto.
    p = _attention.plan(q, k, v, 1)
    _attention.invoke(lib, p, q, k, v, out, None, 1, 2)
    a = lib.calls[1]
    self.assertIsNone(a[4])
    self.assertEqual((a[11]["causal"], a[11]["scale"], a[11]["seqLayout"], a[11]["commSms"],
                      a[11]["algo"]), (0, 0.0, _lib.RING_ATTN_CONTIGUOUS, -1, _lib.ALGO_AUTO))

  def test_error_mapping(self):
    q, k, v = qkv()
    p = _attention.plan(q, k, v, 2)
    lib = FakeAttnLib(result=4, message="ncclRingAttention: headDim=96 must be 64, 128 or 256")
    with self.assertRaises(mkernel.MkernelError) as cm:
      _attention.invoke(lib, p, q, k, v, T((2, 96, 8, 128)), None, 1, 2)
    e = cm.exception
    self.assertEqual((e.result, e.result_name, e.api),
                     (4, "ncclInvalidArgument", "ncclRingAttention"))
    self.assertIn("headDim=96 must be", str(e))

  def test_library_without_ring_attention(self):

    class Old:
      path, how = "/old/libmkernel.so", "MKERNEL_LIB"
      require = _lib.Library.require

    with self.assertRaisesRegex(mkernel.MkernelError, "does not export ncclRingAttention"):
      _attention.invoke(Old(), _attention.plan(*qkv(), 1), *qkv(), T((2, 96, 8, 128)), None, 1,
                        2)


# ---------------------------------------------------------------------------------------------
def _ctype_of(ctype):
  ctype = " ".join(ctype.replace("*", " * ").split()).replace(" *", "*")
  if ctype.endswith("*"):
    base = ctype[:-1].replace("const ", "").strip()
    return ctypes.POINTER(_lib.RingAttnConfig) if base == "ncclRingAttnConfig_t" else \
        ctypes.c_void_p
  return {"size_t": ctypes.c_size_t, "unsigned int": ctypes.c_uint, "int": ctypes.c_int,
          "float": ctypes.c_float, "ncclDataType_t": ctypes.c_int, "ncclComm_t": ctypes.c_void_p,
          "cudaStream_t": ctypes.c_void_p}[ctype]


class AttnHeaderTest(unittest.TestCase):
  """The ctypes mirror and the constants match include/mkernel/fused.h."""

  def setUp(self):
    if not os.path.isfile(HEADER):
      self.skipTest("include/mkernel/fused.h not next to this package (installed copy)")
    with open(HEADER) as f:
      self.text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    if "ncclRingAttnConfig_t" not in self.text:
      self.skipTest("fused.h predates ncclRingAttention")

  def test_struct_fields(self):
    body = re.search(r"typedef struct\s*{([^{}]*)}\s*ncclRingAttnConfig_t;", self.text).group(1)
    want = [(n, _ctype_of(t)) for t, n in re.findall(r"(\w[\w\s\*]*?)\s*\b(\w+)\s*;", body)]
    self.assertEqual(list(_lib.RingAttnConfig._fields_), want)

  def test_prototype(self):
    for name, argtypes in _lib.ATTN_PROTOS.items():
      for prefix in ("", "p"):
        m = re.search(r"ncclResult_t %s%s\((.*?)\);" % (prefix, name), self.text, re.S)
        self.assertIsNotNone(m, prefix + name)
        params = [s.strip() for s in m.group(1).split(",")]
        want = [_ctype_of(re.match(r"(.*?)\s*\b\w+$", s).group(1)) for s in params]
        self.assertEqual(argtypes, want, prefix + name)

  def test_constants(self):

    def val(name):
      return int(re.search(r"\b%s\s*=?\s*(0x[0-9a-fA-F]+|\d+)u?\b" % name, self.text).group(1), 0)

    self.assertEqual((val("NCCL_RING_ATTN_CONFIG_MAGIC"), val("NCCL_RING_ATTN_CONFIG_VERSION")),
                     (_lib.RING_ATTN_CONFIG_MAGIC, _lib.RING_ATTN_CONFIG_VERSION))
    self.assertEqual((val("ncclRingAttnContiguous"), val("ncclRingAttnZigzag")),
                     (_lib.RING_ATTN_CONTIGUOUS, _lib.RING_ATTN_ZIGZAG))


class AttnLayoutFromCompilerTest(unittest.TestCase):
  """offsetof / sizeof of every field of ncclRingAttnConfig_t from a C program that includes
  fused.h, and the values of NCCL_RING_ATTN_CONFIG_INITIALIZER against ring_attention's
  defaults (what the Python call passes when given no option)."""

  def test_offsets_sizes_and_initializer(self):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc or not os.path.isfile(HEADER):
      self.skipTest("no C compiler or no include/mkernel/fused.h")
    with open(HEADER) as f:
      if "ncclRingAttnConfig_t" not in f.read():
        self.skipTest("fused.h predates ncclRingAttention")
    st, cname = _lib.RingAttnConfig, "ncclRingAttnConfig_t"
    lines = ['printf("sizeof %%zu\\n", sizeof(%s));' % cname,
             "%s d = NCCL_RING_ATTN_CONFIG_INITIALIZER;" % cname]
    for f, _ in st._fields_:
      lines.append('printf("%s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s*)0)->%s));' %
                   (f, cname, f, cname, f))
      fmt, cast = ("%.9g", "(double)") if f == "scale" else ("%llu", "(unsigned long long)")
      lines.append('printf("init %s %s\\n", %sd.%s);' % (f, fmt, cast, f))
    src = ("#include <stddef.h>\n#include <stdio.h>\n#include \"mkernel/fused.h\"\n"
           "int main(void) {\n%s\nreturn 0;\n}\n" % "\n".join(lines))
    with tempfile.TemporaryDirectory() as d:
      incs = tmoe._real_include_dirs()
      if incs is None:
        for name, text in (("nccl.h", tmoe.STUB_NCCL), ("cuda_runtime.h", tmoe.STUB_CUDA)):
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
    got, init = {}, {}
    for line in out.splitlines():
      parts = line.split()
      if parts[0] == "init":
        init[parts[1]] = float(parts[2]) if parts[1] == "scale" else int(parts[2])
      else:
        got[parts[0]] = tuple(int(x) for x in parts[1:])
    self.assertEqual(got["sizeof"], (ctypes.sizeof(st),))
    for f, _ in st._fields_:
      desc = getattr(st, f)
      self.assertEqual(got[f], (desc.offset, desc.size), f)
    p = _attention.plan(*qkv(), 1)
    cfg = _lib.make_ring_attn_config(p.causal, p.scale, p.layout, p.comm_sms, p.algo)
    mine = {f: getattr(cfg, f) for f, _ in st._fields_}
    mine["commSms"] &= 0xFFFFFFFF  # printed as unsigned
    init["commSms"] &= 0xFFFFFFFF
    self.assertEqual(mine, init)


# ---------------------------------------------------------------------------------------------
@unittest.skipUnless(LIB and os.path.isfile(LIB), "MKERNEL_LIB does not name a built library")
class AttnRealLibraryTest(unittest.TestCase):
  """A ctypes call into the built libmkernel.so, refused on the host (no GPU needed)."""

  def setUp(self):
    _lib._reset_for_tests()
    self.lib = _lib.library()
    if getattr(self.lib, "ncclRingAttention", None) is None:
      self.skipTest("%s predates ncclRingAttention" % LIB)

  def test_foreign_comm_refused_with_message(self):
    junk = ctypes.create_string_buffer(4096)  # not a communicator: looked up, never read
    q, k, v = qkv()
    p = _attention.plan(q, k, v, 1, causal=True)
    with self.assertRaises(mkernel.MkernelError) as cm:
      _attention.invoke(self.lib, p, q, k, v, T((2, 96, 8, 128)), T((2, 8, 96), F32),
                        ctypes.addressof(junk), 0)
    self.assertEqual(cm.exception.result, _lib.NCCL_INVALID_ARGUMENT, str(cm.exception))
    self.assertIn("ncclRingAttention", str(cm.exception))
    self.assertIn("communicator", str(cm.exception))


if __name__ == "__main__":
  unittest.main()
