#!/usr/bin/env bash
# Builds the PyTorch binding and runs its tests (GPU tests skip without a GPU).
# Installs torch when it is missing: PyPI's torch 2.11.0 is the CUDA 13.0 build; on a machine
# with the CUDA 13 toolkit in /usr/local/cuda its CUDA libraries come from there, so only three
# small nvidia wheels are fetched beside it. If that torch does not import, the full dependency
# set is installed instead.
# Environment: PYTHON (default python3), TREEMLA_BUILD_CUDA (default 0 here: the CPU parts, as
# CI needs; set 1 on a GPU machine), TORCH_CUDA_ARCH_LIST, MAX_JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q --no-deps torch==2.11.0 nvidia-cusparselt-cu13==0.8.0 nvidia-cufile==1.15.1.6 \
    nvidia-nvshmem-cu13==3.4.5
  "$PY" -m pip install -q filelock typing-extensions sympy networkx jinja2 fsspec numpy
  if ! "$PY" -c "import torch"; then
    echo "test-python: torch does not import with the system CUDA libraries; installing its dependencies"
    "$PY" -m pip install -q torch==2.11.0
  fi
fi
"$PY" -m pip install -q pytest ninja "setuptools>=70.1,<82"
TREEMLA_BUILD_CUDA=${TREEMLA_BUILD_CUDA:-0} MAX_JOBS=${MAX_JOBS:-2} \
  "$PY" -m pip install -q --no-build-isolation --no-deps ./python
# From the repository root, so the installed package (not the source folder) is imported.
"$PY" -m pytest -q python/tests
