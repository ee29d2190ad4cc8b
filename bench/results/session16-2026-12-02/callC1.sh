#!/usr/bin/env bash
# Session 16 call C1 (cold; s16-inline = s16-cand after review mends + small puts of 9..64
# bytes carried in the proxy command ring behind MKERNEL_PROXY_INLINE_CMD=2): build; the
# inter-node suites with the default (1) and with 2; the changed GEMM test; proxy/socket
# ctests; net_vs_nccl 2 rounds with the INLINE_CMD=2 diagnostic.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsC1; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsC1.tgz -C $OUT logsC1; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
G="$B/tests/mk_gpu_tests"
timeout 130 $G --gtest_filter='*HierOps*:*CollProcs*:*Vnodes*:*Devcomm*:*Inline*:GemmCorrectness.PingPong:CommInitAgreed.*' > $L/gtest1.log 2>&1; echo "gtest default rc=$? at $(el)s"
grep -E "FAILED  \]|^\[  PASSED  \] [0-9]+|Failure" $L/gtest1.log | head -12; tarup
MKERNEL_PROXY_INLINE_CMD=2 timeout 100 $G --gtest_filter='*HierOps*:*Devcomm*:*Inline*' > $L/gtest2.log 2>&1; echo "gtest inline=2 rc=$? at $(el)s"
grep -E "FAILED  \]|^\[  PASSED  \] [0-9]+|Failure" $L/gtest2.log | head -12; tarup
(cd $B && timeout 80 ctest -R 'Proxy|Socket|socket|NetConformance' > $L/ctest_net.log 2>&1); echo "ctest net rc=$? at $(el)s"; grep -E "tests passed|tests failed|\*\*\*Failed" $L/ctest_net.log | head -6
left=$(( 585 - $(el) )); echo "left ${left}s"
[ $left -gt 60 ] && MK_NVN_BUDGET=$(( left - 20 )) timeout $left bash bench/net_vs_nccl.sh $B $L/nvn --no-bound --rounds 2 > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| (allreduce|sendrecv) \| [0-9]+ \|" $L/nvn/net_vs_nccl.md | cut -d'|' -f2-6,10 | head -80; grep -A10 "## Verdict" $L/nvn/net_vs_nccl.md | head -12
cp $L/nvn/net_vs_nccl.md $L/nvn/net_vs_nccl.json $L/ 2>/dev/null
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
