#!/usr/bin/env bash
# The one GPU-machine script: builds everything, runs the GPU test suites and the
# benchmarks, copies logs/results to $OUT (when set) and prints a short summary last.
# Usage: scripts/gpu_check.sh [stage ...]   stages: build unit gpu gemm bench torch nccltests demo
#        (default: build unit gpu bench demo). GTEST_FILTER narrows the gpu stage.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${MK_BUILD:-$root/build-gpu}"
out="${OUT:-$root/build-gpu/out}"
mkdir -p "$out"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build unit gpu bench demo)
export PATH="/usr/local/cuda/bin:$PATH"
summary=()
note() { summary+=("$(printf '%-10s %s' "$1" "$2")"); }

run_stage() {
  local name="$1"; shift
  local log="$out/$name.log"
  local t0=$(date +%s)
  "$@" >"$log" 2>&1
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
      run_stage gpu "$build/tests/mk_gpu_tests" --gtest_filter="${GTEST_FILTER:-*}" ;;
    gemm)
      run_stage gemm "$build/tests/mk_gpu_tests" --gtest_filter="*Gemm*" ;;
    bench)
      for b in "$build"/bench/bench_*; do
        [ -x "$b" ] || continue
        run_stage "$(basename "$b")" "$b"
      done
      cp "$root"/bench/results/*.json "$out/" 2>/dev/null ;;
    torch)
      run_stage torch "$root/scripts/run_torch_tests.sh" "$build" ;;
    nccltests)
      run_stage nccltests bash -c "'$root/scripts/prepare_nccl_tests.sh' && '$root/scripts/run_nccl_tests.sh' '$build'" ;;
    demo)
      run_stage demo "$build/examples/mkernel_demo" 4 ;;
    *) echo "unknown stage $s" ;;
  esac
done

echo
echo "===== per-stage failures ====="
grep -hE "^\[  FAILED  \]|FAIL:" "$out"/*.log 2>/dev/null | sort | uniq | head -40
echo "===== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null)) ====="
printf '%s\n' "${summary[@]}"
