#!/usr/bin/env bash
# Builds the PyTorch binding and runs its tests (GPU tests skip without a GPU), in a virtual
# environment under the build tree: nothing is installed into the system's Python. The venv
# ($VENV, default $BUILD_DIR/venv) is made with `python3 -m venv` on first use and reused after.
#
# What goes into it: torch 2.11.0 from PyPI (the CUDA 13.0 build, a 531 MB wheel), pytest,
# ninja, setuptools >= 70.1 and matplotlib (scripts/plot.py and its test). On a machine with the
# CUDA 13 toolkit in /usr/local/cuda, torch's CUDA libraries come from there, so only three
# nvidia wheels (230 MB) are fetched beside it; if that torch does not import, its full
# dependency set is installed instead.
#
# The binding's CUDA code is compiled when nvcc is found and torch has CUDA of the same major
# version: the same torch wheel carries torch's CUDA headers, so no GPU is needed.
# TREEMLA_BUILD_CUDA: auto (default), 1 = fail if it cannot be built (TREEMLA_REQUIRE_CUDA=1, as
# CI sets, implies it), 0 = the CPU parts only. Architectures: TORCH_CUDA_ARCH_LIST if set, else the visible GPUs', else sm_120
# alone: without a GPU the point is that the binding's CUDA code compiles, and the CMake build
# already compiles every kernel for every architecture.
# Environment: BUILD_DIR (default build), VENV, PYTHON (the Python that makes the venv, default
# python3), TREEMLA_BUILD_CUDA, TORCH_CUDA_ARCH_LIST, MAX_JOBS (compile jobs, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
VENV=${VENV:-$BUILD_DIR/venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "test-python: creating the virtual environment $VENV"
  mkdir -p "$(dirname "$VENV")"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
PY=$VENV/bin/python

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "test-python: installing torch 2.11.0 into $VENV"
  "$PY" -m pip install -q --no-deps torch==2.11.0 nvidia-cusparselt-cu13==0.8.0 nvidia-cufile==1.15.1.6 \
    nvidia-nvshmem-cu13==3.4.5
  echo "test-python: (pip may list torch's CUDA wheels as missing requirements: they are not" \
    "needed, the libraries come from /usr/local/cuda; a torch that does not import is fixed below)"
  "$PY" -m pip install -q filelock typing-extensions sympy networkx jinja2 fsspec numpy
  if ! "$PY" -c "import torch"; then
    echo "test-python: torch does not import with the system CUDA libraries; installing its dependencies"
    "$PY" -m pip install -q torch==2.11.0
  fi
fi
# nvidia-cuda-cuobjdump and -nvdisasm (5.5 MB): scripts/sass-stats.py reads the build's kernels
# with them (the toolkit in /usr/local/cuda may lack both), and its tests hold every kernel to
# tests/kernel_resources.json and read the sm_90a warpspec kernel's SASS.
"$PY" -m pip install -q pytest ninja "setuptools>=70.1,<82" "matplotlib>=3.6" \
  nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37

build_cuda=${TREEMLA_BUILD_CUDA:-auto}
[ "${TREEMLA_REQUIRE_CUDA:-0}" = 1 ] && build_cuda=1
if [ "$build_cuda" != 0 ] && [ -z "${TORCH_CUDA_ARCH_LIST:-}" ] &&
   ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  export TORCH_CUDA_ARCH_LIST=12.0
fi
start=$SECONDS
TREEMLA_BUILD_CUDA=$build_cuda MAX_JOBS=${MAX_JOBS:-2} \
  "$PY" -m pip install -q --no-build-isolation --no-deps ./python
echo "test-python: built the binding in $((SECONDS - start)) s ($("$PY" -c \
  "import treemla as t; print('CUDA for ' + ' '.join('sm_' + a for a in t.compiled_architectures().split())
                            if t.with_cuda() else 'CPU parts only')"))"
# From the repository root, so the installed package (not the source folder) is imported.
"$PY" -m pytest -q python/tests
