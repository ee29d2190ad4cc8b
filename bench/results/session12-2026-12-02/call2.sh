#!/usr/bin/env bash
# Session 12 call 2 (after c1 is green and s11-wip is merged): attention kernel alone (the
# producer change), the sendrecv-vs-AllReduce proxy diagnostic (issue 11.1), where the GEMM's
# small-K time goes (ncu, issue 12), and the first fused_vs_nccl run (issue 12 (b)).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs2; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs2.tgz -C $OUT logs2; }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build build -j16 --target mkernel bench_net_procs_bench bench_gemm_bench bench_fused_procs_bench > $L/build.log 2>&1; echo "build rc=$? at $(el)s"
timeout 75 python3 bench/attn_bench.py single --lib build/src/libmkernel.so --out $L/attn --backends cudnn --budget 55 > $L/attn.log 2>&1; echo "attn rc=$? at $(el)s"
grep -E "^\| [0-9a-z]" $L/attn.log | head -20; tarup
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mk-mps CUDA_MPS_LOG_DIRECTORY=/tmp/mk-mps-log; mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d 2>/dev/null
for ops in sendrecv allreduce; do
  env -u LD_PRELOAD NCCL_SOCKET_IFNAME=lo MKERNEL_EMULATE_NODES=2 MKERNEL_TIMEOUT_MS=60000 MKERNEL_PROXY_STATS=1 \
    timeout 60 build/bench/bench_net_procs_bench --lib build/src/libmkernel.so --nprocs 2 --ranks-per-node 1 \
    --ops $ops --lat-sizes 8 --bw-sizes '' --lat-iters 1000 --out $L/diag_$ops.json > $L/diag_$ops.log 2>&1
  echo "diag $ops rc=$? at $(el)s"; grep -E "proxy rank|us|lat" $L/diag_$ops.log | head -12
done
echo quit | nvidia-cuda-mps-control; tarup
for sk in 0 2; do MKERNEL_GEMM_SKEW=$sk timeout 60 build/bench/bench_gemm_bench --shapes 8192x8192x512,8192x8192x1024,8192x8192x2048,8192x8192x8192 --reps 15 --out $L/gemm_smallk_skew$sk.json > $L/gemm_smallk_skew$sk.log 2>&1; echo "gemm small-K skew $sk rc=$? at $(el)s"; tail -6 $L/gemm_smallk_skew$sk.log; done
timeout 120 ncu --set full -k regex:gemmKernel -c 1 -o $L/gemm1k build/bench/bench_gemm_bench --shapes 8192x8192x1024 --reps 1 > $L/ncu.log 2>&1; echo "ncu rc=$? at $(el)s"
ncu -i $L/gemm1k.ncu-rep --page details --section WarpStateStats --section SpeedOfLight > $L/ncu_details.txt 2>&1
ncu -i $L/gemm1k.ncu-rep --page source --print-source sass --csv > $L/ncu_sass.csv 2>&1; gzip -f $L/ncu_sass.csv; rm -f $L/gemm1k.ncu-rep
grep -E "Stall|Throughput|Warp Cycles" $L/ncu_details.txt | head -20; tarup
timeout 150 python3 bench/grouped_bench.py --build build --out $L/grouped --rounds 2 > $L/grouped.log 2>&1; echo "grouped rc=$? at $(el)s"
grep -E "^\| [0-9]" $L/grouped.log; tarup
left=$(( 470 - $(el) )); echo "fvn budget ${left}s"
[ $left -gt 90 ] && MK_FVN_BUDGET=$(( left - 30 )) timeout $left bash bench/fused_vs_nccl.sh build $L/fvn --quick > $L/fvn.log 2>&1; echo "fvn rc=$? at $(el)s"
grep -E "^\| " $L/fvn/fused_vs_nccl.md 2>/dev/null | head -24; tail -3 $L/fvn.log; tarup
