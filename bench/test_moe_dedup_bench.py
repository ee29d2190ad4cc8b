#!/usr/bin/env python3
"""CPU check of moe_bench.py --dedup-modes (issue 13, MKERNEL_MOE_NODE_DEDUP), no GPU or torch:

    python3 bench/test_moe_dedup_bench.py [-v]

The cross-node rows model (moe_bench_ref.cross_node_rows) on a hand routing, with overflow and
spill, and against a per-token count on random routings; the option's parsing; the launcher
running one torch side then the mkernel side once per mode with that mode's variable; the
report's column (and the default report without it).
"""

import contextlib
import io
import json
import os
import random
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_py_util as bpu  # noqa: E402
import moe_bench as mb  # noqa: E402
import moe_bench_dedup as dd  # noqa: E402
import moe_bench_ref as ref  # noqa: E402

# 2 nodes x 2 ranks, E = 8 (2 experts a rank: rank = e // 2, node = rank // 2).
HAND = [
    [2, 4],  # ranks 1 (own node) and 2: one remote row in both modes
    [4, 6],  # ranks 2 and 3, both on node 1: 2 rows in mode 0, 1 in mode 1
    [6, 7],  # rank 3 twice: 1 row
    [-1, 5],  # rank 2 (the -1 slot is not sent): 1 row
    [0, 1],  # rank 0 (itself): nothing crosses
]


def rows_of(idx, mode, max_rows=128, rank=0, nranks=4, nodes=2, E=8):
  return ref.cross_node_rows(idx, E, nranks, nodes, rank, mode, max_rows)


class ModelTest(unittest.TestCase):

  def test_hand_routing(self):
    self.assertEqual((rows_of(HAND, 0), rows_of(HAND, 1)), (5, 4))
    # Rank 2 (node 1) with the same routing: node 0 gets tokens 0 (rank 1) and 4 (rank 0).
    self.assertEqual((rows_of(HAND, 0, rank=2), rows_of(HAND, 1, rank=2)), (2, 2))
    # Rank 1 is on node 0 like rank 0: the same rows.
    self.assertEqual((rows_of(HAND, 0, rank=1), rows_of(HAND, 1, rank=1)), (5, 4))

  def test_spill_and_overflow(self):
    # Slots: rank 2 has 3 (4, 4, 5), rank 3 has 3 (6, 6, 7); node 1 has 4 tokens.
    self.assertEqual((rows_of(HAND, 0, 3), rows_of(HAND, 1, 3)), (5, 5))  # 4 > 3: spill
    self.assertEqual((rows_of(HAND, 0, 4), rows_of(HAND, 1, 4)), (5, 4))  # exact fit
    self.assertEqual((rows_of(HAND, 0, 2), rows_of(HAND, 1, 2)), (0, 0))  # 2 and 3 overflow

  def test_layouts_without_dedup(self):
    # One rank a node (4 x 1: rank 1 is remote too) or one node: mode 1 runs mode 0.
    self.assertEqual((rows_of(HAND, 0, nodes=4), rows_of(HAND, 1, nodes=4)), (6, 6))  # rank 1 too
    self.assertEqual((rows_of(HAND, 0, nodes=1), rows_of(HAND, 1, nodes=1)), (0, 0))
    # 4 x 2 on 8 ranks, E = 16: rank 0's remote nodes are 1 (ranks 2, 3), 2 and 3.
    idx = [[4, 6, 8], [4, 5, 15], [0, 2, 3]]  # ranks 2,3,4 / 2,2,7 / 0,1,1
    self.assertEqual(rows_of(idx, 0, nranks=8, nodes=4, E=16), 3 + 2)
    self.assertEqual(rows_of(idx, 1, nranks=8, nodes=4, E=16), 2 + 2)

  def test_random_routings_against_a_per_token_count(self):
    rnd = random.Random(7)
    for nranks, nodes, E, k in ((4, 2, 8, 6), (8, 2, 16, 8), (8, 4, 32, 4), (9, 3, 9, 3)):
      nl, epr = nranks // nodes, E // nranks
      for rank in (0, nranks - 1):
        idx = [rnd.sample(range(E), k) + [-1] for _ in range(200)]
        per_rank = per_node = 0
        for tok in idx:
          ranks = {e // epr for e in tok if e >= 0}
          per_rank += len([d for d in ranks if d // nl != rank // nl])
          per_node += len({d // nl for d in ranks} - {rank // nl})
        big = 10**6
        self.assertEqual(rows_of(idx, 0, big, rank, nranks, nodes, E), per_rank)
        self.assertEqual(rows_of(idx, 1, big, rank, nranks, nodes, E), per_node)
        self.assertLess(per_node, per_rank)


class DedupArgsTest(unittest.TestCase):

  def refused(self, *argv):
    with contextlib.redirect_stderr(io.StringIO()) as err, self.assertRaises(SystemExit):
      mb.parse_args(list(argv))
    return err.getvalue()

  def test_parse(self):
    self.assertIsNone(mb.parse_args(["ffn", "--nproc", "4", "--nodes", "2"]).dedup_modes)
    a = mb.parse_args(["ffn", "--nproc", "4", "--nodes", "2", "--dedup-modes", "0,1"])
    self.assertEqual(a.dedup_modes, [0, 1])
    a = mb.parse_args(["dispatch", "--nproc", "4", "--nodes", "2", "--dedup-modes", "1"])
    self.assertEqual(a.dedup_modes, [1])
    self.assertIn("--nodes >= 2", self.refused("ffn", "--nproc", "4", "--dedup-modes", "0,1"))
    for bad in ("0,2", "1,1", ",", "x"):
      self.assertIn("distinct values", self.refused("ffn", "--nproc", "4", "--nodes", "2",
                                                    "--dedup-modes", bad))

  def test_worst_status(self):
    self.assertEqual(bpu.worst_status([0, 0]), 0)
    self.assertEqual(bpu.worst_status([0, 3]), 3)
    self.assertEqual(bpu.worst_status([3, 1, 2]), 1)
    self.assertEqual(bpu.worst_status([0, 124]), 124)


class DedupLaunchTest(unittest.TestCase):
  """mb.launch with a stand-in for torchrun: the runs, their environments and the status."""

  def launch(self, argv, mkernel_rcs=(0, 0)):
    calls = []

    def fake(tool, script, wargv, env, distributed, nproc, nproc_flag, timeout=None):
      calls.append(dict(tool=tool, argv=list(wargv), env=dict(env), nproc=nproc))
      if "--side-out" in wargv:
        with open(wargv[wargv.index("--side-out") + 1], "w") as f:
          json.dump(dict(meta={}, rows=[]), f)
        return 0, None
      calls[-1]["torch_from"] = wargv[wargv.index("--torch-from") + 1]
      if mb.DEDUP_ENV not in env:
        return mkernel_rcs[0], None
      mode = int(env[mb.DEDUP_ENV])  # what rank 0 of that run leaves for the summary
      rows = [dict(H=1024, I=512, E=16, k=4, T=256, variants={"mkernel_auto": dict(ms=2.0 - mode)},
                   checks={}, xnode_mib_model={"0": 3.0, "1": 2.0})]
      dd.append_summary(rows, mode, mb.shape_text, mb.check_text, env[dd.SUMMARY_ENV])
      return mkernel_rcs[len(calls) - 2], None

    real, env = bpu.run_workers, dict(os.environ)
    os.environ.pop(mb.DEDUP_ENV, None)
    bpu.run_workers = fake
    try:
      with contextlib.redirect_stdout(io.StringIO()) as out:
        rc = mb.launch(mb.parse_args(argv), argv)
    finally:
      bpu.run_workers = real
      os.environ.clear()
      os.environ.update(env)
    self.out = out.getvalue()
    return rc, calls

  def test_one_torch_side_then_each_mode(self):
    argv = ["ffn", "--nproc", "4", "--nodes", "2", "--shapes", "1024:512:16:4:256",
            "--dedup-modes", "0,1"]
    rc, calls = self.launch(argv)
    self.assertEqual(rc, 0)
    self.assertEqual([("--side-out" in c["argv"], c["env"].get(mb.DEDUP_ENV)) for c in calls],
                     [(True, None), (False, "0"), (False, "1")])
    self.assertEqual(calls[1]["torch_from"], calls[2]["torch_from"])
    for c in calls:
      self.assertEqual(c["argv"][:len(argv)], argv)
      self.assertEqual(c["nproc"], 4)
    for c in calls[1:]:
      self.assertEqual(c["env"]["MKERNEL_EMULATE_NODES"], "2")
      self.assertEqual(c["tool"], "moe_bench mkernel side (%s=%s)" % (mb.DEDUP_ENV,
                                                                     c["env"][mb.DEDUP_ENV]))
    self.assertEqual(calls[1]["env"][dd.SUMMARY_ENV], calls[2]["env"][dd.SUMMARY_ENV])
    self.assertFalse(os.path.exists(calls[1]["env"][dd.SUMMARY_ENV]))  # removed after
    shape = "| H=1024 I=512 E=16 k=4 T=256 |"
    self.assertIn("| shape | mode | mkernel_auto | check | x-node MiB/call |", self.out)
    self.assertIn(shape + " 0 | 2.000 | n/a | 3.00 (mode 1 2.00) |", self.out)
    self.assertIn(shape + " 1 | 1.000 | n/a | 2.00 (mode 0 3.00) |", self.out)
    self.assertEqual(self.launch(argv, (0, 3))[0], 3)
    self.assertEqual(self.launch(argv, (1, 0))[0], 1)
    self.assertEqual(self.launch(argv, (3, 2))[0], 2)

  def test_summary_names_a_missing_mode(self):
    e = [dict(mode=0, shape="S", ms={"torch": 4.0, "mkernel_auto": 2.0}, check="0.004 ok",
              xnode="3.00 (mode 1 2.00)"), dict(mode=0, shape="T", skipped="E=6 is not ...")]
    text = dd.summary_text(e, [0, 1])
    self.assertIn("| S | 0 | 4.000 | 2.000 | 0.004 ok | 3.00 (mode 1 2.00) |", text)
    self.assertIn("| S | 1 | no result (that run failed: see above) |", text)
    self.assertIn("| T | 0 | skipped: E=6 is not ... |", text)
    self.assertIn("no mkernel-side run left a result", dd.summary_text([], [0, 1]))

  def test_without_the_option_one_mkernel_side(self):
    rc, calls = self.launch(["ffn", "--nproc", "4", "--nodes", "2"])
    self.assertEqual(rc, 0)
    self.assertEqual(len(calls), 2)
    self.assertNotIn(mb.DEDUP_ENV, calls[1]["env"])
    self.assertNotIn(dd.SUMMARY_ENV, calls[1]["env"])
    self.assertEqual(calls[1]["tool"], "moe_bench mkernel side")


class DedupReportTest(unittest.TestCase):
  META = dict(mode="ffn", command="moe_bench.py ffn", commit="abc", device="H200", nranks=4,
              ranks_per_gpu=4, date="2025-01-01", torch="2.8", cuda="12.8", nccl_version="2.27",
              nccl_provider="mkernel, preloaded", library="/x/libmkernel.so", mkernel_error=None,
              mkernel_path="alltoall", torch_gemm="torch._grouped_mm",
              config=dict(max_rows="tight", routing="uniform", dtype="bf16"))

  def row(self, **kw):
    c = dict(rel_l2=0.004, worst_token=0.01, max_abs=0.01, finite=True, ok=True)
    r = dict(H=1024, I=512, E=16, k=4, T=256, max_rows=512,
             variants={"mkernel_auto": dict(ms=1.0, tflops=10.0)}, checks={"mkernel_auto": c},
             spot={}, ratios={"mkernel_auto": 1.5})
    r.update(kw)
    return r

  def test_column_only_with_the_option(self):
    plain = mb.markdown(self.META, [self.row()])
    self.assertNotIn("x-node", plain)
    self.assertNotIn(mb.DEDUP_ENV, mb.shape_line(self.row()))
    r = self.row(dedup_mode=1, xnode_mib_model={"0": 3.0, "1": 1.875})
    md = mb.markdown(dict(self.META, dedup_mode=1), [r])
    self.assertIn("%s=1 (--dedup-modes" % mb.DEDUP_ENV, md)
    self.assertIn("| spot | x-node MiB/call |", md)
    self.assertIn("| 0.004 ok | n/a | 1.88 (mode 0 3.00) |", md)
    self.assertIn("%s=1, x-node MiB/call (model) 1.88 (mode 0 3.00)" % mb.DEDUP_ENV,
                  mb.shape_line(r))
    self.assertEqual(md.count("\n|---"), 1)
    header = [x for x in md.splitlines() if x.startswith("| shape")][0]
    sep = [x for x in md.splitlines() if x.startswith("|---")][0]
    self.assertEqual(header.count("|"), sep.count("|"))


if __name__ == "__main__":
  unittest.main()
