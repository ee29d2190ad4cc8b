#!/usr/bin/env bash
# Session 20 call A (cold machine, fresh snapshot): build; the hierarchical small AllReduce's
# skipped slot acquires (new test SmallAfterMultiChunkAllReduce and the small-kernel suites);
# coll_bench at small sizes with cudaMalloc / registered / windows / ncclMemAlloc-alone buffers
# and the host enqueue time per call (why windows were slower at 8 B-32 KiB in session 19);
# then bench/net_vs_nccl.sh full (issue 11's tables) in the time left.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsA; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsA.tgz -C $OUT logsA; }
B=/tmp/mkb
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head -5
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout -k 5 150 $B/tests/mk_gpu_tests --gtest_filter='*HierOps.Small*:*HierOps.TwentyBackToBackMixed*:*HierInline64.*:*HierAllReduce.*' > $L/gtest.log 2>&1; echo "gtest rc=$? at $(el)s"
grep -E "^\[  (PASSED|FAILED)  \]|^\[  FAILED  \] [A-Za-z]|Failure" $L/gtest.log | head -12; tarup
for r in 0 2 3 1; do
  timeout 45 $B/bench/bench_coll_bench --no-real-nccl --skip single --ranks 4 -b 8 -e 2M -f 8 --big-bytes 16M --reg $r --out $L/coll_reg$r.json > $L/coll_reg$r.log 2>&1; echo "coll reg $r rc=$? at $(el)s"
done
python3 - $L <<'PY'
import json, sys, os
L = sys.argv[1]; rows = {}
for r in (0, 2, 3, 1):
    p = os.path.join(L, "coll_reg%d.json" % r)
    if not os.path.exists(p): continue
    for x in json.load(open(p))["shared_gpu"].get("sweep", []):
        rows.setdefault((x["coll"], x["size_bytes"]), {})[r] = (x["time_us"], x.get("host_enqueue_us", float("nan")))
print("coll bytes | reg0 t/host | reg2 (windows) | reg3 (memalloc) | reg1 (registered)")
for (c, b), v in sorted(rows.items()):
    print(c, b, " | ".join("%.1f/%.1f" % v[r] if r in v else "-" for r in (0, 2, 3, 1)))
PY
tarup
left=$(( 585 - $(el) ))
MK_NVN_BUDGET=$(( left - 20 )) timeout $left bash bench/net_vs_nccl.sh $B $L/nvn --no-bound --rounds 2 > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| (allreduce|sendrecv) \|" $L/nvn/net_vs_nccl.md | head -40 | cut -d'|' -f2-6,10; grep -A8 "## Verdict" $L/nvn/net_vs_nccl.md
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
