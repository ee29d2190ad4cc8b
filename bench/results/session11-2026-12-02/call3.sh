#!/usr/bin/env bash
# Session 11 call 3: the torch tests not reached in call 2, the fused nccl-tests in graphs with
# the harness fix, then MoE ffn (sized AlltoAll) and inter-node quick benchmarks.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs3; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs3.tgz -C $OUT logs3; }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build build -j16 --target mkernel bench_net_procs_bench > $L/build.log 2>&1; echo "build rc=$? at $(el)s"
MK_TORCH_BUDGET=110 bash scripts/run_torch_tests.sh build ring_attention_vnodes fused_moe > $L/torch.log 2>&1; echo "torch rc=$? at $(el)s"
tail -5 $L/torch.log; tarup
timeout 70 bash scripts/prepare_nccl_tests.sh build .nccl-tests > $L/nt-prepare.log 2>&1; echo "prepare rc=$? at $(el)s"; tail -1 $L/nt-prepare.log
MK_NT_MODES="1 0" MK_NT_BUDGET=40 MK_NT_MAXBYTES=4M MK_NT_ITERS="-n 2 -w 1" MK_NT_GEMM_SIZES="-b 1M -e 16M -f 4" \
  bash scripts/run_nccl_tests.sh build gemm_allreduce_perf allgather_gemm_perf gemm_reducescatter_perf > $L/nt-gemm.log 2>&1; echo "nccl-tests gemm rc=$? at $(el)s"
tail -9 $L/nt-gemm.log; tarup
timeout 130 python3 bench/moe_bench.py ffn --lib build/src/libmkernel.so --out $L/moe_ffn --mps --nproc 4 --budget 100 > $L/moe_ffn.log 2>&1; echo "moe ffn rc=$? at $(el)s"
grep -E "^\| |rror" $L/moe_ffn.log | head -24; tail -2 $L/moe_ffn.log
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
left=$(( 525 - $(el) )); echo "nvn budget ${left}s"
[ $left -gt 60 ] && MK_NVN_BUDGET=$(( left - 25 )) timeout $left bash bench/net_vs_nccl.sh build $L/nvn --quick --no-bound > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| (allreduce|sendrecv)|^## " $L/nvn/net_vs_nccl.md 2>/dev/null | head -30; tail -3 $L/nvn.log; tarup
