"""Shared helpers of the mkernel PyTorch tests (run under torchrun with LD_PRELOAD=libmkernel.so).

Every test process:
  * binds its rank to GPU LOCAL_RANK % device_count (one GPU: every rank on cuda:0),
  * initialises the "nccl" process group (eagerly, with device_id, unless MK_TORCH_EAGER=0),
  * records checks in a Report; FAIL lines are printed by the rank that saw them, PASS lines
    and the merged summary by rank 0. Results are merged through the c10d TCPStore, which does
    not depend on the collectives under test.
The last line of rank 0 is "MK_RESULT <test> PASS|FAIL ..." (the runner greps it) and every rank
exits non-zero when any check failed on any rank.

Inputs come from torch.Generator seeded with (MK_TORCH_SEED, test, rank, ...), so every rank can
rebuild every other rank's inputs and compute the reference itself, in float64 (exact int64).
"""

import ctypes
import datetime
import json
import os
import struct
import sys
import time
import traceback
import zlib

import torch
import torch.distributed as dist

BASE_SEED = int(os.environ.get("MK_TORCH_SEED", "20240611"))

# Relative rounding step (2 * unit roundoff) of the element types under test.
EPS = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-10,
       torch.float64: 2.0**-52}


def log(msg):
  print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------------------------
class Ctx:
  """Rank, device and process-group state of one test process."""

  def __init__(self, test_name, init_pg=True):
    self.test = test_name
    piddir = os.environ.get("MK_TORCH_PIDDIR")
    if piddir:  # lets the runner kill exactly the workers left over by a timeout
      try:
        open(os.path.join(piddir, str(os.getpid())), "w").close()
      except OSError:
        pass
    self.rank = int(os.environ["RANK"])
    self.world = int(os.environ["WORLD_SIZE"])
    self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
    ndev = torch.cuda.device_count()
    if ndev < 1:
      raise RuntimeError("no CUDA device visible (torch.cuda.device_count() == 0)")
    self.dev_index = self.local_rank % ndev
    torch.cuda.set_device(self.dev_index)
    self.device = torch.device("cuda", self.dev_index)
    self.report = Report(self)
    self.store = None
    if init_pg:
      self.init_pg()

  def init_pg(self, store=None):
    """init_process_group("nccl"); env:// rendezvous unless a store is given."""
    eager = os.environ.get("MK_TORCH_EAGER", "1") != "0"
    timeout = datetime.timedelta(seconds=int(os.environ.get("MK_TORCH_PG_TIMEOUT_S", "120")))
    kwargs = {"backend": "nccl", "timeout": timeout}
    if store is not None:
      kwargs.update(store=store, rank=self.rank, world_size=self.world)
    if eager:
      kwargs["device_id"] = self.device
    t0 = time.time()
    dist.init_process_group(**kwargs)
    self.store = dist.distributed_c10d._get_default_store()
    if self.rank == 0:
      log("[%s] world=%d devices=%d rank->device=LOCAL_RANK%%%d eager_init=%s init=%.2fs" %
          (self.test, self.world, torch.cuda.device_count(), torch.cuda.device_count(), eager,
           time.time() - t0))
      print_environment(self.test)

  def finish(self):
    """Merges the reports of all ranks, prints the summary (rank 0), tears down, exits."""
    ok = self.report.merge_and_print()
    try:
      if dist.is_initialized():
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - teardown problems are reported, not fatal
      log("[rank %d] WARN destroy_process_group raised: %s" % (self.rank, e))
      ok = False
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)


def print_environment(test):
  try:
    _print_environment(test)
  except Exception as e:  # noqa: BLE001 - information only
    log("[%s] could not print the environment: %s" % (test, e))


def _print_environment(test):
  keys = sorted(k for k in os.environ
                if k.startswith(("TORCH_NCCL", "NCCL_", "MKERNEL_", "CUDA_MPS", "LD_PRELOAD",
                                 "TORCH_DISTRIBUTED", "CUDA_VISIBLE")))
  for k in keys:
    log("[%s] env %s=%s" % (test, k, os.environ[k]))
  log("[%s] torch %s, torch.cuda.nccl.version() = %s" %
      (test, torch.__version__, torch.cuda.nccl.version()))
  try:
    v = ctypes.c_int(0)
    fn = ctypes.CDLL(None).ncclGetVersion
    fn(ctypes.byref(v))
    log("[%s] ncclGetVersion() via the process's global symbol scope = %d (resolves to %s)" %
        (test, v.value, object_of_address(ctypes.cast(fn, ctypes.c_void_p).value)))
  except Exception as e:  # noqa: BLE001
    log("[%s] ncclGetVersion() lookup failed: %s" % (test, e))


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------
class Report:
  """Per-rank check results, merged on rank 0 through the TCPStore."""

  def __init__(self, ctx):
    self.ctx = ctx
    self.results = {}  # name -> [status, detail]; order of insertion kept
    self.order = []

  def _set(self, name, status, detail):
    if name not in self.results:
      self.order.append(name)
      self.results[name] = [status, detail]
      return
    cur = self.results[name]
    rank = {"PASS": 0, "SKIP": 1, "FAIL": 2}
    if rank[status] > rank[cur[0]]:
      self.results[name] = [status, detail]
    elif status == cur[0] == "PASS" and detail:
      cur[1] = detail

  def ok(self, name, detail=""):
    self._set(name, "PASS", detail)

  def skip(self, name, reason):
    self._set(name, "SKIP", reason)
    if self.ctx.rank == 0:
      log("SKIP %s: %s" % (name, reason))

  def fail(self, name, detail):
    self._set(name, "FAIL", detail)
    log("FAIL [rank %d] %s: %s" % (self.ctx.rank, name, detail))

  def check(self, name, cond, detail=""):
    if cond:
      self.ok(name, detail)
    else:
      self.fail(name, detail)
    return cond

  def run(self, name, fn, *args, **kwargs):
    """Runs fn; an exception becomes a FAIL of `name` (with traceback) instead of a crash."""
    try:
      return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
      self.fail(name, "exception %s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()))
      return None

  def merge_and_print(self):
    ctx = self.ctx
    mine = {"order": self.order, "results": self.results}
    merged_ok = True
    if ctx.store is None or ctx.world == 1:
      all_reports = {ctx.rank: mine}
    else:
      key = "mk_report/%s/%d" % (ctx.test, ctx.rank)
      ctx.store.set(key, json.dumps(mine))
      all_reports = None
      if ctx.rank == 0:
        keys = ["mk_report/%s/%d" % (ctx.test, r) for r in range(ctx.world)]
        try:
          ctx.store.wait(keys, datetime.timedelta(seconds=120))
          all_reports = {r: json.loads(ctx.store.get(keys[r])) for r in range(ctx.world)}
        except Exception as e:  # noqa: BLE001
          log("FAIL [rank 0] could not collect the reports of all ranks: %s" % e)
          all_reports = {0: mine}
          merged_ok = False
      # Every rank learns the merged verdict so that all exit codes agree.
      ack = "mk_verdict_ack/%s" % ctx.test
      if ctx.rank == 0:
        verdict = "PASS" if merged_ok and not _any_fail(all_reports) else "FAIL"
        ctx.store.set("mk_verdict/%s" % ctx.test, verdict)
        # The store may live in this process (no torchrun agent): stay until all have read it.
        deadline = time.time() + 60
        while ctx.store.add(ack, 0) < ctx.world - 1 and time.time() < deadline:
          time.sleep(0.05)
      else:
        try:
          ctx.store.wait(["mk_verdict/%s" % ctx.test], datetime.timedelta(seconds=180))
          verdict = ctx.store.get("mk_verdict/%s" % ctx.test).decode()
          ctx.store.add(ack, 1)
        except Exception:  # noqa: BLE001
          verdict = "FAIL"
        return verdict == "PASS" and not _any_fail({ctx.rank: mine})
    # Rank 0 (or single process): print the merged table.
    names = []
    for r in sorted(all_reports):
      for n in all_reports[r]["order"]:
        if n not in names:
          names.append(n)
    npass = nfail = nskip = 0
    log("")
    log("==== %s: results over %d rank(s) ====" % (ctx.test, len(all_reports)))
    for n in names:
      statuses = {r: all_reports[r]["results"].get(n, ["MISSING", "not run on this rank"])
                  for r in all_reports}
      bad = [r for r, s in statuses.items() if s[0] in ("FAIL", "MISSING")]
      skipped = all(s[0] == "SKIP" for s in statuses.values())
      if bad:
        nfail += 1
        first = statuses[bad[0]]
        log("FAIL  %-58s ranks %s: %s" % (n, bad, first[1].splitlines()[0] if first[1] else ""))
      elif skipped:
        nskip += 1
        log("SKIP  %-58s %s" % (n, statuses[min(statuses)][1]))
      else:
        npass += 1
        log("PASS  %-58s %s" % (n, statuses[0][1] if 0 in statuses else ""))
    verdict = "PASS" if (nfail == 0 and merged_ok and npass > 0) else "FAIL"
    log("MK_RESULT %s %s passed=%d failed=%d skipped=%d" % (ctx.test, verdict, npass, nfail, nskip))
    return verdict == "PASS"


def _any_fail(reports):
  return any(s[0] == "FAIL" for rep in reports.values() for s in rep["results"].values())


# ---------------------------------------------------------------------------------------------
# Deterministic inputs and references
# ---------------------------------------------------------------------------------------------
def seed_of(*parts):
  return (BASE_SEED * 1000003 + zlib.crc32(repr(parts).encode())) & 0x7FFFFFFFFFFF


def make_input(n, dtype, *parts):
  """Random CPU tensor of n elements, a pure function of (MK_TORCH_SEED, parts)."""
  g = torch.Generator()
  g.manual_seed(seed_of(*parts))
  if dtype.is_floating_point:
    return torch.randn(n, generator=g, dtype=torch.float32).to(dtype)
  # Values beyond 32 bits catch int64 handled as int32 or as double.
  return torch.randint(-(2**40), 2**40, (n,), generator=g, dtype=torch.int64)


def poison_like(t):
  """Fills a tensor with a value no correct result contains (NaN or 0x5A5A...)."""
  if t.dtype.is_floating_point:
    t.fill_(float("nan"))
  else:
    t.fill_(0x5A5A5A5A5A5A5A5A if t.dtype == torch.int64 else 0x5A)
  return t


def compare(got, ref, tol=None):
  """Compares every element. got: tensor in the tested dtype (any device); ref: float64/int64 CPU.

  tol: None for exact, else a float64 tensor (per element) or float. Returns (ok, detail).
  """
  got = got.detach().cpu()
  if got.numel() != ref.numel():
    return False, "size %d != expected %d" % (got.numel(), ref.numel())
  got = got.reshape(-1)
  ref = ref.reshape(-1)
  if not got.dtype.is_floating_point:
    bad = got.to(torch.int64) != ref
    nbad = int(bad.sum())
    if nbad == 0:
      return True, "exact, n=%d" % got.numel()
    i = int(bad.nonzero()[0])
    return False, "%d/%d wrong, first at %d: got %d expected %d" % (
        nbad, got.numel(), i, int(got[i]), int(ref[i]))
  g64 = got.to(torch.float64)
  err = (g64 - ref).abs()
  if tol is None:
    tol_t = torch.zeros_like(ref)
  elif isinstance(tol, torch.Tensor):
    tol_t = tol.reshape(-1)
  else:
    tol_t = torch.full_like(ref, float(tol))
  bad = ~(err <= tol_t)  # NaN counts as bad
  nbad = int(bad.sum())
  maxerr = float(err[~torch.isnan(err)].max()) if got.numel() and not bool(
      torch.isnan(err).all()) else float("nan")
  if nbad == 0:
    return True, "max|err|=%.3g n=%d" % (maxerr if got.numel() else 0.0, got.numel())
  i = int(bad.nonzero()[0])
  return False, "%d/%d outside tolerance, first at %d: got %r expected %r (tol %.3g)" % (
      nbad, got.numel(), i, float(g64[i]), float(ref[i]), float(tol_t[i]))


def sum_tolerance(dtype, abs_sum, nterms, ref=None, scale=1.0):
  """Per-element bound on |computed - exact| for a sum of nterms values (any order, any
  intermediate precision not below dtype): nterms * eps * scale * sum|x| + eps * |ref|.

  eps = 2u (u = unit roundoff of dtype), so the first term is 2x the classic (n-1)u sum|x|
  bound of recursive summation; the second covers the final rounding to dtype.
  """
  eps = EPS[dtype]
  tol = abs_sum * (nterms * eps * abs(scale))
  if ref is not None:
    tol = tol + ref.abs() * eps
  return tol + 1e-300


# ---------------------------------------------------------------------------------------------
# Proof that no NCCL call reaches the real libnccl: read the GOT of every loaded object
# ---------------------------------------------------------------------------------------------
class _DlPhdrInfo(ctypes.Structure):
  _fields_ = [("dlpi_addr", ctypes.c_size_t), ("dlpi_name", ctypes.c_char_p),
              ("dlpi_phdr", ctypes.c_void_p), ("dlpi_phnum", ctypes.c_uint16)]


class _DlInfo(ctypes.Structure):
  _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
              ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


_libc = ctypes.CDLL(None)
try:
  _dladdr = _libc.dladdr
except AttributeError:  # glibc < 2.34 keeps dladdr in libdl
  _dladdr = ctypes.CDLL("libdl.so.2").dladdr
_dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
_dladdr.restype = ctypes.c_int


def object_of_address(addr):
  """Path of the loaded object that contains addr (dladdr), or '' if none."""
  if not addr:
    return ""
  info = _DlInfo()
  if _dladdr(ctypes.c_void_p(addr), ctypes.byref(info)) == 0 or not info.dli_fname:
    return ""
  return info.dli_fname.decode(errors="replace")


def loaded_objects():
  """[(path, load bias)] of every object in the process (dl_iterate_phdr)."""
  out = []
  cbtype = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_DlPhdrInfo), ctypes.c_size_t,
                            ctypes.c_void_p)

  def cb(info, size, data):
    name = info.contents.dlpi_name
    out.append(((name or b"").decode(errors="replace"), info.contents.dlpi_addr))
    return 0

  keep = cbtype(cb)
  _libc.dl_iterate_phdr(keep, None)
  return out


# Relocation types that hold the address of a symbol: x86_64 64/GLOB_DAT/JUMP_SLOT,
# aarch64 ABS64/GLOB_DAT/JUMP_SLOT.
_RELOC_TYPES = {62: (1, 6, 7), 183: (257, 1025, 1026)}


def _nccl_relocations(path):
  """[(symbol, r_offset)] of relocations in `path` that bind an undefined nccl*/pnccl* symbol."""
  with open(path, "rb") as f:
    ident = f.read(16)
    if len(ident) < 16 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
      return []
    (_, e_machine, _, _, _, e_shoff, _, _, _, _, e_shentsize, e_shnum,
     _) = struct.unpack("<HHIQQQIHHHHHH", f.read(48))
    if e_shoff == 0 or e_shnum == 0 or e_machine not in _RELOC_TYPES:
      return []
    f.seek(e_shoff)
    raw = f.read(e_shnum * e_shentsize)
    shdrs = [struct.unpack_from("<IIQQQQIIQQ", raw, i * e_shentsize) for i in range(e_shnum)]

    def section(i):
      f.seek(shdrs[i][4])
      return f.read(shdrs[i][5])

    out = []
    for di, sh in enumerate(shdrs):
      if sh[1] != 11:  # SHT_DYNSYM
        continue
      strtab = section(sh[6])
      wanted = {}
      for idx, (st_name, _, _, st_shndx, _, _) in enumerate(struct.iter_unpack("<IBBHQQ",
                                                                               section(di))):
        if st_shndx != 0:
          continue
        head = strtab[st_name:st_name + 5]
        if head.startswith(b"nccl") or head == b"pnccl":
          end = strtab.index(b"\0", st_name)
          wanted[idx] = strtab[st_name:end].decode()
      if not wanted:
        continue
      types = _RELOC_TYPES[e_machine]
      for rsh_i, rsh in enumerate(shdrs):
        if rsh[1] != 4 or rsh[6] != di:  # SHT_RELA linked to this dynsym
          continue
        for r_offset, r_info, _ in struct.iter_unpack("<QQq", section(rsh_i)):
          sym = r_info >> 32
          if sym in wanted and (r_info & 0xFFFFFFFF) in types:
            out.append((wanted[sym], r_offset))
    return out


def nccl_binding_check(report, name="no_call_reaches_real_libnccl", require=("ncclAllReduce",),
                       verbose=False):
  """For every loaded object except libmkernel/libnccl: reads each GOT slot that holds an imported
  nccl*/pnccl* symbol and asks dladdr which object the slot points into.

  PASS: libmkernel is loaded, at least one object imports NCCL symbols, every resolved slot points
  into libmkernel, and the symbols in `require` (called before this check) are resolved there.
  Slots still pointing into their own object are lazy PLT entries never called (reported).
  """
  objs = loaded_objects()
  mk = [p for p, _ in objs if "libmkernel" in os.path.basename(p)]
  real = [p for p, _ in objs if os.path.basename(p).startswith("libnccl")]
  if not mk:
    report.fail(name, "libmkernel is not loaded in this process: LD_PRELOAD not effective (%s)" %
                os.environ.get("LD_PRELOAD", "LD_PRELOAD unset"))
    return False
  to_mk, lazy, wrong, importers = {}, {}, [], {}
  for path, bias in objs:
    base = os.path.basename(path)
    if not path or base.startswith("libmkernel") or base.startswith("libnccl"):
      continue
    if not os.path.isfile(path):
      continue
    try:
      relocs = _nccl_relocations(path)
    except Exception as e:  # noqa: BLE001
      report.fail(name, "could not parse %s: %s" % (path, e))
      continue
    if not relocs:
      continue
    importers[path] = len(relocs)
    for sym, off in relocs:
      value = ctypes.c_uint64.from_address(bias + off).value
      target = object_of_address(value)
      tbase = os.path.basename(target)
      if tbase.startswith("libmkernel"):
        to_mk[sym] = target
      elif value == 0 or os.path.realpath(target) == os.path.realpath(path):
        lazy.setdefault(sym, base)
      else:
        wrong.append("%s in %s -> %s" % (sym, base, target or hex(value)))
  detail = "%d importing object(s) %s; %d symbol(s) bound to %s; %d lazy/unbound; libnccl %s" % (
      len(importers), sorted(os.path.basename(p) for p in importers), len(to_mk),
      os.path.basename(mk[0]), len([s for s in lazy if s not in to_mk]),
      "loaded (%s)" % os.path.basename(real[0]) if real else "not loaded")
  if verbose and report.ctx.rank == 0:
    log("[%s] NCCL symbols bound to libmkernel: %s" % (report.ctx.test, " ".join(sorted(to_mk))))
    log("[%s] NCCL symbols imported but not bound yet (lazy, never called): %s" %
        (report.ctx.test, " ".join(sorted(s for s in lazy if s not in to_mk))))
  if wrong:
    report.fail(name, "%d GOT slot(s) bound outside libmkernel: %s" % (len(wrong), "; ".join(
        sorted(set(wrong))[:20])))
    return False
  if not importers:
    report.fail(name, "no loaded object imports nccl* symbols (is NCCL linked statically into "
                "torch? then LD_PRELOAD cannot take over)")
    return False
  missing = [s for s in require if s not in to_mk]
  if missing:
    report.fail(name, "required symbol(s) %s not bound to libmkernel although called; %s" %
                (missing, detail))
    return False
  report.ok(name, detail)
  return True


# ---------------------------------------------------------------------------------------------
# Harness pieces the fused-call tests (test_fused_gemm, test_moe, test_ring_attention) share
# ---------------------------------------------------------------------------------------------
def run_tests(ctx, fns):
  """Runs each test function under ctx.report; rank 0 logs how long each took."""
  for fn in fns:
    t0 = time.time()
    ctx.report.run(fn.__name__, fn, ctx)
    if ctx.rank == 0:
      log("[%s] %s done in %.1fs" % (ctx.test, fn.__name__, time.time() - t0))


def skip_without_cuda(ctx, name):
  """True (after reporting a skip) in the CPU self-check, where mkernel itself cannot run."""
  if ctx.device.type != "cuda":
    ctx.report.skip(name, "no CUDA device (CPU self-check)")
    return True
  return False


def pair_group(ctx):
  """(group, first rank) of this rank's pair {0,1}, {2,3}, ...; None, after a skip of
  'subgroups', when the world size is not even. Every rank creates every pair's group, as
  new_group requires."""
  if ctx.world < 2 or ctx.world % 2:
    ctx.report.skip("subgroups", "needs an even world size")
    return None
  groups = [dist.new_group(ranks=[r, r + 1]) for r in range(0, ctx.world, 2)]
  first = ctx.rank - ctx.rank % 2
  return groups[first // 2], first


def expect_raises(rep, name, exc, text, fn):
  """Passes when fn raises exc with `text` in its message."""
  try:
    fn()
  except exc as e:
    rep.check(name, text in str(e), "%s: %s" % (type(e).__name__, e))
    return
  except Exception as e:  # noqa: BLE001
    rep.fail(name, "raised %s instead of %s: %s" % (type(e).__name__, exc.__name__, e))
    return
  rep.fail(name, "no exception")


class Shifted:
  """A tensor seen 2 bytes further: the Python checks pass it, only the C library's own
  alignment checks stand in the way."""

  def __init__(self, t):
    self.t = t

  def __getattr__(self, k):
    return getattr(self.t, k)

  def data_ptr(self):
    return self.t.data_ptr() + 2


def world_comm(ctx):
  """(library, communicator of the world group) as mkernel's own calls get them."""
  from mkernel import _lib, _torch
  lib = _lib.library()
  return lib, _torch.comm_of_group(lib, dist.group.WORLD, ctx.rank, ctx.world, ctx.device)


def check_preloaded_library(rep, lib):
  rep.check("library_is_the_preloaded_one", "LD_PRELOAD" in lib.how or "MKERNEL_LIB" in lib.how,
            "%s (%s)" % (lib.path, lib.how))


def probe_layout(ctx, name, call):
  """(ok, result): `call` (one small operator call) must run in this layout on every rank;
  reported as `name`, and agreed on by all ranks so that none goes on to checks a peer skips."""
  import mkernel
  result = None
  try:
    result = call()
  except mkernel.MkernelError as e:
    ctx.report.fail(name, str(e))
    ok = torch.zeros(1, device=ctx.device)
  else:
    torch.cuda.synchronize()
    ctx.report.ok(name, "")
    ok = torch.ones(1, device=ctx.device)
  dist.all_reduce(ok, op=dist.ReduceOp.MIN)
  return float(ok) == 1, result
