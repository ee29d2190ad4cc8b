#!/usr/bin/env bash
# One GPU-machine session for the GEMM engine: build, tests, sanitizers, SASS/ptxas checks,
# benchmark. Logs and JSON go to $OUT (default /tmp/gemm-out); a summary is printed last.
#
#   scripts/gemm_gpu.sh [all|tests|bench|sass] [extra gtest filter]
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-/tmp/gemm-out}
MODE=${1:-all}
FILTER=${2:-'Gemm*'}
B=${GEMM_BUILD_DIR:-/tmp/gemm-build-gpu}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
commit=$(git rev-parse --verify -q HEAD 2>/dev/null | head -1); commit=${commit:-uncommitted}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader \
  | tee -a "$SUMMARY"
note "env: $(env | grep -E '^CUDA_|^NCCL_' | tr '\n' ' ')"

# Standalone build of the GEMM engine, its tests and benchmark with nvcc only (used when the
# shared CMake build is broken by unrelated half-written files elsewhere in the tree).
standalone_build() {
  local B=$1 J=${2:-16}
  mkdir -p "$B/obj"
  local NVF="-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I$ROOT/src -I$ROOT -I$ROOT/include -I$ROOT/tests -Xcompiler=-fPIC"
  local srcs="$(ls fused/gemm/*.cu fused/core/cost_model.cu fused/core/framework.cc src/device/rt/err_host.cc src/base/debug.cc src/base/cudawrap.cc src/base/param.cc tests/common/test_util.cc)"
  srcs="$srcs $(ls tests/gpu/test_gemm*.cu tests/unit/test_gemm_can_implement.cc bench/gemm_bench.cu)"
  echo "$srcs" | tr ' ' '\n' | grep . | xargs -P "$J" -I{} sh -c \
    "nvcc $NVF -x cu -c {} -o $B/obj/\$(echo {} | tr / _).o || exit 255" || return 1
  local LIB="$B/obj/fused_*.o $B/obj/src_base_*.o $B/obj/src_device_rt_*.o"
  local LNK="-gencode=arch=compute_90a,code=sm_90a"
  nvcc $LNK -o "$B/gemm_gpu_tests" $LIB $B/obj/tests_gpu_*.o $B/obj/tests_common_test_util.cc.o \
    -lgtest_main -lgtest -lcublas -ldl -lpthread || return 1
  nvcc $LNK -o "$B/gemm_unit_tests" $LIB $B/obj/tests_unit_*.o $B/obj/tests_common_test_util.cc.o \
    -lgtest_main -lgtest -ldl -lpthread || return 1
  nvcc $LNK -o "$B/bench_gemm_bench" $LIB $B/obj/bench_gemm_bench.cu.o -lcublasLt -ldl -lpthread || return 1
}

t0=$(date +%s)
{
  timeout 240 cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
    timeout 240 ninja -C "$B" -j16 mk_gpu_tests mk_unit_tests bench_gemm_bench
} >"$OUT/build.log" 2>&1
rc=$?
GPU_TESTS=$B/tests/mk_gpu_tests
UNIT_TESTS=$B/tests/mk_unit_tests
BENCH=$B/bench/bench_gemm_bench
note "cmake build rc=$rc in $(($(date +%s) - t0)) s"
if [ $rc -ne 0 ]; then
  grep -m5 -B2 -A5 "error" "$OUT/build.log" | head -30
  note "cmake build failed (see build.log); standalone nvcc build of the GEMM files instead"
  t0=$(date +%s)
  standalone_build /tmp/gemm-sa 16 >>"$OUT/build.log" 2>&1
  rc=$?
  note "standalone build rc=$rc in $(($(date +%s) - t0)) s"
  [ $rc -ne 0 ] && { tail -40 "$OUT/build.log"; exit 1; }
  GPU_TESTS=/tmp/gemm-sa/gemm_gpu_tests
  UNIT_TESTS=/tmp/gemm-sa/gemm_unit_tests
  BENCH=/tmp/gemm-sa/bench_gemm_bench
fi

if [ "$MODE" = all ] || [ "$MODE" = sass ] || [ "$MODE" = tests ]; then
  # ptxas report (registers, stack, spills) for the engine and the fused example.
  NV="nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
      -I$ROOT/src -I$ROOT -I$ROOT/include -Xptxas -v"
  {
    for f in fused/gemm/gemm_inst_bf16_bf16_{nk,kn}_{plain,grouped}.cu \
      fused/gemm/gemm_inst_f16_f32_nk_plain.cu \
      fused/ops/example/example.cu; do
      echo "== $f"
      $NV -c "$f" -o /tmp/ptxas_check.o 2>&1 | grep -E "Compiling entry|stack frame|Used|warning|C75"
    done
  } >"$OUT/sass-check.txt" 2>&1
  # SASS: per GEMM kernel, HGMMA count and local-memory instructions (must be 0).
  cuobjdump --dump-sass "$BENCH" >/tmp/gemm.sass 2>&1
  awk '/Function : /{fn=$3} fn ~ /gemmKernel|exampleKernel/ {
         if ($0 ~ /HGMMA/) h[fn]++; if ($0 ~ /[^A-Z]LDL|[^A-Z]STL/) l[fn]++;
         if ($0 ~ /USETMAXREG/) r[fn]++; if ($0 ~ /UTMALDG/) t[fn]++; if ($0 ~ /UTMASTG/) s[fn]++ }
       END { for (f in h) printf "%s HGMMA=%d LDL/STL=%d USETMAXREG=%d UTMALDG=%d UTMASTG=%d\n",
             f, h[f], l[f]+0, r[f]+0, t[f]+0, s[f]+0 }' /tmp/gemm.sass >>"$OUT/sass-check.txt"
  grep -m3 -o "HGMMA[.A-Za-z0-9x]*" /tmp/gemm.sass | sort | uniq -c >>"$OUT/sass-check.txt"
  cuobjdump --dump-sass "$GPU_TESTS" 2>/dev/null | awk '/Function : /{fn=$3}
       fn ~ /exampleKernel/ { if ($0 ~ /HGMMA/) h[fn]++; if ($0 ~ /[^A-Z]LDL|[^A-Z]STL/) l[fn]++ }
       END { for (f in h) printf "%s HGMMA=%d LDL/STL=%d\n", f, h[f], l[f]+0 }' \
    >>"$OUT/sass-check.txt"
  note "SASS: kernels=$(grep -c 'HGMMA=' "$OUT/sass-check.txt") with-LDL/STL=$(grep -c 'LDL/STL=[1-9]' "$OUT/sass-check.txt") ptxas-spills=$(grep -c 'bytes spill stores' "$OUT/sass-check.txt" | head -1)/$(grep -c ' 0 bytes spill stores' "$OUT/sass-check.txt")"
fi

if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
  timeout 60 "$UNIT_TESTS" --gtest_filter='GemmCanImplement*:FusedCostModel*:FusedRoles*' \
    >"$OUT/tests.log" 2>&1
  note "unit tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')"
  # Smoke first: a hang or a wrong kernel should not eat the whole session.
  timeout 30 "$GPU_TESTS" --gtest_filter='GemmSmall.*' >>"$OUT/tests.log" 2>&1
  smoke=$?
  note "smoke rc=$smoke"
  if [ $smoke -ne 0 ]; then
    tail -40 "$OUT/tests.log"
    [ "$MODE" = all ] && MODE=sass_only
  fi
fi

if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
  timeout 150 "$GPU_TESTS" --gtest_filter="$FILTER" >>"$OUT/tests.log" 2>&1
  note "gpu tests rc=$? $(grep -E '^\[  (PASSED|FAILED)|^\[  FAILED' "$OUT/tests.log" | tail -8 | tr '\n' ' ')"
  grep -E -A3 "Failure" "$OUT/tests.log" | head -60
fi

if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
  for tool in memcheck racecheck; do
    timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 \
      "$GPU_TESTS" --gtest_filter='GemmSmall.*' >>"$OUT/sanitizer.log" 2>&1
    note "compute-sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1)"
  done
fi

if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  timeout 150 "$BENCH" --reps 40 --commit "$commit" \
    --out "$OUT/gemm-bench.json" >"$OUT/bench.log" 2>&1
  note "bench rc=$?"
  timeout 60 "$BENCH" --reps 20 --layout kn --commit "$commit" \
    --shapes 8192x8192x8192,4096x4096x4096 --out "$OUT/gemm-bench-kn.json" >>"$OUT/bench.log" 2>&1
  note "bench (B[K,N]) rc=$?"
  grep -E "^\||geomean|device" "$OUT/bench.log" >>"$SUMMARY"
fi

echo "======== summary"
cat "$SUMMARY"
