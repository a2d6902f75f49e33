"""Where CUDA is required (CI sets TREEMLA_REQUIRE_CUDA=1; scripts/test-python.sh then builds the
binding with TREEMLA_BUILD_CUDA=1), the installed extension must carry the CUDA kernels: without a
GPU for sm_120 at least, the architecture the project targets."""

import os

import pytest
import torch

import treemla
from treemla import kvpool


@pytest.mark.skipif(
    os.environ.get("TREEMLA_REQUIRE_CUDA") != "1",
    reason="only where CUDA is required (TREEMLA_REQUIRE_CUDA=1, as in CI)",
)
def test_required_cuda_build_carries_the_kernels():
    assert treemla.with_cuda(), "the binding was built without its CUDA code"
    assert kvpool.with_cuda_kvpool(), "the binding was built without the GPU pool kernels"
    archs = treemla.compiled_architectures().split()
    assert torch.cuda.is_available() or "120" in archs, f"sm_120 is not among {archs}"
