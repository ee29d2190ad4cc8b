#!/usr/bin/env bash
# Session 14 call 1: first GPU run of branch s13-next (GEMM CTA pairs without the cluster-scope
# release; inter-node ReduceScatter's two-launch form on two nodes of several ranks; the
# reducescatter op of bench_net_procs_bench). Build into ../build-dev (kept while warm).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs1; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs1.tgz -C $OUT logs1; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout 60 $B/tests/mk_gpu_tests --gtest_filter='GemmCorrectness.ClusterPairs' > $L/gtest_pairs.log 2>&1; echo "pairs rc=$? at $(el)s"; grep -E "FAILED  \]|^\[  PASSED" $L/gtest_pairs.log | head -3
timeout 70 $B/bench/bench_gemm_bench --shapes 8192x8192x512,8192x8192x1024,8192x8192x2048,8192x8192x8192 --reps 12 --clusters --pipelines --out $L/gemm_pairs.json > $L/gemm_pairs.log 2>&1; echo "gemm pairs rc=$? at $(el)s"; grep -E "CTA pairs|geomean" $L/gemm_pairs.log | head -6; tarup
timeout 120 $B/tests/mk_gpu_tests --gtest_filter='*HierOps*:*CollProcs*:*Vnodes*:*FusedGemmColl*:GemmGrouped*' > $L/gtest.log 2>&1; echo "gtest rc=$? at $(el)s"
grep -E "FAILED  \]|^\[  PASSED  \] [0-9]{2,}|Failure" $L/gtest.log | head -12; tarup
# ReduceScatter 2 nodes x 2 processes: mkernel against the real NCCL (4 hosts x 1), MPS.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-s14 CUDA_MPS_LOG_DIRECTORY=/tmp/mps-s14-log; mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; nvidia-cuda-mps-control -d
NCCL_LIB=$(python3 -c 'import nvidia.nccl as m, glob, os; ds = list(getattr(m, "__path__", [])); print(sorted(glob.glob(os.path.join(ds[0], "lib", "libnccl.so*")))[0])' 2>/dev/null); echo "real NCCL: $NCCL_LIB"
for side in mk nccl; do
  if [ $side = mk ]; then E="MKERNEL_EMULATE_NODES=2"; LIBP=$B/src/libmkernel.so; X="--ranks-per-node 2"; else E="NCCL_NET=Socket NCCL_IB_DISABLE=1"; LIBP=$NCCL_LIB; X="--ranks-per-node 1 --rank-env NCCL_HOSTID=h%r"; fi
  env NCCL_SOCKET_IFNAME=lo $E timeout 90 $B/bench/bench_net_procs_bench --lib $LIBP --nprocs 4 $X --ops reducescatter,allreduce --lat-sizes 8,65536 --bw-sizes 8388608,67108864 --lat-iters 200 --bw-iters 4 --out $L/rs_2x2_$side.json > $L/rs_2x2_$side.log 2>&1; echo "rs $side rc=$? at $(el)s"; grep -E "^  (reducescatter|allreduce) " $L/rs_2x2_$side.log
done
# 8-byte puts in the proxy command (b7ea524) on and off: 2 x 1, the same size three times.
for ic in 1 0; do
  env NCCL_SOCKET_IFNAME=lo MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_STATS=1 MKERNEL_PROXY_INLINE_CMD=$ic timeout 60 $B/bench/bench_net_procs_bench --lib $B/src/libmkernel.so --nprocs 2 --ranks-per-node 1 --ops sendrecv,allreduce --lat-sizes 8,8,8,4096 --bw-sizes '' --lat-iters 500 --out $L/inlcmd$ic.json > $L/inlcmd$ic.log 2>&1; echo "inline cmd $ic rc=$? at $(el)s"; grep -E "^  (sendrecv|allreduce) " $L/inlcmd$ic.log
done
echo quit | nvidia-cuda-mps-control; sleep 1; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; tarup
left=$(( 540 - $(el) )); [ $left -gt 60 ] && MK_FVN_BUDGET=$(( left - 20 )) timeout $left bash bench/fused_vs_nccl.sh $B $L/fvn --quick > $L/fvn.log 2>&1; echo "fvn rc=$? at $(el)s"
grep -E "^\| " $L/fvn/fused_vs_nccl.md 2>/dev/null | cut -d'|' -f1-9 | head -14; tarup
