#!/usr/bin/env bash
# GPU check: correctness tests against the CPU reference (both tile configurations), CUDA graph
# replay, compute-sanitizer memcheck and racecheck on small cases, the PyTorch binding's GPU
# tests (when torch with CUDA is installed), and the benchmark grid.
# Usage: scripts/gpu-check.sh [build-dir]   (results go to $OUT, default ./gpu-check-out)
# The build dir may be prebuilt elsewhere (same x86-64 Linux); otherwise it is configured here.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
status=0

if [ ! -x "$BUILD/tests/treemla_gpu_tests" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real || exit 1
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
  # BadPageIndexIsReportedDecode: requests of 16 rows, so the decode family runs too.
  small='VerifyGpu.SmallPrefixLengths:VerifyGpu.MergeStateMatchesCpu:VerifyGpu.RaggedBatch:VerifyGpu.BadPageIndexIsReportedDecode'
  run compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/treemla_gpu_tests" --gtest_filter="$small"
  run compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/treemla_gpu_tests" \
    --gtest_filter='VerifyGpu.SmallPrefixLengths:VerifyGpu.BadPageIndexIsReportedDecode'
fi
if [ -z "${SKIP_PYTHON:-}" ] && python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  # The binding with its CUDA kernels against the installed torch, then its GPU tests.
  run env TREEMLA_BUILD_CUDA=1 MAX_JOBS="$(nproc)" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0a}" \
    python3 -m pip install -q --no-build-isolation --no-deps ./python
  run python3 -m pytest -q python/tests
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  run "$BUILD/treemla" bench --json "$OUT/bench.json" --commit "${TREEMLA_COMMIT:-unknown}" ${BENCH_ARGS:-}
  run "$BUILD/treemla" bench-pool --json "$OUT/bench-pool.json" --commit "${TREEMLA_COMMIT:-unknown}"
  # The serving loop at GLM-5 shape, with and without defragmentation during the run.
  for thr in 2 0; do
    run "$BUILD/treemla" simulate --device cuda --heads 8 --budget 64 --depth 15 --page-size 1 \
      --prompt-min 32768 --prompt-max 131072 --max-requests 4 --rounds 30 --defrag-threshold $thr \
      --json "$OUT/simulate-cuda-threshold$thr.json"
  done
fi
echo "== gpu-check status $status" | tee -a "$OUT/gpu-check.log"
exit $status
