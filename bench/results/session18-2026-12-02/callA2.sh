#!/usr/bin/env bash
# Session 18 call A2 (diagnostic, branch s18-trace): per-phase %globaltimer trace of the small
# hierarchical AllReduce kernel, 64 B, layouts 2x2 / 2x1 / 1x2 / 1x4, plus the real NCCL as 4 hosts.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsA2; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 --target mkernel bench_net_procs_bench > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
LIB=$(ls $B/src/libmkernel.so | head -1)
D=$B/bench/bench_net_procs_bench
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mpsA/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mpsA/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; nvidia-cuda-mps-control -d; echo "mps rc=$?"
CLEAN=(-u LD_PRELOAD -u NCCL_HOSTID -u NCCL_NET -u MKERNEL_NET)
COMMON=(NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 MKERNEL_TIMEOUT_MS=60000)
ARGS=(--ops allreduce --lat-sizes 64 --bw-sizes 65536 --lat-iters 3000 --bw-iters 20 --timeout-s 60)
r() { # name np rpn lib env...
  local name=$1 np=$2 rpn=$3 lib=$4; shift 4
  local extra=(); [[ $lib == $NCCL ]] && extra=(--rank-env "NCCL_HOSTID=h%r") && set -- NCCL_NET=Socket NCCL_IB_DISABLE=1 "$@"
  mkdir -p $L/tr_$name
  env "${CLEAN[@]}" "${COMMON[@]}" MK_HIER_TRACE_DIR=$L/tr_$name "$@" timeout -k 5 75 $D --lib $lib --nprocs $np --ranks-per-node $rpn --label $name "${ARGS[@]}" "${extra[@]}" --out $L/$name.json > $L/$name.log 2>&1
  echo "== $name rc=$? at $(el)s: $*"; grep -E "^  (allreduce|sendrecv)" $L/$name.log | awk '{print "   ",$1,$2,$4}' | tr '\n' ';'; echo
}
r mk_2x2 4 2 $LIB MKERNEL_EMULATE_NODES=2
r mk_2x1 2 1 $LIB MKERNEL_EMULATE_NODES=2
r mk_2x2_stats 4 2 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_STATS=1
grep -A12 "proxy rank 0" $L/mk_2x2_stats.log | head -14
r nccl_4x1 4 1 $NCCL
echo quit | nvidia-cuda-mps-control
tar -czf $OUT/logsA2.tgz -C $OUT logsA2; echo "done at $(el)s"
