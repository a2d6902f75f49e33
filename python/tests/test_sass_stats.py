"""scripts/sass-stats.py reads cuobjdump's listings: functions per architecture, backward-branch
loops that hold tensor instructions and their spill loads and stores, register and stack use, the
.text size, and a digest that ignores addresses. Checked on small listings written here in
cuobjdump's format, and on a real build when one and a cuobjdump are at hand. CI's build (every
architecture) is held to the registers and stack recorded in tests/kernel_resources.json."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "sass-stats.py"

SASS = """
Fatbin elf code:
================
arch = sm_90a
code version = [1,7]

        code for sm_90a
                Function : _Z6kernelv
        .headerflags    @"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   MOV R1, c[0x0][0x28] ;              /* 0x00000a0000017a02 */
        /*0010*/                   LDSM.16.M88.4 R4, [R2] ;            /* 0x000000000204783b */
        /*0020*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ; /* 0x000000060408723c */
        /*0030*/                   LDL R12, [R1+0x8] ;                 /* 0x00000800010c7983 */
        /*0040*/                   SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R3+URZ], RZ ; /* 0x0 */
        /*0050*/               @P0 BRA 0x10 ;                          /* 0x0000000000000947 */
        /*0060*/                   STL [R1+0x8], R12 ;                 /* 0x0000080c01007387 */
        /*0070*/              @!P1 BRA 0x60 ;                          /* 0x0000000000000947 */
        /*0080*/                   EXIT ;                              /* 0x000000000000794d */
"""

RES = """
Resource usage:
 Common:
  GLOBAL:0
 Function _Z6kernelv:
  REG:168 STACK:80 SHARED:1024 LOCAL:0 CONSTANT[0]:736 TEXTURE:0 SURFACE:0 SAMPLER:0
"""

ELF = """
Fatbin elf code:
================
arch = sm_90a
  14   3080   1480  0 80                     PROGBITS        6    3        3 .text._Z6kernelv
"""


@pytest.fixture(scope="module")
def sass_stats(load_script):
    return load_script("sass-stats.py")


def test_parses_functions_loops_and_resources(sass_stats):
    funcs = sass_stats.parse_sass(SASS)
    assert list(funcs) == [("sm_90a", "_Z6kernelv")]
    instrs = funcs[("sm_90a", "_Z6kernelv")]
    assert len(instrs) == 9 and instrs[1] == (0x10, "LDSM.16.M88.4 R4, [R2]")
    # The loop 0x10..0x50 holds the HMMA; the one at 0x60..0x70 has none and is not reported.
    (lp,) = sass_stats.loops(instrs)
    assert (lp["first"], lp["last"], lp["instructions"]) == (1, 5, 5)
    assert (lp["HMMA"], lp["LDSM"], lp["LDL"], lp["STL"], lp["SYNCS"]) == (1, 1, 1, 0, 1)
    assert sass_stats.parse_res_usage(RES)[("?", "_Z6kernelv")]["REG"] == 168
    assert sass_stats.parse_res_usage(RES)[("?", "_Z6kernelv")]["STACK"] == 80
    assert sass_stats.parse_text_sizes(ELF) == {("sm_90a", "_Z6kernelv"): 0x1480}


def test_opcode_and_digest(sass_stats):
    assert sass_stats.opcode("@!P0 LDSM.16.M88.4 R4, [R2]") == "LDSM"
    assert sass_stats.opcode("BRA 0x10") == "BRA"
    a = [(0x0, "MOV R1, R2"), (0x10, "EXIT")]
    b = [(0x100, "MOV  R1, R2"), (0x110, "EXIT")]  # other addresses, other spacing
    assert sass_stats.digest(a) == sass_stats.digest(b)
    assert sass_stats.digest(a) != sass_stats.digest([(0x0, "MOV R1, R3"), (0x10, "EXIT")])


def test_short_names(sass_stats):
    name = (
        "void treemla::cuda::warpspec::warpspec_main_kernel<__nv_bfloat16, "
        "treemla::cuda::WarpSpecTraits<__nv_bfloat16, 4> >(treemla::cuda::VerifyKernelParams)"
    )
    assert sass_stats.short(name) == (
        "warpspec::warpspec_main_kernel<__nv_bfloat16, WarpSpecTraits<__nv_bfloat16, 4> >"
    )


def test_refuses_a_missing_file_a_bad_count_and_a_bad_tool():
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "/nonexistent/treemla"], capture_output=True, text=True
    )
    assert r.returncode == 2 and "no such file" in r.stderr
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(SCRIPT), "--loops", "0"], capture_output=True, text=True
    )
    assert r.returncode == 2 and "--loops = 0 must be at least 1" in r.stderr
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(SCRIPT), "--cuobjdump", "/nonexistent/cuobjdump"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1
    assert "--cuobjdump /nonexistent/cuobjdump is not an executable" in r.stderr


def test_a_real_build(sass_stats):
    dirs = (os.environ.get("BUILD_DIR", "build"), "build", "build-90")
    binary = next((ROOT / d / "treemla" for d in dirs if (ROOT / d / "treemla").is_file()), None)
    require = os.environ.get("TREEMLA_REQUIRE_CUDA") == "1"  # CI: the test must run
    if binary is None:
        if require:
            pytest.fail("TREEMLA_REQUIRE_CUDA=1 and no build/treemla")
        pytest.skip("no build/treemla")
    try:
        tool = sass_stats.find_cuobjdump()
        rows = sass_stats.collect(tool, str(binary), "warpspec_main_kernel<__nv_bfloat16",
                                  "sm_90a")
    except SystemExit as e:  # no cuobjdump, or no nvdisasm beside it
        if require:
            pytest.fail(f"TREEMLA_REQUIRE_CUDA=1 and {e}")
        pytest.skip(str(e))
    if not rows:
        pytest.skip(f"{binary} has no sm_90a warpspec kernel")
    (row,) = rows.values()
    assert row["bytes"] and row["reg"] and row["loops"]
    assert any(lp["HMMA"] for lp in row["loops"])


def test_check_resources_names_what_breaks_the_budget(sass_stats):
    budget = {"sm_90a": {"k1": {"reg": 168, "stack": 16}, "k2": {"reg": 40, "stack": 0}},
              "sm_80": {"k1": {"reg": 255, "stack": 32}}}
    same = {"sm_90a": {"k1": {"reg": 168, "stack": 16}, "k2": {"reg": 40, "stack": 0}}}
    assert sass_stats.check_resources(same, budget, all_archs=False) == []
    assert sass_stats.check_resources(same, budget, all_archs=True) == [
        "sm_80: recorded, not in the build"]
    less = {"sm_90a": {"k1": {"reg": 160, "stack": 8}, "k2": {"reg": 40, "stack": 0}}}
    assert sass_stats.check_resources(less, budget, all_archs=False) == []
    more = {"sm_90a": {"k1": {"reg": 168, "stack": 24}, "k3": {"reg": 30, "stack": 0}}}
    assert sass_stats.check_resources(more, budget, all_archs=False) == [
        "sm_90a k1: STACK 24 > 16 recorded",
        "sm_90a k2: recorded, not in the build",
        "sm_90a k3: not recorded (REG 30, STACK 0)",
    ]
    assert sass_stats.check_resources({"sm_120a": {}}, budget, all_archs=False) == [
        "sm_120a: in the build, not recorded"]


def test_kernels_within_the_recorded_registers_and_stack(sass_stats):
    """A kernel at its register limit that spills more runs slower: in warpspec, 8 more bytes of
    stack cost 7-11% at every shape on the H200 (docs/verify-kernel.md, "The item table"). So a
    change to any kernel's registers or stack must show here, and be measured on the GPU before
    the file is regenerated."""
    require = os.environ.get("TREEMLA_REQUIRE_CUDA") == "1"
    binary = ROOT / os.environ.get("BUILD_DIR", "build") / "treemla"
    if not binary.is_file():
        if require:
            pytest.fail(f"TREEMLA_REQUIRE_CUDA=1 and no {binary}")
        pytest.skip(f"no {binary}")
    try:
        tool = sass_stats.find_cuobjdump()
    except SystemExit as e:
        if require:
            pytest.fail(f"TREEMLA_REQUIRE_CUDA=1 and {e}")
        pytest.skip("no cuobjdump")
    budget = json.loads((ROOT / "tests" / "kernel_resources.json").read_text())
    nvcc = sass_stats.build_nvcc(str(binary))
    if nvcc != budget["nvcc"]:
        pytest.skip(f"tests/kernel_resources.json was recorded with nvcc {budget['nvcc']}, "
                    f"{binary} was built with {nvcc}")
    lines = sass_stats.check_resources(sass_stats.resources(tool, str(binary)), budget["kernels"],
                                       all_archs=require)
    assert not lines, "\n".join(lines + [
        "A kernel's registers or stack changed. Measure the change on the GPU (docs/gpu-check.md), "
        "then record the build's figures: scripts/sass-stats.py build/treemla --resources > "
        "tests/kernel_resources.json"])
