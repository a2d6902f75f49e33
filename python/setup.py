# Builds the treemla torch extension (treemla._C) against the torch that is already installed.
#
#   pip install 'setuptools>=70.1' ninja
#   pip install --no-build-isolation ./python
#
# --no-build-isolation matters: an isolated build would fetch some other torch from the package
# index, and the extension would then not load into the torch you run with. It also means that
# pyproject.toml's build requirements are not installed or checked, hence the first line (and
# check_build_tools below).
#
# The library's sources are compiled straight into the extension (no CMake): src/common, src/cpu,
# src/tree and src/kvpool always; src/cuda/**/*.cu when torch has CUDA and nvcc is found, by
# default for six architectures. On two cores the C++ parts take 2.5-4.5 minutes and the CUDA
# kernels about 3 more for six architectures, 1 for one (TORCH_CUDA_ARCH_LIST narrows it).
# Environment:
#   TREEMLA_BUILD_CUDA    auto (default) | 1 (fail if CUDA cannot be built) | 0 (CPU only)
#   TORCH_CUDA_ARCH_LIST  e.g. "9.0" or "8.0;9.0a;12.0+PTX"; default: the visible GPUs'
#                         architectures (9.0 as 9.0a), else sm_80, 86, 89, 90a, 100, 120 (+ compute_120 PTX)
#   MAX_JOBS              parallel compile jobs (ninja)
import glob
import os
import re
import subprocess
import sys

import setuptools
from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Paths below are relative to this file; setuptools expects to run from here.
os.chdir(HERE)

INSTALL_HINT = ("  pip install 'setuptools>=70.1' ninja\n"
                "  pip install --no-build-isolation ./python      # from the repository root")


def check_build_tools():
    """pip builds a wheel; --no-build-isolation builds it with the setuptools at hand and does not
    enforce pyproject.toml's setuptools>=70.1. A new venv has setuptools 65 and no `wheel`
    package, where the build would stop at "invalid command 'bdist_wheel'": say what to run."""
    version = tuple(int(x) for x in re.findall(r"\d+", setuptools.__version__)[:2])
    try:
        import wheel  # noqa: F401  (older setuptools build wheels through it)
        has_wheel = True
    except ImportError:
        has_wheel = False
    if version < (70, 1) and not has_wheel:
        sys.exit("treemla: setuptools %s cannot build a wheel without the `wheel` package; "
                 "install the build requirements first:\n%s" % (setuptools.__version__, INSTALL_HINT))


check_build_tools()

try:
    import torch
    from torch.utils import cpp_extension
except ImportError as exc:
    sys.exit("treemla: torch is not importable in this environment (%s). The extension is built "
             "against the torch you run with: install torch first (e.g. pip install torch), then\n%s"
             % (exc, INSTALL_HINT))

DEFAULT_ARCHS = ["8.0", "8.6", "8.9", "9.0a", "10.0", "12.0+PTX"]


def rel(pattern, recursive=False):
    """Sorted source paths matching a pattern under the repository root, relative to here."""
    found = glob.glob(os.path.join(ROOT, pattern), recursive=recursive)
    return sorted(os.path.relpath(p, HERE) for p in found)


def want_cuda():
    mode = os.environ.get("TREEMLA_BUILD_CUDA", "auto").strip().lower()
    if mode in ("0", "off", "no", "false"):
        return False
    nvcc = os.path.join(cpp_extension.CUDA_HOME or "", "bin", "nvcc")
    reasons = []
    if torch.version.cuda is None:
        reasons.append("this torch (%s) has no CUDA" % torch.__version__)
    if cpp_extension.CUDA_HOME is None or not os.path.exists(nvcc):
        reasons.append("nvcc was not found (set CUDA_HOME)")
    elif torch.version.cuda is not None:
        # torch refuses to build with an nvcc of another major version than its own CUDA.
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        found = re.search(r"release (\d+)\.(\d+)", out)
        if found and found.group(1) != torch.version.cuda.split(".")[0]:
            reasons.append("nvcc is CUDA %s.%s, this torch was built with CUDA %s (the major "
                           "versions must match)" % (found.group(1), found.group(2), torch.version.cuda))
    if reasons:
        if mode in ("1", "on", "yes", "true"):
            sys.exit("treemla: TREEMLA_BUILD_CUDA=1 but " + "; ".join(reasons))
        print("treemla: building the CPU parts only: " + "; ".join(reasons))
        return False
    return True


def arch_entries():
    """Architectures as 'X.Y[a|f][+PTX]' strings, from TORCH_CUDA_ARCH_LIST, the GPUs, or defaults."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if env and env != "native":
        return [e for e in re.split(r"[;\s]+", env) if e]
    if torch.cuda.is_available():
        caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        # 9.0 as 9.0a: the sm90a (wgmma) family exists only in sm_90a code, which runs on 9.0.
        return ["9.0a" if c == (9, 0) else "%d.%d" % c for c in sorted(caps)]
    return list(DEFAULT_ARCHS)


def gencode_flags(entries):
    """-gencode flags and the list of names (e.g. '90a') compiled in."""
    flags, names = [], []
    for entry in entries:
        m = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", entry)
        if not m:
            sys.exit("treemla: cannot parse CUDA architecture %r in TORCH_CUDA_ARCH_LIST; "
                     "use numbers such as 8.0, 9.0a or 12.0+PTX" % entry)
        num = m.group(1) + m.group(2) + m.group(3)
        flags.append("-gencode=arch=compute_%s,code=sm_%s" % (num, num))
        names.append(num)
        if m.group(4):
            flags.append("-gencode=arch=compute_%s,code=compute_%s" % (num, num))
    return flags, names


def write_build_config(names):
    """A header forced into the CUDA sources: TREEMLA_CUDA_ARCHS names the compiled
    architectures in error messages. A header, not -D, because a quoted string survives neither
    ninja's shell nor setuptools' argument lists the same way."""
    out_dir = os.path.join(HERE, "build", "generated")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "treemla_build_config.h")
    text = '#pragma once\n#define TREEMLA_CUDA_ARCHS "%s"\n' % " ".join(names)
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)
    return path


def has_gpu_pool():
    """The GPU KV-pool module is bound when its header and the definitions it declares exist."""
    if not os.path.exists(os.path.join(ROOT, "include", "treemla", "cuda", "kvpool.h")):
        return False
    needed = {"apply_page_moves", "apply_row_moves", "update_page_tables", "check_move_status",
              "accept_paths", "commit_accepted"}
    found = set()
    for path in (glob.glob(os.path.join(ROOT, "src", "cuda", "**", "*.cu"), recursive=True)
                 + glob.glob(os.path.join(ROOT, "src", "cuda", "**", "*.cpp"), recursive=True)):
        text = open(path, errors="replace").read()
        found |= {n for n in needed if re.search(r"\bvoid\s+%s\s*\(" % n, text)}
    return found == needed


# Link the C++ runtime as the shared libstdc++.so.6, named as a file and ahead of torch's libraries.
# Built with a plain -lstdc++ (the one the compiler driver adds) on an Ubuntu 24.04 machine with
# GCC 13.3 and torch 2.11+cu130, the extension carried its own copy of libstdc++'s iostream and
# locale code (basic_ostream::_M_insert<long>, codecvt facets) beside the shared runtime torch loads,
# and the first error message streamed into an ostringstream crashed there. Naming the shared
# object first resolves every std:: reference to it, so nothing can be pulled from an archive.
# tests/test_error_propagation.py checks that the built extension defines no libstdc++ code.
RUNTIME_LIBS = [":libstdc++.so.6"] if sys.platform.startswith("linux") else ["stdc++"]


def extension():
    with_cuda = want_cuda()
    sources = (rel("src/common/*.cpp") + rel("src/cpu/*.cpp") + rel("src/tree/*.cpp")
               + rel("src/kvpool/*.cpp") + sorted(glob.glob("csrc/*.cpp")))
    include_dirs = [os.path.join(ROOT, "include"), os.path.join(ROOT, "src"),
                    os.path.join(HERE, "csrc")]
    # -Wno-attributes: pybind11's "declared with greater visibility" note on the KvPool class.
    cxx_flags = ["-std=c++20", "-O3", "-Wno-attributes"]
    if not with_cuda:
        return cpp_extension.CppExtension(
            "treemla._C", sources, include_dirs=include_dirs, libraries=list(RUNTIME_LIBS),
            extra_compile_args={"cxx": cxx_flags})

    sources += rel("src/cuda/**/*.cu", recursive=True) + rel("src/cuda/**/*.cpp", recursive=True)
    macros = [("TREEMLA_WITH_CUDA", "1")]
    if has_gpu_pool():
        macros.append(("TREEMLA_BIND_CUDA_KVPOOL", "1"))
    else:
        print("treemla: the GPU KV-pool module is not in this tree; its operators will raise on CUDA")
    flags, names = gencode_flags(arch_entries())
    config = write_build_config(names)
    print("treemla: building CUDA kernels for " + " ".join("sm_" + n for n in names))
    nvcc_flags = [
        "-std=c++17", "--expt-relaxed-constexpr", "-O3", "-lineinfo",
        # torch's default flags hide the half/bf16 operators the kernels use.
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
        "-include", config,
    ] + flags
    return cpp_extension.CUDAExtension(
        "treemla._C", sources, include_dirs=include_dirs, libraries=list(RUNTIME_LIBS),
        define_macros=macros,
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags})


setup(
    name="treemla",
    version="0.1.0",
    description="Tree-verify attention for MLA models (speculative decoding) as torch operators",
    packages=find_packages(include=["treemla", "treemla.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    python_requires=">=3.9",
    # torch is deliberately not a declared dependency: the extension is built for the torch
    # already installed, and a resolver that "fixed" it would break the binary.
    zip_safe=False,
)
