#!/usr/bin/env python3
"""CPU check of bench/net_vs_nccl.sh's rounds and report (no GPU needed): the script runs
against a fake driver and a fake MPS control, so that its options, its run list and the
best-of-rounds rule of the report are checked. python3 -m unittest bench/test_net_vs_nccl_bench.py"""
import json
import os
import shutil
import stat
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

# Fake bench_net_procs_bench: mkernel takes 30 us in round 1 and 20 in round 2, NCCL 25 and
# 40 (plus 1 us per kB), so the report must show 20 against 25 with --rounds 2.
DRIVER = r'''#!/usr/bin/env python3
import json, sys
a = sys.argv[1:]
g = lambda k: a[a.index(k) + 1] if k in a else ""
mk = "libmkernel" in g("--lib")
rnd = 2 if "round 2" in g("--label") else 1
def sizes(s):
    return [int(x[:-1]) << 20 if x.endswith("M") else int(x) for x in s.split(",") if x]
res = []
for op in ("allreduce", "sendrecv"):
    for b in sizes(g("--lat-sizes")) + sizes(g("--bw-sizes")):
        t = ((30.0 if rnd == 1 else 20.0) if mk else (25.0 if rnd == 1 else 40.0)) + b / 1e3
        res.append(dict(op=op, bytes=b, time_us=t, busbw_gbs=b / t / 1e3, wrong=0))
json.dump(dict(results=res, pingpong_us=0.8), open(g("--out"), "w"))
'''
MPS = '''#!/bin/sh
[ "${1:-}" = "-d" ] && exit 0
read cmd; [ "$cmd" = get_server_list ] && exit 1; exit 0
'''


def script(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class NetVsNcclRounds(unittest.TestCase):
    def setUp(self):
        self.d = tempfile.mkdtemp(prefix="nvn-test-")
        for sub in ("bin", "build/src", "build/bench"):
            os.makedirs(os.path.join(self.d, sub))
        script(os.path.join(self.d, "bin", "nvidia-cuda-mps-control"), MPS)
        script(os.path.join(self.d, "build", "bench", "bench_net_procs_bench"), DRIVER)
        open(os.path.join(self.d, "build", "src", "libmkernel.so"), "w").close()
        self.nccl = os.path.join(self.d, "libnccl.so.2")
        open(self.nccl, "w").close()

    def tearDown(self):
        shutil.rmtree(self.d, ignore_errors=True)

    def read(self, *parts):
        with open(os.path.join(self.d, *parts)) as f:
            return f.read()

    def nvn(self, out, *args):
        env = dict(os.environ, PATH=os.path.join(self.d, "bin") + ":" + os.environ["PATH"],
                   MK_REAL_NCCL=self.nccl, MK_NVN_BUDGET="300")
        env.pop("CUDA_MPS_PIPE_DIRECTORY", None)
        p = subprocess.run(["bash", os.path.join(HERE, "net_vs_nccl.sh"),
                            os.path.join(self.d, "build"), os.path.join(self.d, out), "--quick",
                            "--no-bound"] + list(args), env=env, capture_output=True, text=True,
                           timeout=120)
        return p

    def rows(self, out):
        doc = json.loads(self.read(out, "net_vs_nccl.json"))
        return {(c["layout"], c["op"], c["bytes"]): c for c in doc["comparisons"]}, doc

    def test_best_round_of_each_side(self):
        p = self.nvn("r2", "--rounds", "2")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        rows, doc = self.rows("r2")
        for layout in ("2 nodes x 1", "2 nodes x 2"):
            c = rows[(layout, "allreduce", 8)]
            self.assertAlmostEqual(c["mkernel"]["time_us"], 20.008, places=3)  # round 2
            self.assertAlmostEqual(c["nccl"]["time_us"], 25.008, places=3)  # round 1
            self.assertEqual(c["mkernel"]["rounds"], 2)
            self.assertEqual(c["verdict"], "latency met")
        self.assertEqual(doc["runs"]["mk_2x1"]["rounds"], 2)
        self.assertIn("best round per size", self.read("r2", "net_vs_nccl.md"))
        self.assertTrue(os.path.exists(os.path.join(self.d, "r2", "runs", "nccl_4x1__r2.json")))

    def test_one_round_is_the_plain_comparison(self):
        p = self.nvn("r1")
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)  # 30 us against 25: missed
        rows, doc = self.rows("r1")
        c = rows[("2 nodes x 1", "allreduce", 8)]
        self.assertAlmostEqual(c["mkernel"]["time_us"], 30.008, places=3)
        self.assertEqual(c["verdict"], "latency MISSED")
        self.assertNotIn("rounds", doc["runs"]["mk_2x1"])
        self.assertFalse(os.path.exists(os.path.join(self.d, "r1", "runs", "mk_2x1__r2.json")))

    def test_bad_rounds_refused(self):
        for bad in ("0", "x", "100"):
            p = self.nvn("bad", "--rounds", bad)
            self.assertEqual(p.returncode, 2, bad + ": " + p.stdout + p.stderr)
            self.assertIn("--rounds", p.stderr + p.stdout)


if __name__ == "__main__":
    unittest.main()
