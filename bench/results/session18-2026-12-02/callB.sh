#!/usr/bin/env bash
# Session 18 call B (branch s18-scope): small AllReduce with .gpu-scoped local signals and the
# split small kernel (MK_SMALL_SEQ=1: the former one-thread kernel), inline 1 vs 2, against the
# real NCCL as 4 hosts; then the inter-node GPU suites on the branch.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsB; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
LIB=$B/src/libmkernel.so
D=$B/bench/bench_net_procs_bench
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mpsB/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mpsB/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; nvidia-cuda-mps-control -d; echo "mps rc=$?"
CLEAN=(-u LD_PRELOAD -u NCCL_HOSTID -u NCCL_NET -u MKERNEL_NET)
COMMON=(NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 MKERNEL_TIMEOUT_MS=60000)
ARGS=(--ops allreduce,sendrecv --lat-sizes 8,64,512,4096 --bw-sizes 65536 --lat-iters 2000 --bw-iters 50 --timeout-s 60)
r() { # name np rpn lib env...
  local name=$1 np=$2 rpn=$3 lib=$4; shift 4
  local extra=(); [[ $lib == $NCCL ]] && extra=(--rank-env "NCCL_HOSTID=h%r") && set -- NCCL_NET=Socket NCCL_IB_DISABLE=1 "$@"
  env "${CLEAN[@]}" "${COMMON[@]}" "$@" timeout -k 5 75 $D --lib $lib --nprocs $np --ranks-per-node $rpn --label $name "${ARGS[@]}" "${extra[@]}" --out $L/$name.json > $L/$name.log 2>&1
  echo "== $name rc=$? at $(el)s: $*"; grep -E "^  (allreduce|sendrecv)" $L/$name.log | awk '{print "   ",$1,$2,$4}' | tr '\n' ';'; echo
}
r nccl_4x1 4 1 $NCCL
r mk_2x2_seq 4 2 $LIB MKERNEL_EMULATE_NODES=2 MK_SMALL_SEQ=1
r mk_2x2_split 4 2 $LIB MKERNEL_EMULATE_NODES=2
r mk_2x2_seq_inl2 4 2 $LIB MKERNEL_EMULATE_NODES=2 MK_SMALL_SEQ=1 MKERNEL_PROXY_INLINE_CMD=2
r mk_2x2_split_inl2 4 2 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_INLINE_CMD=2
r nccl_4x1b 4 1 $NCCL
r mk_2x2_split_b 4 2 $LIB MKERNEL_EMULATE_NODES=2
r mk_2x2_split_inl2_b 4 2 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_INLINE_CMD=2
r nccl_2x1 2 1 $NCCL
r mk_2x1_split 2 1 $LIB MKERNEL_EMULATE_NODES=2
r mk_2x1_seq 2 1 $LIB MKERNEL_EMULATE_NODES=2 MK_SMALL_SEQ=1
r mk_2x1_split_inl2 2 1 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_INLINE_CMD=2
echo quit | nvidia-cuda-mps-control
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
F='*HierOps*:*CollProcs*:*Vnodes*:*Devcomm*:*Inline*:FusedXnode*'
timeout 200 $B/tests/mk_gpu_tests --gtest_filter="$F" > $L/gt_net.log 2>&1; echo "gtest net rc=$? at $(el)s"; grep -E "FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \] [0-9]|Failure" $L/gt_net.log | head -12
MKERNEL_PROXY_INLINE_CMD=2 timeout 120 $B/tests/mk_gpu_tests --gtest_filter='*HierOps*:*Inline*:*Vnodes*' > $L/gt_net_inl2.log 2>&1; echo "gtest net inl2 rc=$? at $(el)s"; grep -E "FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \] [0-9]|Failure" $L/gt_net_inl2.log | head -12
tar -czf $OUT/logsB.tgz -C $OUT logsB; echo "done at $(el)s"
