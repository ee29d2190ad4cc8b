#!/usr/bin/env bash
# Session 14 call 4: proxy threads on their own cores (17ac0d4): build, the multi-process GPU
# suites, the first-size diagnostic with the new and the old pinning, the net comparison
# against the real NCCL (2x1, 2x2), ReduceScatter 2x2, ring attention across 2 nodes (short).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs4; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs4.tgz -C $OUT logs4; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout 100 $B/tests/mk_gpu_tests --gtest_filter='*HierOps*:*CollProcs*:*Vnodes*' > $L/gtest.log 2>&1; echo "gtest rc=$? at $(el)s"
grep -E "FAILED  \]|^\[  PASSED  \] [0-9]{2,}|Failure" $L/gtest.log | head -12
(cd $B && timeout 60 ctest -R "Proxy|ProxyPin" > $L/ctest_proxy.log 2>&1); echo "ctest proxy rc=$? at $(el)s"; grep -E "tests passed|tests failed" $L/ctest_proxy.log; tarup
timeout 120 bash diag_pin.sh $B > $L/diag_pin.log 2>&1; echo "diag_pin rc=$? at $(el)s"; grep -E "^==|^   (sendrecv|allreduce)|pinned" $L/diag_pin.log | head -50; cp -r $OUT/pin $L/ 2>/dev/null; rm -rf $OUT/pin $OUT/pin.tgz; tarup
MK_NVN_BUDGET=80 timeout 100 bash bench/net_vs_nccl.sh $B $L/nvn --quick --no-bound > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| (allreduce|sendrecv) \| (8|4096|65536|8388608|268435456) \|" $L/nvn/net_vs_nccl.md | head -24 | cut -d'|' -f2-6; tarup
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-s14 CUDA_MPS_LOG_DIRECTORY=/tmp/mps-s14-log; mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; nvidia-cuda-mps-control -d
env NCCL_SOCKET_IFNAME=lo MKERNEL_EMULATE_NODES=2 timeout 60 $B/bench/bench_net_procs_bench --lib $B/src/libmkernel.so --nprocs 4 --ranks-per-node 2 --ops reducescatter --lat-sizes 16,16,65536 --bw-sizes 8388608 --lat-iters 200 --bw-iters 4 --out $L/rs_2x2_mk.json > $L/rs_2x2_mk.log 2>&1; echo "rs mk rc=$? at $(el)s"; grep -E "^  reducescatter " $L/rs_2x2_mk.log
echo quit | nvidia-cuda-mps-control; sleep 1; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; tarup
left=$(( 560 - $(el) )); echo "left ${left}s"
[ $left -gt 90 ] && timeout $left python3 bench/attn_bench.py ring --lib $B/src/libmkernel.so --out $L/attn_2n --mps --nproc 2 --nodes 2 --seqs 16384,32768 --head-dims 128 --reps 5 --budget $(( (left - 40) / 2 )) > $L/attn_2n.log 2>&1; echo "attn 2 nodes rc=$? at $(el)s"; grep -E "^\| " $L/attn_2n.log | head -8
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
