#!/usr/bin/env bash
# Session 22 call 1 (and the next session's first call, at its main): scripts/test.sh whole on a
# fresh snapshot of main. In session 22 it checked session 21's GPU-unrun changes (hier
# kernels' rt::ctaFailed entry check, MoE threaded reference and shared case bodies, peer_mem
# IPC socket names); next, session 22's reduce-tail failure guard (ecb23f1).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs1; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
timeout -k 5 585 bash scripts/test.sh > $L/test.log 2>&1; echo "test rc=$? at $(el)s"; tail -5 $L/test.log
cp build/Testing/Temporary/LastTest.log $L/ 2>/dev/null
grep -E "tests passed|Test +#.*sec" $L/test.log | tail -30
grep -E "^\[  FAILED  \] [A-Za-z]" $L/LastTest.log | head -20
grep -E "MoeFusedThreads.*ms\)" $L/LastTest.log | head -4
gzip -f $L/LastTest.log $L/test.log
