#!/usr/bin/env bash
# The test command: install what is missing, build everything (CUDA kernels for every supported
# architecture when nvcc is present), run the C++ tests with CTest (the GPU test binary exits
# with 77 without a GPU, which CTest counts as skipped), check that the installed package works
# for a downstream project, then the Python binding's tests when python/ exists
# (scripts/test-python.sh: in a virtual environment under the build dir, with the binding's CUDA
# code compiled when nvcc is present).
# Environment: BUILD_DIR (default build), JOBS (default nproc), TREEMLA_REQUIRE_CUDA=1 to fail
# when nvcc is missing or fails CMake's CUDA check (instead of building CPU-only),
# TREEMLA_SKIP_PYTHON=1 to skip the binding.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

./scripts/install-deps.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTREEMLA_REQUIRE_CUDA="${TREEMLA_REQUIRE_CUDA:-0}"
cmake --build "$BUILD_DIR" --parallel "$JOBS"
ctest --test-dir "$BUILD_DIR" --output-on-failure --parallel "$JOBS"

# The installed package works for a downstream project (find_package(treemla)).
cmake --install "$BUILD_DIR" --prefix "$PWD/$BUILD_DIR/_install" >/dev/null
extra=()
[ -d /usr/local/cuda ] && extra+=(-DCUDAToolkit_ROOT=/usr/local/cuda)
cmake -S tests/downstream -B "$BUILD_DIR/_downstream" -G Ninja -DCMAKE_PREFIX_PATH="$PWD/$BUILD_DIR/_install" "${extra[@]}" >/dev/null
cmake --build "$BUILD_DIR/_downstream" >/dev/null
"$BUILD_DIR/_downstream/downstream"

if [ -f python/setup.py ] && [ "${TREEMLA_SKIP_PYTHON:-0}" != 1 ]; then
  BUILD_DIR="$BUILD_DIR" MAX_JOBS="${MAX_JOBS:-$JOBS}" ./scripts/test-python.sh
fi
