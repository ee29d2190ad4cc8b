#!/usr/bin/env bash
# Session 14 call 5 (final commit, fresh snapshot, cold machine): the README demo command as
# written (builds into ./build), the inter-node suites (the small AllReduce kernel now serves
# several ranks per node; held-ack fix), the full net_vs_nccl comparison (issue 11's tables),
# nccl-tests with 4 MPI processes as 2 virtual nodes x 2 with -R 1 / -R 2.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs5; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs5.tgz -C $OUT logs5; }
echo "commit $(cat COMMIT_SNAP)"
timeout 200 bash scripts/demo.sh > $L/demo.log 2>&1; echo "demo rc=$? at $(el)s"; tail -4 $L/demo.log; tarup
B=$(pwd)/build
cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head -5
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout 100 $B/tests/mk_gpu_tests --gtest_filter='*HierOps*:*CollProcs*:*Vnodes*' > $L/gtest.log 2>&1; echo "gtest rc=$? at $(el)s"
grep -E "FAILED  \]|^\[  PASSED  \] [0-9]{2,}|Failure" $L/gtest.log | head -12
(cd $B && timeout 60 ctest -R "Proxy" > $L/ctest_proxy.log 2>&1); echo "ctest proxy rc=$? at $(el)s"; grep -E "tests passed|tests failed" $L/ctest_proxy.log; tarup
MK_NVN_BUDGET=130 timeout 150 bash bench/net_vs_nccl.sh $B $L/nvn --no-bound > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| (allreduce|sendrecv) \| (8|64|4096|65536|8388608|268435456) \|" $L/nvn/net_vs_nccl.md | head -40 | cut -d'|' -f2-6,10; grep -A3 "## Verdict" $L/nvn/net_vs_nccl.md; tarup
left=$(( 420 - $(el) )); echo "left ${left}s"
if [ $left -gt 90 ]; then
  MK_NT_MPI=1 timeout 100 bash scripts/prepare_nccl_tests.sh $B .nccl-tests > $L/nt-prepare.log 2>&1; echo "nt prepare rc=$? at $(el)s"; tail -1 $L/nt-prepare.log
  left=$(( 430 - $(el) ))
  [ $left -gt 40 ] && MKERNEL_EMULATE_NODES=2 MK_NT_PROCS=4 MK_NT_MODES=0 MK_NT_MAXBYTES=1M MK_NT_ITERS="-n 2 -w 1" MK_NT_BUDGET=$(( left - 15 )) timeout $left bash scripts/run_nccl_tests_reg.sh $B \
    all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf sendrecv_perf alltoall_perf reduce_perf gather_perf scatter_perf > $L/nt-vnodes-reg.log 2>&1; echo "nt vnodes reg rc=$? at $(el)s"
  grep -E "PASS|FAIL" $L/nt-vnodes-reg.log | tail -22
fi
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
