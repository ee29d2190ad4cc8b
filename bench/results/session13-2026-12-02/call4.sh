#!/usr/bin/env bash
# Session 13 call 4: s13-ack (grouped GEMMs wide by default; held acks in the proxy).
# Build into ../build-dev; the suites touching them; an 8-byte repeat diagnostic (is the
# first measured size slow?); net_vs_nccl --quick with the held-ack A/B run.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs4; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs4.tgz -C $OUT logs4; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout 150 $B/tests/mk_gpu_tests --gtest_filter='GemmGrouped*:*Moe*:GemmCorrectness.ClusterPairs:*Vnodes*:*Hier*:*CollProcs*:*DevComm*:*CollP2p*' > $L/gtest.log 2>&1; echo "gtest rc=$? at $(el)s"
grep -E "FAILED  \]|^\[  PASSED  \] [0-9]{2,}|Failure" $L/gtest.log | head -12; tarup
(cd $B && timeout 40 ctest -L mp -R 'Proxy' > $L/ctest_proxy.log 2>&1); echo "ctest proxy rc=$? at $(el)s"; grep -E "tests passed|Failed" $L/ctest_proxy.log | head -3
# Diagnostic: the same 8-byte sendrecv measured three times in a row, hold on and off.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-c4 CUDA_MPS_LOG_DIRECTORY=/tmp/mps-c4-log; mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d
for h in 20 0; do
  env NCCL_SOCKET_IFNAME=lo MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_STATS=1 MKERNEL_PROXY_ACK_HOLD_US=$h timeout 60 $B/bench/bench_net_procs_bench --lib $B/src/libmkernel.so --nprocs 2 --ranks-per-node 1 --ops sendrecv,allreduce --lat-sizes 8,8,8,4096 --bw-sizes '' --lat-iters 500 --out $L/diag_hold$h.json > $L/diag_hold$h.log 2>&1; echo "diag hold $h rc=$? at $(el)s"
  grep -E "^  (sendrecv|allreduce) " $L/diag_hold$h.log | head -8
  grep -E "commands in|header posted -> batch|received -> applied" $L/diag_hold$h.log | head -6
done
echo quit | nvidia-cuda-mps-control; sleep 1; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; tarup
left=$(( 560 - $(el) )); echo "nvn budget ${left}s"
[ $left -gt 100 ] && MK_NVN_BUDGET=$(( left - 20 )) timeout $left bash bench/net_vs_nccl.sh $B $L/nvn --quick --no-bound > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| " $L/nvn/net_vs_nccl.md 2>/dev/null | head -40; tail -3 $L/nvn.log; echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
