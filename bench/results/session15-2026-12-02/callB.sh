#!/usr/bin/env bash
# Session 15 call B (same snapshot and build dir as call A): net_vs_nccl full, 2 rounds (issue
# 11's tables); the rest of nccl-tests -R 1/-R 2 with 4 processes as 2 virtual nodes x 2.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsB; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsB.tgz -C $OUT logsB; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
MK_NVN_BUDGET=330 timeout 350 bash bench/net_vs_nccl.sh $B $L/nvn --no-bound --rounds 2 > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| (allreduce|sendrecv) \|" $L/nvn/net_vs_nccl.md | head -40 | cut -d'|' -f2-6,10; grep -A6 "## Verdict" $L/nvn/net_vs_nccl.md; tarup
MK_NT_MPI=1 timeout 100 bash scripts/prepare_nccl_tests.sh $B .nccl-tests > $L/nt-prepare.log 2>&1; echo "nt prepare rc=$? at $(el)s"
left=$(( 570 - $(el) ))
[ $left -gt 40 ] && MKERNEL_EMULATE_NODES=2 MK_NT_PROCS=4 MK_NT_MODES=0 MK_NT_MAXBYTES=1M MK_NT_ITERS="-n 2 -w 1" MK_NT_BUDGET=$(( left - 15 )) timeout $left bash scripts/run_nccl_tests_reg.sh $B \
  alltoall_perf reduce_perf gather_perf scatter_perf broadcast_perf sendrecv_perf > $L/nt-vnodes-reg.log 2>&1; echo "nt vnodes reg rc=$? at $(el)s"
grep -E "PASS|FAIL" $L/nt-vnodes-reg.log | tail -14
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
