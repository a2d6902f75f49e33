#!/usr/bin/env bash
# Installs what treemla's build and tests need on a Debian/Ubuntu machine, skipping what is
# already there: a C++20 compiler, CMake >= 3.24, Ninja, GoogleTest, Python 3 with venv (the test
# command builds the PyTorch binding in a virtual environment; pip comes with it), and the tool's
# libraries: CLI11 (options), nlohmann/json (JSON output), fmt (formatting); clang-format for
# the formatting check.
# The CUDA toolkit (nvcc, CUDA 12.8+ for sm_120) is not installed here: it is found at
# /usr/local/cuda or on PATH; without it the build is CPU-only, unless TREEMLA_REQUIRE_CUDA=1,
# which makes a missing nvcc an error (CI sets it: every kernel must compile).
set -euo pipefail

need=()
command -v g++ >/dev/null || need+=(g++)
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
if ! command -v python3 >/dev/null; then
  need+=(python3 python3-venv)
elif ! python3 -c "import ensurepip, venv" 2>/dev/null; then
  need+=(python3-venv)  # Debian's python3 keeps venv's pip bootstrap in this package
fi
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
[ -f /usr/include/CLI/CLI.hpp ] || need+=(libcli11-dev)
[ -f /usr/include/nlohmann/json.hpp ] || need+=(nlohmann-json3-dev)
[ -f /usr/include/fmt/format.h ] || need+=(libfmt-dev)
command -v clang-format >/dev/null || need+=(clang-format)  # scripts/check-format.sh (CI)
if [ ${#need[@]} -gt 0 ]; then
  echo "install-deps: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi

if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  echo "install-deps: CUDA compiler $($nvcc_bin --version | tail -1)"
elif [ "${TREEMLA_REQUIRE_CUDA:-0}" = 1 ]; then
  echo "install-deps: TREEMLA_REQUIRE_CUDA=1 but no nvcc on PATH or at /usr/local/cuda/bin" >&2
  exit 1
else
  echo "install-deps: no CUDA compiler found; the build will be CPU-only"
fi
