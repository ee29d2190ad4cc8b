#!/usr/bin/env bash
# Session 15 call D (final candidate s15-final = main + s15-moe; fresh snapshot, cold
# machine): the README demo command as written (builds into ./build), then the rest of the
# build; MoE node dedup mode 1 (MoeVnodes*, MoeProcs*), the GEMM suites after the abort-word
# read change, racecheck with stage reuse, the processes suites and proxy ctests after the
# host-wide slot claim; last the MoE bench, 2 nodes x 2 processes, dedup modes 0 and 1.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsD; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsD.tgz -C $OUT logsD; }
echo "commit $(cat COMMIT_SNAP)"
timeout 200 bash scripts/demo.sh > $L/demo.log 2>&1; echo "demo rc=$? at $(el)s"; tail -3 $L/demo.log; tarup
B=$(pwd)/build
cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head -5
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout 120 $B/tests/mk_gpu_tests --gtest_filter='MoeVnodes*:MoeProcsGraph.*:MoeProcs.*:MoeProcsOverflow.*:GemmSmall.*:GemmCorrectness.*:GemmHooks*:*FusedGemmColl*:GemmGrouped*' > $L/gtest.log 2>&1; echo "gtest rc=$? at $(el)s"
grep -E "FAILED  \]|^\[  PASSED  \] [0-9]{2,}|Failure|MKERNEL_MOE_NODE_DEDUP=1|CrossNodeBytes|ratio" $L/gtest.log | head -24; tarup
timeout 60 compute-sanitizer --tool racecheck $B/tests/mk_gpu_tests --gtest_filter='GemmSmall.*' > $L/racecheck.log 2>&1; echo "racecheck rc=$? at $(el)s"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" $L/racecheck.log | head -3
(cd $B && timeout 60 ctest -R "Proxy" > $L/ctest_proxy.log 2>&1); echo "ctest proxy rc=$? at $(el)s"; grep -E "tests passed|tests failed" $L/ctest_proxy.log; ls /dev/shm | grep -c mkernel-proxy-slot; tarup
left=$(( 330 - $(el) )); echo "left ${left}s"
[ $left -gt 60 ] && timeout $left python3 bench/moe_bench.py ffn --lib $B/src/libmkernel.so --mps --nproc 4 --nodes 2 --dedup-modes 0,1 --shapes 2048:1408:64:6:512 --reps 5 --budget $(( left - 15 )) --out $L/moe_dedup > $L/moe_dedup.log 2>&1; echo "moe dedup rc=$? at $(el)s"; tail -14 $L/moe_dedup.log
tarup
