#!/usr/bin/env bash
# GPU check: correctness tests against the CPU reference (both tile configurations), CUDA graph
# replay, compute-sanitizer memcheck and racecheck on small cases, and the benchmark grid.
# Usage: scripts/gpu-check.sh [build-dir]   (results go to $OUT, default ./gpu-check-out)
# The build dir may be prebuilt elsewhere (same x86-64 Linux); otherwise it is configured here.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
status=0

if [ ! -x "$BUILD/tests/treemla_gpu_tests" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real || exit 1
  cmake --build "$BUILD" -j "$(nproc)" || exit 1
fi

{
  echo "# treemla GPU check  $(date -u +%Y-%m-%dT%H:%MZ)  commit ${TREEMLA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  "$BUILD/treemla" info
} 2>&1 | tee "$OUT/gpu-check.log"

run() {  # run a step, log it, remember failures
  echo "== $*" | tee -a "$OUT/gpu-check.log"
  "$@" 2>&1 | tee -a "$OUT/gpu-check.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "== FAILED ($rc): $*" | tee -a "$OUT/gpu-check.log"; status=1; }
}

run "$BUILD/tests/treemla_gpu_tests" ${GTEST_ARGS:-}
if [ -z "${SKIP_SANITIZER:-}" ]; then
  small='VerifyGpu.SmallPrefixLengths:VerifyGpu.MergeStateMatchesCpu:VerifyGpu.RaggedBatch'
  run compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/treemla_gpu_tests" --gtest_filter="$small"
  run compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/treemla_gpu_tests" --gtest_filter='VerifyGpu.SmallPrefixLengths'
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  run "$BUILD/treemla" bench --json "$OUT/bench.json" --commit "${TREEMLA_COMMIT:-unknown}" ${BENCH_ARGS:-}
fi
echo "== gpu-check status $status" | tee -a "$OUT/gpu-check.log"
exit $status
