#!/usr/bin/env bash
# Issue 10 frozen-commit proof, part 2: the PyTorch suite, then nccl-tests in CUDA graphs.
set -u
R=$(pwd); L=$OUT/logs2; mkdir -p $L; t0=$(date +%s)
el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build build -j16 --target mkernel > $L/build.log 2>&1; echo "build rc=$? at $(el)s"
MK_TORCH_BUDGET=200 bash scripts/run_torch_tests.sh build > $L/torch.log 2>&1; echo "torch rc=$? at $(el)s"
tail -18 $L/torch.log
tar -czf $OUT/logs2.tgz -C $OUT logs2
timeout 60 bash scripts/prepare_nccl_tests.sh build .nccl-tests > $L/nt-prepare.log 2>&1; echo "prepare rc=$? at $(el)s"
MK_NT_MODES=0 MK_NT_BUDGET=100 MK_NT_MAXBYTES=4M MK_NT_ITERS="-n 2 -w 1" MK_NT_GEMM_SIZES="-b 1M -e 16M -f 4" \
  bash scripts/run_nccl_tests.sh build sendrecv_perf gather_perf scatter_perf gemm_allreduce_perf allgather_gemm_perf gemm_reducescatter_perf > $L/nt-eager2.log 2>&1; echo "nccl-tests eager rest rc=$? at $(el)s"
tail -10 $L/nt-eager2.log
left=$(( 565 - $(el) ))
MK_NT_MODES=1 MK_NT_BUDGET=$left MK_NT_MAXBYTES=4M MK_NT_ITERS="-n 2 -w 1" MK_NT_GEMM_SIZES="-b 1M -e 16M -f 4" \
  bash scripts/run_nccl_tests.sh build > $L/nt-graph.log 2>&1; echo "nccl-tests graph rc=$? at $(el)s"
tail -16 $L/nt-graph.log
tar -czf $OUT/logs2.tgz -C $OUT logs2
