#!/usr/bin/env bash
# The one GPU-machine script: builds everything, runs the GPU test suites and the
# benchmarks, copies logs/results to $OUT (when set) and prints a short summary last.
# Usage: scripts/gpu_check.sh [stage ...]   stages: build unit gpu gpuA gpuB hier procs gemm fused threads attn moe bench collbench fusedbench
#        netbench torch nccltests demo window nccltestsreg collbenchreg (default: build gpu bench demo torch nccltests).
#        GTEST_FILTER narrows the gpu stage.
#        MK_BUILD=<dir> uses binaries built elsewhere (scripts/pack_gpubin.sh) with the build
#        stage left out. Every stage is killed after MK_STAGE_TIMEOUT_<stage> seconds
#        (default MK_STAGE_TIMEOUT, 590), so one hang cannot eat a device call.
# nccltests needs the nccl-tests source in .nccl-tests (git-ignored; carry it: see
# nccl-tests-patches/README.md).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${MK_BUILD:-$root/build-gpu}" 2>/dev/null && pwd || echo "${MK_BUILD:-$root/build-gpu}")"
[ -d "$build/src" ] && export LD_LIBRARY_PATH="$build/src:${LD_LIBRARY_PATH:-}"
[ -f "$build/COMMIT" ] && export MK_BENCH_COMMIT="$(cat "$build/COMMIT")"
out="$build/gpu_check_out"  # logs and JSON; packed into $OUT (8 files at most) at the end
mkdir -p "$out"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build gpu demo bench torch nccltests)
export PATH="/usr/local/cuda/bin:$PATH"
summary=()
note() { summary+=("$(printf '%-10s %s' "$1" "$2")"); }

run_stage() {
  local name="$1"; shift
  local log="$out/$name.log"
  local t0=$(date +%s)
  local tv="MK_STAGE_TIMEOUT_$name"
  timeout -k 10 "${!tv:-${MK_STAGE_TIMEOUT:-590}}" "$@" >"$log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local tail_line
  tail_line=$(grep -E "tests passed|PASSED|FAILED|tests failed|wrong|Summary|SUMMARY" "$log" | tail -n 2 | tr '\n' ' ')
  note "$name" "rc=$rc ${dt}s ${tail_line}"
  return $rc
}

for s in "${stages[@]}"; do
  case "$s" in
    build)
      run_stage build bash -c "cmake -S '$root' -B '$build' -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build '$build' -j\$(nproc)" \
        || { tail -n 60 "$out/build.log"; break; } ;;
    unit)
      run_stage unit bash -c "cd '$build' && ctest -L 'unit|mp' -j8 --timeout 600 --output-on-failure" ;;
    gpu)
      # Not under MPS: there a process's streams get fewer hardware queues, and the suites'
      # comms of several ranks in one process can wait for each other until the timeout
      # (session 32; README "Logging and errors"). The procs stage starts MPS for itself.
      if echo get_server_list | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1; then
        note gpu-mps "CUDA MPS is running: several-ranks-per-process tests may time out"
      fi
      run_stage gpu "$build/tests/mk_gpu_tests" --gtest_filter="${GTEST_FILTER:-*}" ;;
    gpuA|gpuB)
      # The gpu stage in two parts for device calls with a time limit
      # (by session 27's test times, about 190 s each): A the collectives, hierarchy, peer memory,
      # comm, net and device-comm suites, B everything else (the fused operators, GEMM, MoE,
      # ring attention). Together they are the gpu stage, once each test.
      # B runs in two steps: the GemmColl suites match a pattern of A's, and one gtest filter
      # cannot say "none of A's patterns, or GemmColl".
      part='*Coll*:*Hier*:*PeerMem*:*Comm*:*Net*:*Dev*'
      if [ "$s" = gpuA ]; then
        run_stage gpuA "$build/tests/mk_gpu_tests" --gtest_filter="$part-*GemmColl*"
      else
        run_stage gpuB1 "$build/tests/mk_gpu_tests" --gtest_filter="-$part"
        run_stage gpuB2 "$build/tests/mk_gpu_tests" --gtest_filter='*GemmColl*'
      fi ;;
    hier)
      # Inter-node paths through virtual nodes (MKERNEL_EMULATE_NODES is set by the tests).
      run_stage hier "$build/tests/mk_gpu_tests" --gtest_filter="*DevComm*:*Hier*" ;;
    procs)
      # Ranks as separate processes (CollProcs) under CUDA MPS, started here when none runs.
      run_stage procs bash -c '
        export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mps-pipe}
        export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mps-log}
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        started=0
        if ! echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then
          nvidia-cuda-mps-control -d && started=1
        fi
        "$0" --gtest_filter="*CollProcs*"; rc=$?
        [ $started = 1 ] && echo quit | nvidia-cuda-mps-control
        exit $rc' "$build/tests/mk_gpu_tests" ;;
    gemm)
      run_stage gemm "$build/tests/mk_gpu_tests" --gtest_filter="*Gemm*" ;;
    fused)
      # The fused GEMM + collective calls and the operators' framework.
      run_stage fused "$build/tests/mk_gpu_tests" --gtest_filter="*Fused*:*Gemm*:*CollThreads*" ;;
    threads)
      run_stage threads "$build/tests/mk_gpu_tests" --gtest_filter="*CollThread*" ;;
    attn)
      # Ring attention: the plain schedule first (isolates faults of the overlapped one), then
      # every RingAttn test (the single-rank ones run both schedules themselves), then the
      # single-GPU benchmark against torch's SDPA backends.
      MKERNEL_ATTN_SCHEDULE=0 run_stage attn_plain "$build/tests/mk_gpu_tests" \
        --gtest_filter="*RingAttnSingle.*:*RingAttnThreads.*"
      run_stage attn "$build/tests/mk_gpu_tests" --gtest_filter="*RingAttn*"
      run_stage attn_bench python3 "$root/bench/attn_bench.py" single --lib "$build/src/libmkernel.so" \
        --out "$out" ;;
    moe)
      # MoE on every layout: threads (clique kernels), processes and virtual nodes (AllToAll path).
      run_stage moe "$build/tests/mk_gpu_tests" --gtest_filter="Moe*:*Moe*" ;;
    fusedbench)
      run_stage fused_bench "$build/bench/bench_fused_bench" --out "$out/fused_$(date +%F).json" ;;
    bench)
      # Each benchmark writes its JSON (command, commit, device, date) under $out.
      [ -x "$build/bench/bench_gemm_bench" ] && run_stage gemm_bench "$build/bench/bench_gemm_bench" --reps 20 --out "$out/gemm_$(date +%F).json"
      [ -x "$build/bench/bench_coll_bench" ] && run_stage coll_bench "$build/bench/bench_coll_bench" --out "$out/coll_$(date +%F).json"
      [ -x "$build/bench/bench_net_bench" ] && run_stage net_bench "$build/bench/bench_net_bench" --out "$out/net_$(date +%F).json"
      ;;
    collbench)
      run_stage coll_bench "$build/bench/bench_coll_bench" --out "$out/coll_$(date +%F).json" ;;
    netbench)
      run_stage net_bench "$build/bench/bench_net_bench" --out "$out/net_$(date +%F).json" \
        ${MK_BENCH_COMMIT:+--commit "$MK_BENCH_COMMIT"} ;;
    torch)
      MK_TORCH_LOGDIR="$out/torch-logs" run_stage torch "$root/scripts/run_torch_tests.sh" "$build" ;;
    nccltests)
      MK_NT_LOGDIR="$out/nccl-tests-logs" run_stage nccltests bash -c "'$root/scripts/prepare_nccl_tests.sh' '$build' && '$root/scripts/run_nccl_tests.sh' '$build'" ;;
    demo)
      run_stage demo "$build/examples/mkernel_demo" 4 ;;
    window)
      # Windows and zero-copy collectives, 4 ranks of one process (the procs stage runs
      # CollProcs.WindowsFourProcs under MPS).
      run_stage window "$build/tests/mk_gpu_tests" --gtest_filter="CollWindow.*" ;;
    nccltestsreg)
      # nccl-tests -R 1 then -R 2, half the stage's time each.
      MK_NT_BUDGET=${MK_NT_BUDGET:-280} MK_NT_LOGDIR="$out/nccl-tests-reg-logs" run_stage nccltestsreg bash -c "'$root/scripts/prepare_nccl_tests.sh' '$build' && '$root/scripts/run_nccl_tests_reg.sh' '$build'" ;;
    collbenchreg)
      run_stage coll_bench_reg2 "$build/bench/bench_coll_bench" --reg 2 --skip single --out "$out/coll_reg2_$(date +%F).json" ;;
    *) echo "unknown stage $s" ;;
  esac
done

echo
echo "===== per-stage failures ====="
grep -hE "^\[  FAILED  \]|FAIL:" "$out"/*.log 2>/dev/null | sort | uniq | head -40
echo "===== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null)) ====="
printf '%s\n' "${summary[@]}"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  printf '%s\n' "${summary[@]}" >"$OUT/summary.txt"
  tar -czf "$OUT/gpu_check_logs.tgz" -C "$out" .
fi
