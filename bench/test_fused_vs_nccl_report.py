#!/usr/bin/env python3
"""CPU check of bench/fused_vs_nccl_report.py on hand-made driver output (no GPU needed):
python3 bench/test_fused_vs_nccl_report.py  -> prints the table, exits 0 when every assertion
holds. The inputs follow bench_fused_procs_bench's JSON and log formats."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def variant(ms, wrong=0, r0=None, r1=None, flops=1.0):
    r0 = ms if r0 is None else r0
    r1 = ms if r1 is None else r1
    return {"wrong_per_rank": [wrong, 0], "wrong": wrong, "worst_err_over_tol": 0.1,
            "median_ms": ms, "p10_ms": ms, "p90_ms": ms, "tflops_per_rank": flops / ms,
            "reps_ms": [ms] * 3, "per_rank_median_ms": [r0, r1],
            "per_rank_tflops": [flops / r0, flops / r1]}


def shape(op, M, N, K, tag, variants, state="ran", note=""):
    return {"op": op, "M": M, "N": N, "K": K, "shape_tag": tag, "state": state, "note": note,
            "variants": variants}


def run(label, shapes, lib):
    return {"label": label, "command": "x", "library": lib, "version": "22809", "nprocs": 2,
            "ranks_per_node": 1, "ranks_finished": True, "reps": 3, "warmup": 1, "seed": 1,
            "variants": [], "shapes": shapes, "wrong_total": 0}


def main():
    d = tempfile.mkdtemp(prefix="fvn-report-")
    os.makedirs(os.path.join(d, "runs"))
    os.makedirs(os.path.join(d, "logs"))
    mk = [shape("gemm_allreduce", 2048, 8192, 8192, "",
                {"auto": variant(10.0), "fused": variant(9.0), "sequential": variant(10.0)}),
          shape("allgather_gemm", 8192, 512, 8192, "",
                {"auto": variant(4.0, r0=3.9), "fused": variant(4.0), "sequential": variant(4.1)}),
          shape("gemm_reducescatter", 2048, 8192, 8192, "",
                {"auto": variant(5.0, wrong=7), "fused": variant(5.0), "sequential": variant(5.0)}),
          shape("gemm_reducescatter", 8192, 8192, 1024, "K/8", {}, state="not reached")]
    nc = [shape("gemm_allreduce", 2048, 8192, 8192, "", {"cublas+coll": variant(12.0)}),
          shape("allgather_gemm", 8192, 512, 8192, "", {"cublas+coll": variant(3.0)}),
          shape("gemm_reducescatter", 2048, 8192, 8192, "", {"cublas+coll": variant(6.0)}),
          shape("gemm_reducescatter", 8192, 8192, 1024, "K/8", {"cublas+coll": variant(1.0)})]
    json.dump(run("mk", mk, "/b/src/libmkernel.so"), open(os.path.join(d, "runs", "mk.json"), "w"))
    json.dump(run("nccl", nc, "/n/libnccl.so.2"), open(os.path.join(d, "runs", "nccl.json"), "w"))
    # Shape 0: fused ran the fused kernel on both ranks (pids 100, 101); auto logged nothing.
    # Shape 1: the library fell back (its one-time line). Lines of the two pids interleave.
    log = [
        "env ... bench_fused_procs_bench --lib ...",
        "host:100:100 [0] mkernel INFO fused cost model: measured rates for device 0: 6.00 TFLOP/s"
        " per SM, copy 15.0 GB/s per SM, 3000 GB/s peak (cached in /x)",
        "fused_procs_bench: mark pid=100 rank=0 shape=0 op=gemm_allreduce M=2048 N=8192 K=8192 "
        "variant=auto phase=check",
        "fused_procs_bench: mark pid=101 rank=1 shape=0 op=gemm_allreduce M=2048 N=8192 K=8192 "
        "variant=fused phase=check",
        "fused_procs_bench: mark pid=100 rank=0 shape=0 op=gemm_allreduce M=2048 N=8192 K=8192 "
        "variant=fused phase=check",
        "host:101:105 [0] mkernel INFO GemmAllReduce rank 1 M=2048 N=8192 K=8192 fused: "
        "compute=60 comm=6 (model)",
        "host:100:103 [0] mkernel INFO GemmAllReduce rank 0 M=2048 N=8192 K=8192 fused: "
        "compute=60 comm=6 (model)",
        "fused_procs_bench: mark pid=100 rank=0 shape=1 op=allgather_gemm M=8192 N=512 K=8192 "
        "variant=fused phase=check",
        "host:100:100 [0] mkernel INFO AllGatherGemm: no fused kernel for this layout (ranks in "
        "several processes or nodes, N % 4 != 0 or more than 16384 tiles); running GEMM then "
        "collective",
    ]
    open(os.path.join(d, "logs", "mk.log"), "w").write("\n".join(log) + "\n")
    p = subprocess.run([sys.executable, os.path.join(HERE, "fused_vs_nccl_report.py"), d, "abc123",
                        "NVIDIA H200, 580", "bench/fused_vs_nccl.sh b o", "/n/libnccl.so.2",
                        "22809", "MKERNEL_FUSED_AUTO=unset (0)"],
                       capture_output=True, text=True)
    print(p.stdout)
    print(p.stderr, file=sys.stderr)
    doc = json.load(open(os.path.join(d, "fused_vs_nccl.json")))
    md = open(os.path.join(d, "fused_vs_nccl.md")).read()
    rows = doc["comparisons"]
    # An element mismatch makes the run fail (exit 1) whatever the speed.
    assert p.returncode == 1, p.returncode
    assert any("7 mkernel" in f for f in doc["failed"]), doc["failed"]
    assert rows[0]["ratio_nccl_over_mkernel_auto"] == 1.2 and rows[0]["target_met"]
    assert rows[0]["fused_split"] == [dict(rank=0, compute=60, comm=6, source="model"),
                                      dict(rank=1, compute=60, comm=6, source="model")], rows[0]
    assert rows[0]["fused_path"] == "fused compute=60 comm=6 (model)", rows[0]["fused_path"]
    assert rows[0]["auto_path"].startswith("sequential"), rows[0]["auto_path"]
    assert rows[1]["ratio_nccl_over_mkernel_auto"] == 0.75 and not rows[1]["target_met"]
    assert "no fused kernel for this layout" in rows[1]["fused_path"], rows[1]["fused_path"]
    assert abs(rows[1]["per_rank_tflops"]["mkernel_auto"][0] - 1 / 3.9) < 1e-12
    assert rows[3]["ran"] is False and "not reached" in rows[3]["note"]
    assert any("0.75" in m for m in doc["targets_missed"]), doc["targets_missed"]
    assert any("not measured" in m for m in doc["targets_missed"]), doc["targets_missed"]
    assert doc["cost_model_prediction"] == "not exposed" and doc["cost_model_rates"]
    assert "| gemm_allreduce | 2048x8192x8192 | 10.000 | 9.000 | 10.000 | 12.000 | 1.20 | met |" in md
    # Without the mismatch: exit 3 (a target missed), not 1.
    mk[2]["variants"]["auto"] = variant(5.0)
    json.dump(run("mk", mk, "/b/src/libmkernel.so"), open(os.path.join(d, "runs", "mk.json"), "w"))
    p = subprocess.run([sys.executable, os.path.join(HERE, "fused_vs_nccl_report.py"), d, "c", "d",
                        "e", "f", "g", "h"], capture_output=True, text=True)
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
    print("test_fused_vs_nccl_report: OK (%s)" % d)


if __name__ == "__main__":
    main()
