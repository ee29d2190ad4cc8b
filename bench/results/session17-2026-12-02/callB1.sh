#!/usr/bin/env bash
# Session 17 call B1 (candidate s17-cand: flat small AllReduce, netfix, D=64 variants, xnode
# fused AllGather+GEMM): build; the new and touched GPU suites; flat vs rail small AllReduce.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsB1; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsB1.tgz -C $OUT logsB1; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
G="$B/tests/mk_gpu_tests"
sum() { grep -E "FAILED  \]|^\[  PASSED  \] [0-9]+|Failure|inline group cut short" $1 | head -${2:-12}; }
timeout 170 $G --gtest_filter='*HierFlat*:*HierOps*:*HierInline64*:CommInitAgreed*:*HierKill*:*Vnodes*:*DevComm*:*Devcomm*:*CollProcs*' > $L/gt_net.log 2>&1; echo "gtest net rc=$? at $(el)s"; sum $L/gt_net.log; tarup
timeout 120 $G --gtest_filter='FusedXnode*' > $L/gt_xnode.log 2>&1; echo "gtest xnode rc=$? at $(el)s"; sum $L/gt_xnode.log 20; tarup
timeout 120 $G --gtest_filter='RingAttnD64Variant*:RingAttnSingle*' > $L/gt_attn.log 2>&1; echo "gtest attn rc=$? at $(el)s"; sum $L/gt_attn.log; tarup
# flat vs rail, interleaved, against the real NCCL as 4 hosts
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
D=$B/bench/bench_net_procs_bench; LIB=$B/src/libmkernel.so
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mpsB/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mpsB/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; nvidia-cuda-mps-control -d
CLEAN=(-u LD_PRELOAD -u NCCL_HOSTID -u NCCL_NET -u MKERNEL_NET)
COMMON=(NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 MKERNEL_TIMEOUT_MS=60000)
ARGS=(--ops allreduce,sendrecv --lat-sizes 8,64,512,4096,8192 --bw-sizes 65536 --lat-iters 2000 --bw-iters 50 --timeout-s 60)
r() { local name=$1 np=$2 rpn=$3 lib=$4; shift 4
  local extra=(); [[ $lib == $NCCL ]] && extra=(--rank-env "NCCL_HOSTID=h%r") && set -- NCCL_NET=Socket NCCL_IB_DISABLE=1 "$@"
  env "${CLEAN[@]}" "${COMMON[@]}" "$@" timeout -k 5 75 $D --lib $lib --nprocs $np --ranks-per-node $rpn --label $name "${ARGS[@]}" "${extra[@]}" --out $L/$name.json > $L/$name.log 2>&1
  echo "== $name rc=$? at $(el)s: $*"; grep -E "^  (allreduce|sendrecv)" $L/$name.log | awk '{print "   ",$1,$2,$4,"w="$NF}' | tr '\n' ';'; echo; }
for k in 1 2; do
r nccl_4x1_$k 4 1 $NCCL
r mk_2x2_flat_$k 4 2 $LIB MKERNEL_EMULATE_NODES=2
r mk_2x2_rail_$k 4 2 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_HIER_FLAT_MAX=0
r mk_2x2_flat_inl2_$k 4 2 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_INLINE_CMD=2
done
r mk_2x3_flat 6 3 $LIB MKERNEL_EMULATE_NODES=2
r mk_2x3_rail 6 3 $LIB MKERNEL_EMULATE_NODES=2 MKERNEL_HIER_FLAT_MAX=0
r mk_3x2_flat 6 2 $LIB MKERNEL_EMULATE_NODES=3
r mk_3x2_rail 6 2 $LIB MKERNEL_EMULATE_NODES=3 MKERNEL_HIER_FLAT_MAX=0
echo quit | nvidia-cuda-mps-control; tarup
