#!/usr/bin/env bash
# Session 17 call A (diagnostic at main d443907): where do 2x2 small-AllReduce microseconds go?
# 2x2 = 46-49 us vs 2x1 = 21 us though the small kernel makes one rail trip in both.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsA; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsA.tgz -C $OUT logsA; }
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
ARGS=(--ops allreduce,sendrecv --lat-sizes 8,64,512 --bw-sizes 65536 --lat-iters 2000 --bw-iters 50 --timeout-s 60)
r() { # name np rpn lib env...
  local name=$1 np=$2 rpn=$3 lib=$4; shift 4
  local extra=(); [[ $lib == $NCCL ]] && extra=(--rank-env "NCCL_HOSTID=h%r") && set -- NCCL_NET=Socket NCCL_IB_DISABLE=1 "$@"
  env "${CLEAN[@]}" "${COMMON[@]}" "$@" timeout -k 5 75 $D --lib $lib --nprocs $np --ranks-per-node $rpn --label $name "${ARGS[@]}" "${extra[@]}" --out $L/$name.json > $L/$name.log 2>&1
  echo "== $name rc=$? at $(el)s: $*"; grep -E "^  (allreduce|sendrecv)" $L/$name.log | awk '{print "   ",$1,$2,$4}' | tr '\n' ';'; echo
}
r nccl_4x1 4 1 $NCCL
r mk_2x2 4 2 $LIB MKERNEL_EMULATE_NODES=2
r mk_2x1 2 1 $LIB MKERNEL_EMULATE_NODES=2
r mk_4x1 4 1 $LIB MKERNEL_EMULATE_NODES=4
r mk_1x4 4 4 $LIB MKERNEL_EMULATE_NODES=1
r mk_1x2 2 2 $LIB MKERNEL_EMULATE_NODES=1
r mk_2x2_nohold 4 2 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_ACK_HOLD_US=0
r mk_2x2_pin0 4 2 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_PIN=0
r mk_2x2_spin 4 2 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_SPIN_US=5000000
r mk_2x2_inl2 4 2 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_INLINE_CMD=2
r nccl_4x1b 4 1 $NCCL
r mk_2x2b 4 2 $LIB MKERNEL_EMULATE_NODES=2
ARGS=(--ops allreduce --lat-sizes 64 --bw-sizes 65536 --lat-iters 3000 --bw-iters 20 --timeout-s 60)
r mk_2x2_stats 4 2 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_STATS=1
grep "proxy rank" $L/mk_2x2_stats.log | head -40
r mk_2x1_stats 2 1 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_STATS=1
grep "proxy rank 0" $L/mk_2x1_stats.log | head -12
echo quit | nvidia-cuda-mps-control; tarup
