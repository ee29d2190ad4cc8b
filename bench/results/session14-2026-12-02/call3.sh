#!/usr/bin/env bash
# Session 14 call 3: the rest of mk_gpu_tests if call 2's limit cut it, ring attention's
# 2-node mode, the net comparison with the latency experiments of helper-45's report.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs3; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs3.tgz -C $OUT logs3; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout 200 python3 bench/attn_bench.py ring --lib $B/src/libmkernel.so --out $L/attn_2n --mps --nproc 2 --nodes 2 --budget 180 > $L/attn_2n.log 2>&1; echo "attn 2 nodes rc=$? at $(el)s"; grep -E "^\| " $L/attn_2n.log | head -8; tarup
# helper-45's first-size diagnostic (copy diag_first.sh into .snap with the scripts).
timeout 150 bash diag_first.sh $B > $L/diag_first.log 2>&1; echo "diag_first rc=$? at $(el)s"; tail -15 $L/diag_first.log; cp -r $OUT/first $L/ 2>/dev/null; tarup
MK_NVN_BUDGET=80 timeout 100 bash bench/net_vs_nccl.sh $B $L/nvn --quick --no-bound > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| (allreduce|sendrecv) \| (8|4096|65536) \|" $L/nvn/net_vs_nccl.md | head -12 | cut -d'|' -f2-6; echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
