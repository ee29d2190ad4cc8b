#!/usr/bin/env python3
"""CPU check of bench/grouped_bench.py (no GPU, no torch needed): shape parsing and its refusals,
the engine command, reading bench_gemm_bench's JSON, the per-shape summary (medians, ratio),
the report and the exit status, and a dry run."""

import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import grouped_bench as gb  # noqa: E402


class Shapes(unittest.TestCase):

  def test_default_shapes_are_the_issues(self):
    a = gb.parse_args([])
    self.assertEqual(a.shape_list[:2], [(32, 4096, 7168, 2048), (16, 8192, 2048, 1408)])

  def test_refusals(self):
    for bad in ("32:4096:7168", "32:4000:7168:2048", "a:1:2:3", "1:128:7:8", ""):
      with self.assertRaises(ValueError, msg=bad):
        gb.parse_shapes(bad)

  def test_command(self):
    a = gb.parse_args(["--build", "B", "--reps", "5"])
    cmd = gb.engine_cmd(a, (16, 8192, 2048, 1408), "/tmp/x.json")
    self.assertEqual(cmd[0], os.path.join("B", "bench", "bench_gemm_bench"))
    self.assertEqual(cmd[1:], ["--groups", "16", "--shapes", "131072x1408x2048", "--reps", "5",
                               "--out", "/tmp/x.json"])


class EngineEnv(unittest.TestCase):

  def test_parse(self):
    self.assertEqual(gb.parse_engine_env([]), [])
    self.assertEqual(
        gb.parse_engine_env(["tiles:MKERNEL_GEMM_GROUP_CARRY=0",
                             "both:MKERNEL_GEMM_GROUP_CARRY=1, MKERNEL_GEMM_GROUP_CLAIM=1"]),
        [("tiles", {"MKERNEL_GEMM_GROUP_CARRY": "0"}),
         ("both", {"MKERNEL_GEMM_GROUP_CARRY": "1", "MKERNEL_GEMM_GROUP_CLAIM": "1"})])

  def test_refusals(self):
    for bad in (["tiles"], [":A=1"], ["default:A=1"], ["x:A=1", "x:B=2"], ["x:A"], ["x:=1"],
                ["x:a=1"], ["x:1A=1"], ["x:A=1,"]):
      with self.assertRaises(ValueError, msg=bad):
        gb.parse_engine_env(bad)
    with self.assertRaises(SystemExit):
      gb.parse_args(["--engine-env", "nolabel"])

  def test_order_rotates(self):
    self.assertEqual([gb.round_order(3, i) for i in range(4)],
                     [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]])
    self.assertEqual([gb.round_order(2, i) for i in range(3)], [[0, 1], [1, 0], [0, 1]],
                     "torch and the engine alone alternate")
    self.assertEqual(gb.round_order(1, 5), [0])

  def test_summary_and_report(self):
    row = gb.summarize((32, 4096, 2048, 7168), [700.0, 720.0], [690.0, 700.0], [],
                       [("tiles", {"MKERNEL_GEMM_GROUP_CARRY": "0"}, [680.0, 0.0])])
    v = row["variants"][0]
    self.assertEqual(v["tflops"], 680.0)  # the failed round left out
    self.assertAlmostEqual(v["ratio"], 680.0 / 710.0)
    self.assertAlmostEqual(v["over_default"], 680.0 / 695.0)
    none = gb.summarize((32, 4096, 2048, 7168), [700.0], [690.0], [], [("x", {}, [0.0])])
    self.assertIsNone(none["variants"][0]["ratio"])
    md = gb.report({"rounds": 2}, [row, none])
    self.assertIn("| 32 x 4096 | 2048 -> 7168 | tiles | MKERNEL_GEMM_GROUP_CARRY=0 | 680.0 | 0.958 "
                  "| 0.978 |", md)
    self.assertIn("| 32 x 4096 | 2048 -> 7168 | x |  | - | - | - |", md)
    self.assertEqual(gb.exit_status([row]), 3)  # the default's ratio decides
    self.assertNotIn("Engine variants", gb.report({}, [gb.summarize((32, 4096, 2048, 7168), [1.0],
                                                            [1.0], [])]))


class Results(unittest.TestCase):

  def doc(self, grouped):
    return json.dumps({"results": [
        {"M": 131072, "N": 2048, "K": 7168, "engine_tflops": 700.0,
         "engine_grouped_tflops": grouped},
        {"M": 1024, "N": 1024, "K": 1024, "engine_grouped_tflops": 1.0}]})

  def test_engine_value_of_the_shape(self):
    self.assertEqual(gb.engine_tflops(self.doc(612.5), (32, 4096, 7168, 2048)), 612.5)

  def test_engine_value_missing(self):
    with self.assertRaises(ValueError):
      gb.engine_tflops(self.doc(0.0), (32, 4096, 7168, 2048))
    with self.assertRaises(ValueError):
      gb.engine_tflops(self.doc(600.0), (16, 8192, 2048, 1408))

  def test_tflops(self):
    # 2 * 32 * 4096 * 7168 * 2048 flops in 5.5 ms
    self.assertAlmostEqual(gb.tflops(32, 4096, 7168, 2048, 5.5), 699.69, places=2)
    self.assertEqual(gb.tflops(1, 128, 8, 8, 0), 0.0)

  def test_summary_ratio_report_status(self):
    met = gb.summarize((32, 4096, 7168, 2048), [690.0, 700.0, 680.0], [710.0, 0.0, 720.0],
                       ["engine run exited 1: x"])
    self.assertEqual(met["torch_tflops"], 690.0)
    self.assertEqual(met["engine_tflops"], 715.0)  # the failed round left out
    self.assertAlmostEqual(met["ratio"], 715.0 / 690.0)
    self.assertEqual(met["torch_reference_tflops"], 695.0)
    missed = gb.summarize((16, 8192, 2048, 1408), [550.0], [500.0], [])
    self.assertEqual(gb.exit_status([met]), 0)
    self.assertEqual(gb.exit_status([met, missed]), 3)
    failed = gb.summarize((16, 8192, 2048, 1408), [550.0], [0.0], ["boom"])
    self.assertIsNone(failed["ratio"])
    self.assertEqual(gb.exit_status([met, failed]), 1)
    md = gb.report({"command": "c", "commit": "x", "device": "d", "torch": "t", "date": "now",
                    "rounds": 3}, [met, missed, failed])
    self.assertIn("| 32 x 4096 | 7168 -> 2048 | 690.0 | 715.0 | 1.036 | met |", md)
    self.assertIn("| 16 x 8192 | 2048 -> 1408 | 550.0 | 500.0 | 0.909 | MISSED |", md)
    self.assertIn("no result", md)
    self.assertIn("boom", md)

  def test_dry_run(self):
    out = subprocess.run([sys.executable, os.path.join(HERE, "grouped_bench.py"), "--dry-run",
                          "--build", "BB", "--shapes", "2:128:64:64"],
                         capture_output=True, text=True, timeout=60)
    self.assertEqual(out.returncode, 0, out.stderr)
    self.assertIn("BB/bench/bench_gemm_bench --groups 2 --shapes 256x64x64", out.stdout)

  def test_dry_run_variants(self):
    out = subprocess.run([sys.executable, os.path.join(HERE, "grouped_bench.py"), "--dry-run",
                          "--build", "BB", "--shapes", "2:128:64:64", "--engine-env",
                          "tiles:MKERNEL_GEMM_GROUP_CARRY=0"],
                         capture_output=True, text=True, timeout=60)
    self.assertEqual(out.returncode, 0, out.stderr)
    self.assertIn("tiles: MKERNEL_GEMM_GROUP_CARRY=0 BB/bench/bench_gemm_bench --groups 2",
                  out.stdout)


if __name__ == "__main__":
  unittest.main()
