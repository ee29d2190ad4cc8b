#!/usr/bin/env bash
# Session 19 call A: both README set-up commands, as written, on a git-archive snapshot of the
# commit (a fresh tree): scripts/demo.sh (builds ./build: libmkernel + the demo, runs it), then
# scripts/test.sh (builds the rest into the same ./build, runs every ctest entry). The GPU tests
# of the one change that has never run on a GPU (the GEMM engine's dynamic tile claim and the
# fused MoE kernel that uses it) are left out of this run through GTEST_FILTER: a hang there
# would hold the single mk_gpu_tests entry to the end of the call. Call B runs them on their own
# under a timeout, on this build.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsA; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsA.tgz -C $OUT logsA; }
echo "commit $(cat COMMIT_SNAP)"
RISKY="-GemmDynamic.*:GemmGrouped.DynamicTileClaim:Moe/MoeFusedThreads.*:MoeFusedSplit.ForcedCommSmsSameBits:MoeFusedGraph.*:MoeFusedOverflow.*:MoeFusedAbort.*"; echo "GTEST_FILTER for test.sh: $RISKY"
timeout -k 5 240 bash scripts/demo.sh > $L/demo.log 2>&1; echo "demo rc=$? at $(el)s"; tail -14 $L/demo.log; tarup
left=$(( 585 - $(el) ))
GTEST_FILTER="$RISKY" timeout -k 5 $left bash scripts/test.sh > $L/test.log 2>&1; echo "test rc=$? at $(el)s"; tail -22 $L/test.log
cp build/Testing/Temporary/LastTest.log $L/ 2>/dev/null
grep -E "^\[  (PASSED|FAILED)  \]|^\[  FAILED  \] [A-Za-z]|^\[  SKIPPED \] [0-9]" $L/LastTest.log | head -30
gzip -f $L/LastTest.log $L/test.log; tarup
# Time left: the left-out tests on their own under a timeout (call B skips them if they ran here).
DYN='GemmDynamic.*:GemmGrouped.*:Moe/MoeFusedThreads.*:MoeFusedSplit.*:MoeFusedGraph.*:MoeFusedOverflow.*:MoeFusedAbort.*:GemmHooks.*'
left=$(( 590 - $(el) ))
if [ $left -gt 45 ]; then
  LD_LIBRARY_PATH=build/src timeout -k 5 $left build/tests/mk_gpu_tests --gtest_filter="$DYN" > $L/gtest-dyn.log 2>&1; rc=$?; echo "gtest dyn rc=$rc at $(el)s"
  grep -E "^\[  (PASSED|FAILED)  \]|^\[  FAILED  \] [A-Za-z]|Failure" $L/gtest-dyn.log | head -12
  [ $rc = 0 ] && touch build/.dyn_passed; tarup
fi
