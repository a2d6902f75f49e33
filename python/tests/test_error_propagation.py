"""Errors raised inside the extension reach Python as exceptions, checked in fresh processes so
that a crash in C++ exception handling (a mismatched C++ runtime, an unwinder problem) shows
up as one failing test with its signal rather than ending the whole test run."""
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

RAISE = textwrap.dedent("""
    import torch, treemla
    {prelude}
    try:
        treemla.tree_mask_from_parents([0, 0])        # library error -> RuntimeError
    except RuntimeError as e:
        assert "parents[0] = 0 must be -1" in str(e), e
    q = torch.zeros(3, 8, 512, dtype=torch.bfloat16{device})
    i32 = dict(dtype=torch.int32{device})
    try:
        treemla.verify_attention(q, q, torch.zeros(1, 1, **i32), torch.zeros(1, **i32),
                                 torch.zeros(2, **i32), torch.zeros(3, 1, dtype=torch.int64{device}), 0.1)
    except ValueError as e:                           # binding check -> ValueError
        assert "q must have shape [total_q, H, 576], got [3, 8, 512]" in str(e), e
    print("ok")
""")


def run_snippet(prelude="", device=""):
    code = RAISE.format(prelude=prelude, device=device)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), (
        f"exit code {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-3000:]}")


def test_errors_in_fresh_process():
    run_snippet()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_errors_after_cuda_compile():
    # torch.compile on CUDA loads Triton and its generated code into the process first.
    prelude = ("f = torch.compile(lambda x: x.sin() + 1)\n"
               "f(torch.ones(4, device='cuda'))")
    run_snippet(prelude, device=", device='cuda'")


# Symbols that only a copy of libstdc++ linked into the extension would define: iostream
# instantiations that libstdc++.so exports itself, and locale facets.
RUNTIME_COPY = re.compile(r"^_ZNSo9_M_insert|^_ZNKSt7codecvt|^_ZNSt6locale|^_ZNSt8ios_base4Init")


def test_extension_carries_no_copy_of_libstdcxx():
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    import treemla._C as ext
    res = subprocess.run([nm, "-D", "--defined-only", ext.__file__], capture_output=True,
                         text=True, check=True)
    names = [line.split()[-1] for line in res.stdout.splitlines() if line.strip()]
    copied = sorted(n for n in names if RUNTIME_COPY.match(n))
    assert not copied, (
        f"{ext.__file__} defines {len(copied)} libstdc++ symbols (e.g. {copied[:3]}): a static "
        "libstdc++ was linked in; see RUNTIME_LIBS in python/setup.py")
