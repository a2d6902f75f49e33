"""The Python example of README.md and of python/README.md, extracted from the Markdown and run as
printed: on the CPU (the reference implementation) everywhere, and on the GPU where there is one.
The result is checked against the pure-torch reference, so an example that runs but computes
something else fails too."""

import pathlib
import re

import pytest
import torch

import treemla
from reference import reference_verify

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ["README.md", "python/README.md"]


def example(doc: str) -> str:
    """The one ```python block of `doc` that calls treemla.verify_attention."""
    text = (ROOT / doc).read_text()
    blocks = [
        b
        for b in re.findall(r"```python\n(.*?)```", text, re.S)
        if "treemla.verify_attention(" in b
    ]
    assert len(blocks) == 1, (
        f"{doc}: expected one Python example calling verify_attention, got {len(blocks)}"
    )
    return blocks[0]


def test_both_readmes_show_the_same_example():
    assert example("README.md") == example("python/README.md")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_example_runs_as_printed(device, monkeypatch):
    if device == "cuda":
        if not (torch.cuda.is_available() and treemla.with_cuda()):
            pytest.skip("needs a GPU and a CUDA build of the extension")
    else:  # the example picks its device with torch.cuda.is_available()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    torch.manual_seed(0)
    scope = {}
    exec(compile(example("README.md"), "README.md example", "exec"), scope)
    o, lse = scope["o"], scope["lse"]
    assert o.device.type == device and o.dtype == torch.bfloat16
    assert o.shape == (6, 16, 512) and lse.shape == (6, 16) and lse.dtype == torch.float32
    args = [scope[k] for k in ("q", "kv", "page_table", "lens", "q_indptr", "tree_mask")]
    o_ref, lse_ref = reference_verify(*args, 192**-0.5)
    torch.testing.assert_close(o.double(), o_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse.double(), lse_ref, rtol=1e-4, atol=1e-3)
