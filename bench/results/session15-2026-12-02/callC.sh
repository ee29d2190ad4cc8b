#!/usr/bin/env bash
# Session 15 call C (main with the small AllReduce kernel to 4 KiB): where the two missed
# rows of net_vs_nccl go. helper-2x2's experiments (ack hold 0/20/200, spin, 2x1 baselines,
# 4 processes on one node, 4 nodes x 1) at 8/64 B, and 2x1 sendrecv 4-64 KiB with proxy stats
# under ack hold 0/20 and proxy spin.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsC; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsC.tgz -C $OUT logsC; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 --target mkernel bench_net_procs_bench > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-x2 CUDA_MPS_LOG_DIRECTORY=/tmp/mps-x2-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d 2>/dev/null
CLEAN=(-u LD_PRELOAD -u NCCL_HOSTID -u MKERNEL_NET -u NCCL_NET_PLUGIN -u MKERNEL_PROXY_ACK_HOLD_US
  -u MKERNEL_PROXY_SPIN_US -u MKERNEL_EMULATE_NODES)
run() {
  local n=$1 np=$2 rpn=$3 ops=$4 sizes=$5 envs=$6
  shift 6
  env "${CLEAN[@]}" NCCL_SOCKET_IFNAME=lo MKERNEL_TIMEOUT_MS=60000 MKERNEL_PROXY_STATS=1 $envs \
    timeout 60 "$B/bench/bench_net_procs_bench" --lib "$B/src/libmkernel.so" --nprocs "$np" \
    --ranks-per-node "$rpn" --ops "$ops" --lat-sizes "$sizes" --bw-sizes '' --lat-iters 500 \
    --timeout-s 50 "$@" >"$L/$n.log" 2>&1
  echo "== $n ($envs $*) rc=$? at $(el)s"
  grep -E "^  (allreduce|sendrecv) " "$L/$n.log"
  grep -E "commands in" "$L/$n.log" | sed 's/; [0-9]* loops.*//' | head -4
}
run sr20 2 1 sendrecv 4096,32768,32768,65536 "MKERNEL_EMULATE_NODES=2"
run sr0 2 1 sendrecv 4096,32768,32768,65536 "MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_ACK_HOLD_US=0"
run srspin 2 1 sendrecv 32768,32768 "MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_SPIN_US=2000"
run srnoinl 2 1 sendrecv 32768,32768 "MKERNEL_EMULATE_NODES=2 MKERNEL_SOCKET_INLINE=0"
tarup
run h20 4 2 allreduce,sendrecv 8,64,64,512 "MKERNEL_EMULATE_NODES=2"
run h0 4 2 allreduce,sendrecv 8,64,64,512 "MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_ACK_HOLD_US=0"
run h200 4 2 allreduce 8,64,64 "MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_ACK_HOLD_US=200"
run spin 4 2 allreduce 8,64,64 "MKERNEL_EMULATE_NODES=2 MKERNEL_PROXY_SPIN_US=2000"
run g2x1 2 1 allreduce 8,64,64 "MKERNEL_EMULATE_NODES=2"
run one4 4 4 allreduce 8,64,64 "MKERNEL_EMULATE_NODES=0"
run one2 2 2 allreduce 8,64,64 "MKERNEL_EMULATE_NODES=0"
run n4x1 4 1 allreduce 8,64,64 "MKERNEL_EMULATE_NODES=4"
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
