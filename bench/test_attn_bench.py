#!/usr/bin/env python3
"""CPU check of bench/attn_bench.py's pure parts (no torch, no GPU needed):

    python3 bench/test_attn_bench.py [-v]

Argument parsing (ring --nodes and the launcher's internal side options), the merge of the
torch side's rows (the real NCCL, every rank its own host) into the mkernel side's by shape,
the ratios recomputed from them, and the report with its header naming the sides. The
launcher's side environments, host ids and status hand-off are checked in
bench/test_moe_bench.py (bench_py_util is shared).
"""

import contextlib
import io
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import attn_bench as ab  # noqa: E402
import bench_py_util as bpu  # noqa: E402


def parse(*argv):
  return ab.parse_args(list(argv))


def refused(test, *argv):
  with contextlib.redirect_stderr(io.StringIO()) as err, test.assertRaises(SystemExit):
    parse(*argv)
  return err.getvalue()


class ArgsTest(unittest.TestCase):

  def test_defaults_unchanged(self):
    a = parse("ring")
    self.assertEqual((a.nproc, a.nodes, a.side, a.layout, a.seq_list),
                     (4, 1, None, "zigzag", [16384, 32768, 65536, 131072]))
    self.assertTrue(a.lead_in)  # the untimed call before each collective measurement
    self.assertFalse(parse("ring", "--no-lead-in").lead_in)
    a = parse("single")
    self.assertEqual((a.nodes, a.side), (1, None))
    self.assertEqual(a.seq_list, [4096, 8192, 16384, 32768])

  def test_nodes(self):
    self.assertEqual(parse("ring", "--nproc", "2", "--nodes", "2").nodes, 2)
    self.assertEqual(parse("ring", "--nproc", "4", "--nodes", "2").nodes, 2)
    self.assertIn("not a multiple", refused(self, "ring", "--nproc", "3", "--nodes", "2"))
    self.assertIn("not a multiple", refused(self, "ring", "--nproc", "1", "--nodes", "2"))
    self.assertIn("at least 1", refused(self, "ring", "--nodes", "0"))
    refused(self, "single", "--nodes", "2")  # ring only
    self.assertIn("only with --nodes", refused(self, "ring", "--side", "torch", "--side-out",
                                               "f"))
    self.assertIn("--side-out", refused(self, "ring", "--nproc", "2", "--nodes", "2", "--side",
                                        "torch"))
    # What the launcher hands each side parses (torchrun sees --ranks, not --nproc).
    argv = bpu.worker_argv(bpu.side_argv(["ring", "--nproc", "2", "--nodes", "2"], "mkernel",
                                         "/tmp/t.json"))
    a = parse(*argv)
    self.assertEqual((a.nproc, a.nodes, a.side, a.torch_from), (2, 2, "mkernel", "/tmp/t.json"))

  def test_torch_variants(self):
    a = parse("ring", "--backends", "cudnn,flash")
    self.assertEqual(ab.torch_variants(a), ["torch_default", "torch_cudnn", "torch_flash"])


def ms(t, f=1e12):
  return dict(ms=t, tflops=f / (t * 1e-3) / 1e12)


def ring(S, causal, variants, check=True):
  c = dict(against="torch_default", max_abs_diff=0.01, ok=True) if check else None
  return ab.ring_row(S, 128, causal, 1, 16, 16, 1e12, variants, c)


class MergeTest(unittest.TestCase):

  def mk_rows(self):
    mk = lambda: {"mkernel_auto": ms(2.0), "mkernel_sequential": ms(2.2),  # noqa: E731
                  "kernel_1rank": ms(1.9)}
    return [ring(16384, False, mk()), ring(16384, True, mk()), ring(32768, False, mk()),
            dict(S=65536, D=128, causal=False, skipped="budget exhausted")]

  def test_merge_and_ratios(self):
    rows = self.mk_rows()
    self.assertNotIn("auto_vs_torch", rows[0]["ratios"])  # the mkernel side alone: no torch
    torch_rows = [ring(16384, True, {"torch_default": ms(3.0), "torch_cudnn": ms(2.5),
                                     "torch_flash": {"error": "no kernel"}}, check=False),
                  ring(16384, False, {"torch_default": ms(2.6), "torch_cudnn": ms(2.4)},
                       check=False),
                  dict(S=32768, D=128, causal=False, skipped="budget exhausted"),
                  dict(S=65536, D=128, causal=False, skipped="budget exhausted")]
    names = ab.torch_variants(parse("ring", "--backends", "cudnn,flash"))
    missing = bpu.merge_torch_rows(rows, torch_rows, ab.row_key,
                                   lambda x: x.startswith("torch"), names)
    self.assertEqual(missing, 1)
    for r in rows:
      if "variants" in r:
        ab.set_ratios(r)
    self.assertEqual(rows[0]["best_torch"], "torch_cudnn")
    self.assertAlmostEqual(rows[0]["ratios"]["auto_vs_torch"], 1.2)
    self.assertIs(rows[0]["target_met"], True)  # 1.2 vs torch, 1.1 vs seq, 0.95 vs 1 rank
    self.assertAlmostEqual(rows[1]["ratios"]["auto_vs_torch"], 1.25)
    rows[1]["variants"]["torch_cudnn"] = ms(2.3)  # torch's fastest path decides the target
    ab.set_ratios(rows[1])
    self.assertEqual((rows[1]["best_torch"], rows[1]["target_met"]), ("torch_cudnn", False))
    self.assertEqual(rows[1]["variants"]["torch_flash"], {"error": "no kernel", "side": "torch"})
    self.assertNotIn("auto_vs_torch", rows[2]["ratios"])
    for n in names:
      self.assertIn("budget exhausted", rows[2]["variants"][n]["error"])
    self.assertNotIn("variants", rows[3])

  def test_report_names_the_sides(self):
    rows = self.mk_rows()
    bpu.merge_torch_rows(rows, [], ab.row_key, lambda x: x.startswith("torch"),
                         ["torch_default"], "torch side killed after 570 s (--budget + 180 s)")
    for r in rows:
      if "variants" in r:
        ab.set_ratios(r)
    facts = dict(nccl_version="2.28.3", env=dict(LD_PRELOAD="/b/libmkernel.so",
                                                  MKERNEL_EMULATE_NODES="2"))
    meta = dict(mode="ring", command="attn_bench.py ring", commit="abc", device="H200", nranks=2,
                date="2025-01-01", torch="2.8", cuda="12.8", cudnn=90000, library="/b/x.so",
                mkernel_error=None, nodes_header=bpu.nodes_header(
                    2, 2, {}, facts, "torch side killed after 570 s (--budget + 180 s)"))
    md = ab.markdown(meta, rows)
    self.assertIn("- layout: 2 (virtual) nodes of 1 rank(s)", md)
    self.assertIn("MKERNEL_EMULATE_NODES=2", md)
    self.assertIn("NO TORCH TIMINGS: torch side killed after 570 s", md)
    self.assertIn("- torch_default: torch side (real NCCL): torch side killed", md)
    self.assertIn("| 16384 | 128 | no | 2.00 (500) | 2.20 (455) | 1.90 (526) | n/a | None | "
                  "n/a | 1.100 | 0.950 | 0.01 |", md)


if __name__ == "__main__":
  unittest.main()
