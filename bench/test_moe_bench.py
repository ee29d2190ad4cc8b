#!/usr/bin/env python3
"""CPU check of bench/moe_bench.py and bench/moe_bench_ref.py (no GPU needed):

    python3 bench/test_moe_bench.py [-v]      (or: python3 bench/moe_bench.py --selftest)

Without torch: argument parsing, shape lists, FLOP formulas, max_rows, the memory estimate, the
report and the exit status. With torch (CPU): the torch reference layer of n ranks (threads
exchanging through a stand-in of all_to_all_single that checks the split sizes) against a direct
per-token computation, in fp32 (tight) and bf16 (the benchmark's tolerances), with -1 slots,
tokens without experts, repeated experts in a token and a rank without tokens; the dispatch
half's rows against every rank's routing in mkernel's packed order; and the comparison catching
a dropped slot and swapped gate/up halves.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import moe_bench as mb  # noqa: E402
import moe_bench_ref as ref  # noqa: E402

try:
  import torch
except ImportError:
  torch = None


def parse(*argv):
  return mb.parse_args(list(argv))


def bench_tol():
  """The benchmark's default tolerances (relative L2 overall, per token)."""
  a = parse("ffn")
  return a.tol, a.token_tol


class ParseCase(unittest.TestCase):
  """refused(*argv): the parser's error text for argv, which must make it exit."""

  def refused(self, *argv):
    with contextlib.redirect_stderr(io.StringIO()) as err, self.assertRaises(SystemExit):
      parse(*argv)
    return err.getvalue()


class ArgsTest(ParseCase):

  def test_defaults(self):
    a = parse("ffn")
    self.assertEqual((a.mode, a.nproc, a.algo_list, a.max_rows, a.routing, a.dtype),
                     ("ffn", 4, ["auto", "sequential"], "tight", "uniform", "bf16"))
    self.assertEqual(a.shape_list, mb.DEFAULT_SHAPES)
    self.assertEqual(parse("dispatch", "--nproc", "1").nproc, 1)
    self.assertTrue(a.lead_in)  # the untimed call and all-reduce before each measurement
    self.assertFalse(parse("ffn", "--no-lead-in").lead_in)

  def test_worker_command_line(self):
    # torchrun rejects "--nproc" as an ambiguous prefix of its own options: the launcher
    # hands the workers --ranks, which they must read as the same count.
    import bench_py_util as bpu
    argv = bpu.worker_argv(["ffn", "--nproc", "2", "--mps", "--nproc=3"])
    self.assertEqual(argv, ["ffn", "--ranks", "2", "--mps", "--ranks=3"])
    self.assertNotIn("--nproc", " ".join(argv))
    self.assertEqual(parse(*argv[:3]).nproc, 2)
    self.assertEqual(parse("ffn", argv[4]).nproc, 3)

  def test_worker_status_reaches_the_launcher(self):
    # Under torchrun a worker's own exit 3 ("targets missed") would come back as 1 with a
    # ChildFailedError: rank 0 writes it to the launcher's file and the workers exit 0.
    import tempfile
    import bench_py_util as bpu
    fd, path = tempfile.mkstemp()
    os.close(fd)
    old = os.environ.get(bpu.STATUS_ENV)
    os.environ[bpu.STATUS_ENV] = path
    try:
      self.assertEqual(bpu.worker_status(1, 3), 0)
      self.assertEqual(bpu.read_status(path, 0), 0)  # rank 1 writes nothing: empty file
      self.assertEqual(bpu.worker_status(0, 3), 0)
      self.assertEqual(bpu.read_status(path, 0), 3)
      self.assertEqual(bpu.read_status(path, 1), 1)  # a crashed worker wins
    finally:
      if old is None:
        del os.environ[bpu.STATUS_ENV]
      else:
        os.environ[bpu.STATUS_ENV] = old
      os.unlink(path)
    self.assertEqual(bpu.worker_status(0, 3), 3)  # no launcher: the status itself

  def test_shapes(self):
    a = parse("dispatch", "--shapes", "7168:2048:64:8:4096,2048:1408:64:6:512")
    self.assertEqual(a.shape_list, [(7168, 2048, 64, 8, 4096), (2048, 1408, 64, 6, 512)])
    a = parse("ffn", "--experts", "8,64", "--topk", "2,8")
    self.assertEqual(len(a.shape_list), 4)
    self.assertEqual(a.shape_list[0], (4096, 2048, 8, 2, 4096))
    self.assertEqual(a.shape_list[-1], (4096, 2048, 64, 8, 4096))
    a = parse("ffn", "--preset", "wide")
    self.assertEqual(len(a.shape_list), 2 * 3 * 3 * 3)
    a = parse("ffn", "--preset", "wide", "--hidden", "7168")
    self.assertEqual({s[0] for s in a.shape_list}, {7168})
    self.assertEqual(parse("ffn", "--max-rows", "1.25").max_rows, 1.25)
    self.assertEqual(parse("ffn", "--max-rows", "bound").max_rows, "bound")

  def test_refusals(self):
    self.assertIn("H:I:E:k:T", self.refused("ffn", "--shapes", "4096:2048:8:2"))
    self.assertIn("positive", self.refused("ffn", "--tokens", "0"))
    self.assertIn("multiples of 8", self.refused("ffn", "--shapes", "4100:2048:8:2:512"))
    self.assertIn("factor >= 1", self.refused("ffn", "--max-rows", "0.5"))
    self.assertIn("auto, fused, sequential", self.refused("ffn", "--algos", "auto,fast"))
    self.refused("ffn", "--nproc", "0")
    self.refused("ring")
    self.refused("ffn", "--mem-frac", "1.5")

  def test_missing_library_is_a_setup_error(self):
    r = subprocess.run([sys.executable, os.path.join(HERE, "moe_bench.py"), "ffn", "--lib",
                        "/nonexistent/libmkernel.so"], capture_output=True, text=True,
                       timeout=60)
    self.assertEqual(r.returncode, 2, r.stderr)
    self.assertIn("not found", r.stderr)


class ArithmeticTest(unittest.TestCase):

  def test_flops(self):
    T, k, H, I = 4096, 8, 7168, 2048
    self.assertEqual(ref.ffn_flops(T, k, H, I), 6 * T * k * H * I)  # 2TkH(2I) + 2TkIH
    self.assertEqual(ref.ffn_flops(512, 2, 4096, 2048), 2 * 512 * 2 * 4096 * 4096 +
                     2 * 512 * 2 * 2048 * 4096)
    self.assertEqual(ref.dispatch_flops(T, k, H, 2 * I), 2 * T * k * H * 2 * I)

  def test_tight_rows(self):
    import random
    rnd = random.Random(3)
    for _ in range(200):
      n, L = rnd.choice([1, 2, 4, 8]), rnd.randint(1, 8)
      counts = [rnd.choice([0, 1, 127, 128, 129, rnd.randint(0, 5000)]) for _ in range(n * L)]
      want = 128
      for r in range(n):
        want = max(want, sum(-(-c // 128) * 128 for c in counts[r * L:(r + 1) * L]))
      self.assertEqual(ref.tight_rows(counts, n), want)
    self.assertEqual(ref.tight_rows([0, 0, 0, 0], 2), 128)
    self.assertEqual(ref.tight_rows([129, 1, 300, 0], 2), 384)

  def test_max_rows_policies(self):
    from mkernel import moe_max_rows  # the package's bound (pure Python)
    for T, k, L, n in ((4096, 8, 16, 4), (512, 2, 1, 1), (1000, 6, 3, 2)):
      self.assertEqual(ref.choose_max_rows("bound", 256, T, k, L, n), moe_max_rows(T, k, L, n))
      self.assertEqual(ref.choose_max_rows("tight", 256, T, k, L, n), 256)
      self.assertEqual(ref.choose_max_rows(1.5, 256, T, k, L, n), 384)
      self.assertEqual(ref.choose_max_rows(1.0, 1280, T, k, L, n), 1280)

  def test_shape_problem(self):
    self.assertEqual(ref.shape_problem((4096, 2048, 8, 2, 512), 4), "")
    self.assertIn("multiple of 3", ref.shape_problem((4096, 2048, 8, 2, 512), 3))
    self.assertIn("per rank", ref.shape_problem((4096, 2048, 512, 2, 512), 1))
    self.assertIn("k=17", ref.shape_problem((4096, 2048, 64, 17, 512), 1))
    self.assertIn("k=8", ref.shape_problem((4096, 2048, 4, 8, 512), 1))

  def test_path_and_seeds(self):
    self.assertEqual(ref.mkernel_path([("h", 0, 11)]), "clique")
    self.assertEqual(ref.mkernel_path([("h", 0, 11)] * 4), "clique")
    self.assertEqual(ref.mkernel_path([("h", 0, 11), ("h", 0, 12)]), "alltoall")
    self.assertEqual(ref.seed_of(1, 2, 3), ref.seed_of(1, 2, 3))
    self.assertEqual(len({ref.seed_of(1, r, j) for r in range(64) for j in (1, 2)}), 128)

  def test_memory_estimate(self):
    # The AllToAll path's pair buffers: 2 n max_rows (H esize + 16) + ffn 2 n max_rows H 4.
    need, scratch = ref.mem_estimate("ffn", "alltoall", 4, 1024, 4096, 2048, 2, 512, 2, 2)
    self.assertGreaterEqual(scratch, 2 * 4 * 1024 * (4096 * 2 + 16) + 2 * 4 * 1024 * 4096 * 4)
    _, clique = ref.mem_estimate("ffn", "clique", 1, 1024, 4096, 2048, 2, 512, 2, 2)
    self.assertLess(clique, 2**20)
    _, d = ref.mem_estimate("dispatch", "alltoall", 4, 1024, 4096, 2048, 2, 512, 2, 2)
    self.assertLess(d, scratch)
    # The per-node dedup's fan buffers: the pair buffers (rows and k metadata entries) again.
    _, dd = ref.mem_estimate("ffn", "alltoall", 4, 1024, 4096, 2048, 2, 512, 2, 2, node_dedup=True)
    self.assertEqual(dd - scratch, 2 * 4 * 1024 * (4096 * 2 + 16 * 2))
    # The default shapes fit 4 ranks on one 141 GB GPU with --mem-frac 0.8 (eager variants).
    room = 0.8 * 139.8 * 2**30 / 4
    for H, I, E, k, T in mb.DEFAULT_SHAPES:
      L = E // 4
      rows = 4 * ref.pad_rows(T * k // E + T * k // E // 8) * L // 4  # ~ uniform routing
      n, s = ref.mem_estimate("ffn", "alltoall", 4, rows, H, I, k, T, L, 2)
      self.assertLess(n + s, room, (H, I, E, k, T))


def row(variants, ratio=1.2, ok=True, spot_ok=True, **kw):
  c = dict(rel_l2=0.004, worst_token=0.01, max_abs=0.01, finite=True, ok=ok)
  r = dict(H=4096, I=2048, E=8, k=2, T=512, L=2, N=4096, max_rows=1280, tight_rows=1280,
           flops_per_rank=1e12, variants=variants, checks={"mkernel_auto": c},
           spot={"torch": dict(c, ok=spot_ok)}, ratios={"mkernel_auto": ratio},
           target_variant="mkernel_auto", target_met=ratio >= 1.0)
  r.update(kw)
  return r


class ReportTest(unittest.TestCase):
  META = dict(mode="ffn", command="moe_bench.py ffn", commit="abc", device="H200", nranks=4,
              ranks_per_gpu=4, date="2025-01-01", torch="2.8", cuda="12.8", nccl_version="2.27",
              nccl_provider="mkernel, preloaded", library="/x/libmkernel.so", mkernel_error=None,
              mkernel_path="alltoall", torch_gemm="torch._grouped_mm",
              config=dict(max_rows="tight", routing="uniform", dtype="bf16"))
  V = {"mkernel_auto": dict(ms=2.0, tflops=100.0), "torch": dict(ms=2.4, tflops=83.0),
       "mkernel_auto_graph": {"error": "CUDA graph: boom"}}

  def test_markdown_and_status(self):
    rows = [row(self.V), dict(H=7168, I=2048, E=6, k=2, T=512, skipped="E=6 is not a multiple")]
    md = mb.markdown(self.META, rows)
    self.assertIn("| H=4096 I=2048 E=8 k=2 T=512 | 1280 | 2.000 (100) | 2.400 (83) | n/a | auto "
                  "1.20 | 0.004 ok | 0.004 ok |", md)
    self.assertIn("skipped: E=6", md)
    self.assertIn("AllToAll path", md)
    self.assertIn("host synchronisation", md)
    self.assertIn("mkernel_auto_graph: CUDA graph: boom", md)
    self.assertIn("mkernel/torch: auto 1.200", mb.shape_line(rows[0]))
    # The graph variant's error counts as a failed mkernel variant when the library loaded.
    self.assertEqual(mb.exit_status(rows, True)[0], 1)
    self.assertEqual(mb.exit_status(rows, False)[0], 0)
    ok = dict(self.V)
    del ok["mkernel_auto_graph"]
    self.assertEqual(mb.exit_status([row(ok)], True)[0], 0)
    self.assertEqual(mb.exit_status([row(ok, ratio=0.9)], True)[0], 3)
    self.assertEqual(mb.exit_status([row(ok, ratio=0.9, ok=False)], True)[0], 1)
    self.assertEqual(mb.exit_status([row(ok, spot_ok=False)], True)[0], 1)


# ---------------------------------------------------------------------------------------------
# --nodes N: the launcher's two sides (bench_py_util), shared with attn_bench.py
# ---------------------------------------------------------------------------------------------
import bench_py_util as bpu  # noqa: E402


class NodesArgsTest(ParseCase):

  def test_nodes_option(self):
    a = parse("ffn")
    self.assertEqual((a.nodes, a.side, a.side_out, a.torch_from), (1, None, None, None))
    self.assertEqual(parse("dispatch", "--nproc", "4", "--nodes", "2").nodes, 2)
    self.assertEqual(parse("ffn", "--nproc", "2", "--nodes", "2").nodes, 2)
    self.assertIn("not a multiple", self.refused("ffn", "--nproc", "3", "--nodes", "2"))
    self.assertIn("not a multiple", self.refused("ffn", "--nproc", "1", "--nodes", "2"))
    self.assertIn("at least 1", self.refused("ffn", "--nodes", "0"))
    # The internal options only as the launcher sets them.
    self.assertIn("only with --nodes", self.refused("ffn", "--side", "torch", "--side-out", "f"))
    self.assertIn("--side-out", self.refused("ffn", "--nproc", "2", "--nodes", "2", "--side",
                                             "torch"))
    self.assertIn("--torch-from", self.refused("ffn", "--nproc", "2", "--nodes", "2", "--side",
                                               "mkernel"))
    self.assertIn("need --side", self.refused("ffn", "--torch-from", "f"))
    a = parse(*bpu.side_argv(["ffn", "--nproc", "2", "--nodes", "2"], "torch", "/tmp/x"))
    self.assertEqual((a.side, a.side_out), ("torch", "/tmp/x"))
    a = parse(*bpu.side_argv(["ffn", "--nproc", "2", "--nodes", "2"], "mkernel", "/tmp/x"))
    self.assertEqual((a.side, a.torch_from), ("mkernel", "/tmp/x"))

  def test_nodes_problem(self):
    for nproc, nodes, ok in ((2, 2, True), (4, 2, True), (8, 4, True), (4, 1, True),
                             (3, 1, True), (3, 2, False), (1, 2, False), (6, 4, False),
                             (4, 0, False)):
      self.assertEqual(bpu.nodes_problem(nproc, nodes) == "", ok, (nproc, nodes))


class SideEnvTest(unittest.TestCase):
  BASE = dict(PATH="/usr/bin", LD_PRELOAD="/b/src/libmkernel.so", MKERNEL_LIB="/b/libmkernel.so",
              MKERNEL_TIMEOUT_MS="60000", MKERNEL_EMULATE_NODES="4", NCCL_HOSTID="stale",
              NCCL_NET="IB", NCCL_NET_PLUGIN="x", MK_ATTN_BENCH_LIB="/b/src/libmkernel.so",
              CUDA_MPS_PIPE_DIRECTORY="/tmp/mps/pipe", MK_MOE_BENCH_CHILD="1",
              NCCL_DEBUG="WARN")

  def test_torch_side(self):
    base = dict(self.BASE)
    env = bpu.side_env(base, "torch", 2)
    self.assertEqual(base, self.BASE)  # the caller's dict is left alone
    for k in ("LD_PRELOAD", "MKERNEL_LIB", "MKERNEL_TIMEOUT_MS", "MKERNEL_EMULATE_NODES",
              "NCCL_HOSTID", "NCCL_NET_PLUGIN", "MK_ATTN_BENCH_LIB"):
      self.assertNotIn(k, env)
    self.assertFalse([v for v in env.values() if "mkernel" in v.lower()], env)
    # Any preload goes (one under another name, a copy or a symlink of libmkernel included).
    self.assertNotIn("LD_PRELOAD", bpu.side_env(dict(base, LD_PRELOAD="/x/libshim.so"), "torch", 2))
    self.assertEqual({k: env[k] for k in bpu.TORCH_SIDE_NCCL},
                     dict(NCCL_NET="Socket", NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1",
                          NCCL_NVLS_ENABLE="0"))
    self.assertEqual(env[bpu.HOSTID_PREFIX_ENV], bpu.HOSTID_PREFIX)
    for k in ("PATH", "CUDA_MPS_PIPE_DIRECTORY", "MK_MOE_BENCH_CHILD", "NCCL_DEBUG"):
      self.assertEqual(env[k], self.BASE[k])

  def test_mkernel_side(self):
    env = bpu.side_env(dict(self.BASE), "mkernel", 2)
    self.assertEqual(env["LD_PRELOAD"], self.BASE["LD_PRELOAD"])
    self.assertEqual(env["MKERNEL_EMULATE_NODES"], "2")
    self.assertEqual(env["MKERNEL_TIMEOUT_MS"], "60000")  # the caller's mkernel settings stay
    self.assertEqual(env["NCCL_SOCKET_IFNAME"], "lo")
    for k in ("NCCL_HOSTID", "NCCL_NET", "NCCL_NET_PLUGIN", bpu.HOSTID_PREFIX_ENV):
      self.assertNotIn(k, env)
    with self.assertRaises(ValueError):
      bpu.side_env({}, "both", 2)

  def test_hostid_per_rank(self):
    ids = []
    for r in range(4):
      env = bpu.side_env(dict(self.BASE), "torch", 2)
      env["RANK"] = str(r)
      self.assertEqual(bpu.apply_hostid(env), bpu.hostid(bpu.HOSTID_PREFIX, r))
      ids.append(env["NCCL_HOSTID"])
    self.assertEqual(len(set(ids)), 4)
    self.assertEqual(ids[3], "mkbench-host-3")
    # Every other mode: no prefix, NCCL_HOSTID untouched.
    env = bpu.side_env(dict(self.BASE), "mkernel", 2)
    env["RANK"] = "1"
    self.assertIsNone(bpu.apply_hostid(env))
    self.assertNotIn("NCCL_HOSTID", env)
    env = dict(RANK="0", NCCL_HOSTID="mine")
    self.assertIsNone(bpu.apply_hostid(env))
    self.assertEqual(env["NCCL_HOSTID"], "mine")

  def test_mkernel_mapped(self):
    line = "7f00-7f10 r-xp 00000000 08:01 123 %s"
    self.assertTrue(bpu.mkernel_mapped(line % "/w/build-gpu/src/libmkernel.so"))
    self.assertTrue(bpu.mkernel_mapped("\n".join([line % "/usr/lib/libc.so.6",
                                                   line % "/x/libmkernel.so.0"])))
    self.assertFalse(bpu.mkernel_mapped(line % "/site-packages/nvidia/nccl/lib/libnccl.so.2"))
    self.assertFalse(bpu.mkernel_mapped(line % "/w/mkernel/python/libc.so"))  # a directory name
    self.assertFalse(bpu.mkernel_mapped("7f00-7f10 rw-p 00000000 00:00 0"))  # anonymous
    self.assertIn(bpu.mkernel_mapped(), (True, False, None))  # this process: readable or not


class SideFilesTest(unittest.TestCase):

  def tmp(self, text=None):
    import tempfile
    fd, path = tempfile.mkstemp()
    os.close(fd)
    self.addCleanup(os.unlink, path)
    if text is not None:
      with open(path, "w") as f:
        f.write(text)
    return path

  def test_outcome(self):
    good = '{"meta": {"side_facts": {"nccl_version": "2.27.3"}}, "rows": [{"H": 1}]}'
    d = bpu.torch_side_outcome(good, 0)
    self.assertEqual((d["status"], d["rows"], "note" in d), (0, [{"H": 1}], False))
    self.assertIn("status 1", bpu.torch_side_outcome(good, 1)["note"])
    for text in ("", "{", '{"meta": {}}', "[1]"):
      d = bpu.torch_side_outcome(text, 1)
      self.assertIn("wrote no results", d["failed"])
      self.assertIn("status 1", d["failed"])
    d = bpu.torch_side_outcome("", 124, "killed after 270 s")
    self.assertIn("killed after 270 s", d["failed"])

  def test_load(self):
    meta, rows, why = bpu.load_torch_side(self.tmp(json.dumps(bpu.torch_side_outcome(
        '{"meta": {"a": 1}, "rows": [{"H": 2}]}', 1))))
    self.assertEqual((meta["a"], meta["status"], rows, why), (1, 1, [{"H": 2}], None))
    self.assertIn("status 1", meta["note"])
    _, rows, why = bpu.load_torch_side(self.tmp(json.dumps(bpu.torch_side_outcome("", 1))))
    self.assertEqual(rows, [])
    self.assertIn("wrote no results", why)
    self.assertIn("unreadable", bpu.load_torch_side(self.tmp(""))[2])
    self.assertIn("unreadable", bpu.load_torch_side("/nonexistent/side.json")[2])

  def test_combine_status(self):
    self.assertEqual(bpu.combine_status(0, 0), 0)
    self.assertEqual(bpu.combine_status(0, 3), 3)
    self.assertEqual(bpu.combine_status(1, 0), 1)
    self.assertEqual(bpu.combine_status(124, 3), 1)
    self.assertEqual(bpu.combine_status(1, 2), 2)
    self.assertEqual(bpu.combine_status(0, 1), 1)


def moe_row(variants, **kw):
  r = dict(H=4096, I=2048, E=8, k=2, T=512, L=4, N=4096, max_rows=1280, tight_rows=1280,
           flops_per_rank=1e12, variants=variants, checks={}, spot={})
  r.update(kw)
  return r


class MergeTest(unittest.TestCase):
  MK = {"mkernel_auto": dict(ms=2.0, tflops=500.0), "mkernel_sequential": dict(ms=2.5,
                                                                              tflops=400.0)}

  def mk_rows(self):
    return [moe_row(dict(self.MK)), moe_row(dict(self.MK), T=4096),
            moe_row({}, E=6, skipped="E=6 is not a multiple of 4 ranks"),
            moe_row(dict(self.MK), H=7168)]

  def test_merge_by_shape(self):
    rows = self.mk_rows()
    rows[0]["variants"]["torch"] = dict(ms=1.0)  # a local torch timing would be dropped
    torch_rows = [moe_row({"torch": dict(ms=3.0, tflops=333.0, reps=[3.0])}, T=4096,
                          spot={"torch": dict(ok=True)}),
                  moe_row({"torch": dict(ms=2.4, tflops=417.0)}),  # other order: by key
                  moe_row({}, E=6, skipped="E=6 is not a multiple of 4 ranks"),
                  moe_row({}, H=7168, skipped="budget exhausted")]
    missing = bpu.merge_torch_rows(rows, torch_rows, mb.row_key, lambda x: x == "torch",
                                   ["torch"])
    self.assertEqual(missing, 1)
    self.assertEqual(rows[0]["variants"]["torch"]["ms"], 2.4)
    self.assertEqual(rows[0]["variants"]["torch"]["side"], "torch")
    self.assertEqual(rows[1]["variants"]["torch"]["ms"], 3.0)
    self.assertEqual(rows[1]["torch_side_spot"], {"torch": dict(ok=True)})
    self.assertEqual(rows[2]["variants"], {})  # a skipped shape is left alone
    self.assertIn("budget exhausted", rows[3]["variants"]["torch"]["error"])
    for r in rows:
      if "skipped" not in r:
        mb.set_ratios(r)
    self.assertAlmostEqual(rows[0]["ratios"]["mkernel_auto"], 1.2)
    self.assertAlmostEqual(rows[1]["ratios"]["mkernel_sequential"], 1.2)
    self.assertEqual((rows[0]["target_variant"], rows[0]["target_met"]), ("mkernel_auto", True))
    self.assertEqual(rows[3]["ratios"], {})
    self.assertIsNone(rows[3]["target_met"])
    self.assertEqual(rows[3]["target_variant"], "mkernel_auto")

  def test_failed_torch_side(self):
    rows = self.mk_rows()
    missing = bpu.merge_torch_rows(rows, [], mb.row_key, lambda x: x == "torch", ["torch"],
                                   "torch side exited with status 1 and wrote no results")
    self.assertEqual(missing, 3)
    for r in (rows[0], rows[1], rows[3]):
      self.assertIn("status 1", r["variants"]["torch"]["error"])
      mb.set_ratios(r)
      self.assertIsNone(r["target_met"])
    md = mb.markdown(dict(ReportTest.META, nodes_header=bpu.nodes_header(
        2, 4, {}, FACTS, "torch side exited with status 1 and wrote no results")),
        [r for r in rows if "skipped" not in r])
    self.assertIn("NO TORCH TIMINGS: torch side exited with status 1", md)
    self.assertIn("| H=4096 I=2048 E=8 k=2 T=512 | 1280 | 2.000 (500) | 2.500 (400) | n/a | n/a |",
                  md)
    self.assertIn("- torch: torch side (real NCCL): torch side exited with status 1", md)
    # Nothing failed on the mkernel side: the status comes from the missing torch columns.
    self.assertEqual(mb.exit_status(rows, True)[0], 0)

  def test_header(self):
    tmeta = dict(side_facts=dict(nccl_version="2.27.3", hostids=["mkbench-host-0",
                                                                 "mkbench-host-1"],
                                 libmkernel_mapped=[False, False]), status=0)
    lines = bpu.nodes_header(2, 2, tmeta, FACTS, None)
    text = "\n".join(lines)
    self.assertIn("2 (virtual) nodes of 1 rank(s)", text)
    self.assertIn("MKERNEL_EMULATE_NODES=2", text)
    self.assertIn("torch columns: torch on its own NCCL 2.27.3", text)
    self.assertIn("mkbench-host-0, mkbench-host-1", text)
    self.assertNotIn("NOT THE REAL", text)
    tmeta["side_facts"]["libmkernel_mapped"] = [False, True]
    self.assertIn("NOT THE REAL NCCL", "\n".join(bpu.nodes_header(2, 2, tmeta, FACTS, None)))


FACTS = dict(side="mkernel", nodes=2, nccl_version="2.28.3", hostids=["", ""],
             libmkernel_mapped=[True, True],
             env=dict(LD_PRELOAD="/b/src/libmkernel.so", MKERNEL_EMULATE_NODES="2"))


class LaunchNodesTest(unittest.TestCase):
  """launch_nodes with a stand-in for torchrun: what each side gets, and the status."""

  def run_nodes(self, torch_behaviour, mkernel_rc=0):
    calls = []

    def fake(tool, script, argv, env, distributed, nproc, nproc_flag, timeout=None):
      calls.append(dict(argv=list(argv), env=dict(env), nproc=nproc, timeout=timeout))
      if "--side-out" in argv:
        path = argv[argv.index("--side-out") + 1]
        if torch_behaviour == "ok":
          with open(path, "w") as f:
            json.dump(dict(meta=dict(side_facts={}), rows=[{"H": 1}]), f)
          return 0, None
        if torch_behaviour == "timeout":
          return 124, "killed after 270 s"
        return 1, None
      path = argv[argv.index("--torch-from") + 1]
      calls[-1]["torch_side"] = bpu.load_torch_side(path)
      calls[-1]["path"] = path
      return mkernel_rc, None

    real = bpu.run_workers
    bpu.run_workers = fake
    try:
      with contextlib.redirect_stdout(io.StringIO()):
        rc = bpu.launch_nodes("moe_bench", "moe_bench.py", ["ffn", "--nproc", "2", "--nodes",
                                                             "2"],
                              dict(SideEnvTest.BASE), 2, 2, False, torch_timeout=270)
    finally:
      bpu.run_workers = real
    return rc, calls

  def test_sides(self):
    rc, (t, m) = self.run_nodes("ok")
    self.assertEqual(rc, 0)
    self.assertEqual(t["argv"][:5], ["ffn", "--nproc", "2", "--nodes", "2"])
    self.assertEqual(t["argv"][5:8], ["--side", "torch", "--side-out"])
    self.assertEqual(m["argv"][5:8], ["--side", "mkernel", "--torch-from"])
    self.assertEqual(t["argv"][-1], m["argv"][-1])  # the file the torch side wrote
    self.assertNotIn("LD_PRELOAD", t["env"])
    self.assertEqual(t["env"]["NCCL_NET"], "Socket")
    self.assertEqual(t["env"][bpu.HOSTID_PREFIX_ENV], bpu.HOSTID_PREFIX)
    self.assertEqual(t["timeout"], 270)
    self.assertEqual(m["env"]["LD_PRELOAD"], SideEnvTest.BASE["LD_PRELOAD"])
    self.assertEqual(m["env"]["MKERNEL_EMULATE_NODES"], "2")
    self.assertNotIn(bpu.HOSTID_PREFIX_ENV, m["env"])
    self.assertIsNone(m["timeout"])
    meta, rows, why = m["torch_side"]
    self.assertEqual((rows, why, meta["status"]), ([{"H": 1}], None, 0))
    self.assertFalse(os.path.exists(m["path"]))  # removed after

  def test_failed_torch_side_still_runs_mkernel(self):
    for behaviour, what in (("crash", "status 1"), ("timeout", "killed after 270 s")):
      for mrc, want in ((0, 1), (3, 1), (2, 2)):
        rc, calls = self.run_nodes(behaviour, mrc)
        self.assertEqual(len(calls), 2)
        self.assertEqual(rc, want, (behaviour, mrc))
        _, rows, why = calls[1]["torch_side"]
        self.assertEqual(rows, [])
        self.assertIn(what, why)

  def test_default_launch_unchanged(self):
    seen = []

    def fake(tool, script, argv, env, distributed, nproc, nproc_flag, timeout=None):
      seen.append((list(argv), dict(env), distributed, nproc, nproc_flag, timeout))
      return 3, None

    real = bpu.run_workers
    bpu.run_workers = fake
    try:
      rc = bpu.launch("moe_bench", "moe_bench.py", ["ffn", "--nproc", "4"],
                      dict(SideEnvTest.BASE), True, 4, False)
    finally:
      bpu.run_workers = real
    self.assertEqual(rc, 3)
    argv, env, distributed, nproc, flag, timeout = seen[0]
    self.assertEqual((argv, env, distributed, nproc, flag, timeout),
                     (["ffn", "--nproc", "4"], SideEnvTest.BASE, True, 4, "--nproc_per_node",
                      None))

  def test_run_bounded_kills_the_group(self):
    import tempfile
    import time
    fd, pidfile = tempfile.mkstemp()
    os.close(fd)
    self.addCleanup(os.unlink, pidfile)
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "open(%r, 'w').write(str(p.pid))\n"
            "time.sleep(60)\n" % pidfile)
    t0 = time.time()
    rc, note = bpu.run_bounded([sys.executable, "-c", code], dict(os.environ), 2)
    self.assertEqual(rc, 124)
    self.assertIn("killed after 2 s", note)
    self.assertLess(time.time() - t0, 30)
    with open(pidfile) as f:
      child = int(f.read())
    time.sleep(0.5)
    try:
      with open("/proc/%d/status" % child) as f:
        state = [x for x in f.read().splitlines() if x.startswith("State:")][0]
      self.assertIn("Z", state)  # killed, not yet reaped by its new parent
    except FileNotFoundError:
      pass
    self.assertEqual(bpu.run_bounded([sys.executable, "-c", "import sys; sys.exit(3)"],
                                     dict(os.environ), 30), (3, None))


# ---------------------------------------------------------------------------------------------
class Threads:
  """n ranks as threads; a2a(rank) stands in for dist.all_to_all_single and refuses output split
  sizes that differ from what the peers send (as NCCL would fail or misplace rows)."""

  def __init__(self, n):
    self.n, self.box = n, [None] * n
    self.barrier = threading.Barrier(n, timeout=120)

  def a2a(self, rank):

    def exchange(out, inp, out_sizes, in_sizes):
      n = self.n
      in_sizes = in_sizes if in_sizes is not None else [inp.shape[0] // n] * n
      out_sizes = out_sizes if out_sizes is not None else [out.shape[0] // n] * n
      self.box[rank] = torch.split(inp, list(in_sizes))
      self.barrier.wait()
      got = [self.box[s][rank] for s in range(n)]
      self.barrier.wait()
      if [g.shape[0] for g in got] != list(out_sizes) or sum(out_sizes) != out.shape[0]:
        raise AssertionError("rank %d expects %s rows, peers send %s" % (
            rank, list(out_sizes), [g.shape[0] for g in got]))
      out.copy_(torch.cat(got))

    return exchange

  def run(self, fn):
    res, errs = [None] * self.n, []

    def body(r):
      try:
        res[r] = fn(r, self.a2a(r))
      except Exception as e:  # noqa: BLE001
        errs.append(e)
        self.barrier.abort()

    ts = [threading.Thread(target=body, args=(r,)) for r in range(self.n)]
    for t in ts:
      t.start()
    for t in ts:
      t.join()
    if errs:
      raise errs[0]
    return res


def problem(n, L, k, H, I, dtype, seed, T=40):
  """Every rank's tokens and routing: -1 slots, a token without experts, repeated experts in a
  token, rank 1 without tokens; weights drawn per global expert."""
  E, g = n * L, torch.Generator()
  g.manual_seed(seed)
  xs, idxs, wtss = [], [], []
  for r in range(n):
    Tr = 0 if r == 1 else T + 3 * r
    x = torch.randn((Tr, H), generator=g).to(dtype)
    idx = torch.randint(0, E, (Tr, k), generator=g)
    idx[torch.rand((Tr, k), generator=g) < 0.2] = -1
    if Tr:
      idx[Tr // 2] = -1
      idx[0, :] = idx[0, 0].clamp(min=0)  # one expert in every slot
    wts = torch.softmax(torch.randn((Tr, k), generator=g), dim=1)
    xs.append(x)
    idxs.append(idx.to(torch.int32))
    wtss.append(wts)
  weights = [ref.expert_weights(seed, e, H, I, dtype, "cpu") for e in range(E)]
  return xs, idxs, wtss, weights


@unittest.skipIf(torch is None, "torch is not installed")
class TorchReferenceTest(unittest.TestCase):

  @classmethod
  def setUpClass(cls):
    torch.set_num_threads(1)

  def layer(self, n, L, k, H, I, dtype, seed, gemm=None):
    xs, idxs, wtss, weights = problem(n, L, k, H, I, dtype, seed)
    gemm = gemm or ref.gemm_loop

    def rank_fn(r, a2a):
      w1 = torch.stack([weights[r * L + e][0] for e in range(L)])
      w2 = torch.stack([weights[r * L + e][1] for e in range(L)])
      return ref.torch_moe_ffn(xs[r], idxs[r], wtss[r], w1, w2, n, a2a, gemm)

    ys = Threads(n).run(rank_fn)
    direct = [ref.direct_moe_ffn(xs[r], idxs[r], wtss[r], lambda e: weights[e],
                                 list(range(xs[r].shape[0]))) for r in range(n)]
    return ys, direct, (xs, idxs, wtss, weights)

  def test_ffn_fp32_exact_movement(self):
    for n, L, k in ((1, 3, 2), (2, 2, 4), (4, 1, 3), (4, 3, 8)):
      ys, direct, _ = self.layer(n, L, k, 64, 32, torch.float32, seed=n * 100 + L * 10 + k)
      for r in range(n):
        self.assertEqual(ys[r].dtype, torch.float32)
        c = ref.compare(ys[r], direct[r])
        self.assertTrue(ref.judge(c, 1e-5, 1e-5), (n, L, k, r, c))

  def test_ffn_bf16_within_bench_tolerance(self):
    ys, direct, (xs, idxs, _, _) = self.layer(4, 2, 4, 256, 128, torch.bfloat16, seed=7)
    for r in range(4):
      self.assertEqual(ys[r].dtype, torch.bfloat16)
      c = ref.compare(ys[r], direct[r])
      self.assertTrue(ref.judge(c, *bench_tol()), c)
      none = (idxs[r] < 0).all(dim=1)  # tokens without experts: exact zeros
      self.assertTrue(bool((ys[r][none] == 0).all()))

  def test_compare_catches_wrong_layers(self):
    """A dropped slot and swapped gate/up halves fail the benchmark's check."""
    n, L, k, H, I = 2, 4, 8, 256, 128
    ys, direct, (xs, idxs, wtss, weights) = self.layer(n, L, k, H, I, torch.bfloat16, seed=11)
    x, idx, w = xs[0], idxs[0].clone(), wtss[0]
    t = 3
    j = int(torch.where(idx[t] >= 0, w[t], torch.full_like(w[t], 9.0)).argmin())
    idx[t, j] = -1  # the smallest-weight slot of one token left out
    dropped = ref.direct_moe_ffn(x, idx, w, lambda e: weights[e], list(range(x.shape[0])))
    c = ref.compare(ys[0], dropped)
    self.assertFalse(ref.judge(c, *bench_tol()), c)
    self.assertTrue(ref.judge(ref.compare(ys[0], direct[0]), *bench_tol()))

    def swapped(e):
      w1, w2 = weights[e]
      return torch.cat([w1[I:], w1[:I]]), w2

    c = ref.compare(ys[0], ref.direct_moe_ffn(x, idxs[0], w, swapped, list(range(x.shape[0]))))
    self.assertFalse(ref.judge(c, *bench_tol()), c)
    bad = ys[0].clone()
    bad[0, 0] = float("nan")
    self.assertFalse(ref.judge(ref.compare(bad, direct[0]), *bench_tol()))

  def test_dispatch_rows_in_mkernel_order(self):
    n, L, k, H, N = 4, 3, 4, 32, 48
    xs, idxs, _, _ = problem(n, L, k, H, N // 2, torch.float32, seed=5)
    g = torch.Generator()
    g.manual_seed(9)
    w1s = [torch.randn((L, N, H), generator=g) for _ in range(n)]
    out = Threads(n).run(lambda r, a2a: ref.torch_dispatch(xs[r], idxs[r], w1s[r], n, a2a,
                                                           ref.gemm_loop))
    for r in range(n):
      xe, y, per = out[r]
      want, counts = [], []
      for e in range(L):  # packed layout: expert, then source rank, token, slot
        rows = [xs[s][t] for s in range(n) for t, j in (idxs[s] == r * L + e).nonzero().tolist()]
        counts.append(len(rows))
        want += rows
      self.assertEqual(per, counts)
      self.assertTrue(torch.equal(xe, torch.stack(want) if want else xe[:0]))
      s = 0
      for e, c in enumerate(per):
        self.assertTrue(torch.allclose(y[s:s + c], xe[s:s + c] @ w1s[r][e].t(), rtol=1e-5,
                                       atol=1e-5))
        s += c

  def test_wrong_split_sizes_are_refused(self):

    def rank_fn(r, a2a):
      out = torch.empty((3, 2))
      a2a(out, torch.ones((4, 2)), [1, 2], [2, 2])  # rank 0 and 1 each send 2 rows to each

    with self.assertRaises(Exception):
      Threads(2).run(rank_fn)

  def test_grouped_mm_matches_loop(self):
    if not hasattr(torch, "_grouped_mm"):
      self.skipTest("torch %s has no torch._grouped_mm" % torch.__version__)
    a = torch.randn((40, 64)).to(torch.bfloat16)
    w = torch.randn((3, 32, 64)).to(torch.bfloat16)
    per, offs = [8, 0, 32], torch.tensor([8, 8, 40], dtype=torch.int32)
    try:
      got = ref.gemm_grouped(a, w, per, offs)
    except RuntimeError as e:
      self.skipTest("torch._grouped_mm on CPU: %s" % e)
    self.assertTrue(ref.judge(ref.compare(got, ref.gemm_loop(a, w, per, offs)), 0.01, 0.02))


if __name__ == "__main__":
  unittest.main()
