#!/usr/bin/env python3
"""What a build's kernels compiled to: per kernel and architecture, the code size, registers,
stack, a digest of the SASS without addresses, and each loop that issues tensor instructions
(its instruction count, HMMA / HGMMA, LDSM, local-memory spill loads and stores, mbarrier
operations). No GPU needed; it reads the binary with cuobjdump.

    scripts/sass-stats.py build/treemla [--kernel REGEX] [--arch sm_90a] [--against OTHER]
    scripts/sass-stats.py build/treemla --resources > tests/kernel_resources.json
    scripts/sass-stats.py build/treemla --check-resources tests/kernel_resources.json

--against prints the same rows for a second build beside the first (a kernel change's effect on
the code, before any GPU time is spent on it); two builds whose digests match run the same
instructions. --resources prints every kernel's registers and stack, every architecture, as
JSON; --check-resources compares a build with such a file (tests/kernel_resources.json, which
the tests check CI's build against) and names each kernel that uses more registers or stack, is
new, or is gone. docs/gpu-check.md ("Reading a kernel's SASS") says what the columns have told us.
cuobjdump comes with the CUDA toolkit; where the toolkit lacks it, `pip install
nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` provides them (-sass needs nvdisasm beside
cuobjdump), which this script finds in the Python environment.
"""
import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig

DEFAULT_KERNELS = r"main_kernel|combine_kernel"
# One SASS instruction line: /*0a40*/  [@P0] OPCODE operands ;
INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def find_cuobjdump(explicit=None):
    """The cuobjdump to run: --cuobjdump, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, or the one
    the nvidia-cuda-cuobjdump wheel puts under site-packages/nvidia/cu*/bin."""
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            sys.exit(f"sass-stats: --cuobjdump {explicit} is not an executable file")
        return explicit
    found = shutil.which("cuobjdump")
    if found:
        return found
    candidates = []
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "bin", "cuobjdump"))
    for key in ("purelib", "platlib"):
        candidates += sorted(glob.glob(os.path.join(sysconfig.get_paths()[key], "nvidia", "*",
                                                    "bin", "cuobjdump")))
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    sys.exit("sass-stats: no cuobjdump found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, the "
             "Python environment); install the CUDA toolkit's, or `pip install "
             "nvidia-cuda-cuobjdump`, or pass --cuobjdump PATH")


def run(cuobjdump, flag, binary, arch_re="."):
    # A plain architecture name narrows cuobjdump's own output (a build for six architectures
    # takes minutes to list whole).
    narrow = ["-arch", arch_re] if re.fullmatch(r"sm_\w+", arch_re) else []
    r = subprocess.run([cuobjdump, *narrow, flag, binary], capture_output=True, text=True)
    # A listing cut short fails too (-sass without nvdisasm prints the headers, then "fatal").
    if r.returncode != 0 and (not r.stdout or "fatal" in r.stderr):
        sys.exit(f"sass-stats: {cuobjdump} {flag} {binary} failed: {r.stderr.strip()}")
    return r.stdout


def with_arch(text):
    """(architecture, line) for each line of a cuobjdump listing: the architecture of the ELF
    section the line is in ('?' before the first `arch = ...` line)."""
    arch = "?"
    for line in text.splitlines():
        m = re.search(r"arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
        yield arch, line


def parse_sass(text):
    """{(arch, function): [(address, instruction), ...]} from `cuobjdump -sass`."""
    funcs, name = {}, None
    for arch, line in with_arch(text):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = (arch, m.group(1))
            funcs[name] = []
            continue
        m = INSTR.match(line)
        if m and name is not None:
            funcs[name].append((int(m.group(1), 16), m.group(2)))
    return funcs


def parse_res_usage(text):
    """{(arch, function): {"REG": n, "STACK": n, ...}} from `cuobjdump -res-usage`."""
    out, name = {}, None
    for arch, line in with_arch(text):
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            name = (arch, m.group(1))
        elif name is not None and "REG:" in line:
            out[name] = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", line)}
            name = None
    return out


def parse_text_sizes(text):
    """{(arch, function): bytes of its .text section} from `cuobjdump -elf` (section headers)."""
    out = {}
    for arch, line in with_arch(text):
        m = re.search(r"\s([0-9a-f]+)\s+[0-9a-f]+\s+[0-9a-f]+\s+PROGBITS\s.*\s\.text\.(\S+)\s*$",
                      line)
        if m:
            out[(arch, m.group(2))] = int(m.group(1), 16)
    return out


def opcode(instr):
    """The instruction's opcode without predicate and modifiers: `@!P0 LDSM.16.M88.4 R4, [R2]`
    -> `LDSM`."""
    words = instr.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def loops(instrs):
    """Backward branches' bodies that hold tensor instructions, innermost first: dicts of
    first/last index and counts."""
    index = {addr: i for i, (addr, _) in enumerate(instrs)}
    found = []
    for i, (addr, text) in enumerate(instrs):
        m = BRANCH_TARGET.search(text)
        if not m or opcode(text) != "BRA":
            continue
        target = int(m.group(1), 16)
        if target >= addr or target not in index:
            continue
        body = [opcode(t) for _, t in instrs[index[target]:i + 1]]
        counts = {k: body.count(k) for k in ("HMMA", "HGMMA", "LDSM", "LDL", "STL", "SYNCS")}
        if counts["HMMA"] or counts["HGMMA"]:
            found.append(dict(first=index[target], last=i, instructions=len(body), **counts))
    found.sort(key=lambda d: d["instructions"])
    return found


def digest(instrs):
    """A digest of the instructions without their addresses (two builds with the same digest run
    the same code)."""
    h = hashlib.sha256()
    for _, text in instrs:
        h.update(re.sub(r"\s+", " ", text).encode())
        h.update(b"\n")
    return h.hexdigest()[:12]


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    r = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    out = r.stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def short(name):
    """A demangled kernel name without its namespaces, return type and parameter list, template
    arguments kept: `treemla::cuda::warpspec::warpspec_main_kernel<__nv_bfloat16, ...>`."""
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(anonymous namespace\)::", "", name)  # before the cut: not a parameter list
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # drop the parameter list: the last '(' at template depth 0
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
    name = name[:cut]
    return re.sub(r"treemla::cuda::|treemla::", "", name)


def collect(cuobjdump, binary, kernel_re, arch_re):
    sass = parse_sass(run(cuobjdump, "-sass", binary, arch_re))
    res = parse_res_usage(run(cuobjdump, "-res-usage", binary, arch_re))
    sizes = parse_text_sizes(run(cuobjdump, "-elf", binary, arch_re))
    names = demangle(sorted({n for _, n in sass}))
    rows = {}
    for (arch, name), instrs in sass.items():
        pretty = short(names.get(name, name))
        if not re.search(kernel_re, pretty) or not re.search(arch_re, arch):
            continue
        r = res.get((arch, name), {})
        rows[(arch, pretty)] = dict(bytes=sizes.get((arch, name)), reg=r.get("REG"),
                                    stack=r.get("STACK"), digest=digest(instrs),
                                    loops=loops(instrs))
    return rows


def resources(cuobjdump, binary):
    """{arch: {kernel: {"reg": n, "stack": n}}} for every function of every architecture in the
    binary (`cuobjdump -res-usage`), kernels named as `short` names them. Where two functions
    get one short name (template arguments that differ only in namespaces), the larger figures."""
    res = parse_res_usage(run(cuobjdump, "-res-usage", binary))
    names = demangle(sorted({n for _, n in res}))
    out = {}
    for (arch, name), r in res.items():
        k = short(names.get(name, name))
        cur = out.setdefault(arch, {}).get(k, {"reg": 0, "stack": 0})
        out[arch][k] = {"reg": max(cur["reg"], r.get("REG", 0)),
                        "stack": max(cur["stack"], r.get("STACK", 0))}
    return out


def build_nvcc(binary):
    """The CUDA compiler version of the CMake build the binary is in (its build directory's
    CMakeFiles/<cmake version>/CMakeCUDACompiler.cmake), or None."""
    here = os.path.dirname(os.path.abspath(binary))
    for d in (here, os.path.dirname(here)):
        for f in sorted(glob.glob(os.path.join(d, "CMakeFiles", "*", "CMakeCUDACompiler.cmake"))):
            with open(f) as fh:
                m = re.search(r'set\(CMAKE_CUDA_COMPILER_VERSION "([^"]+)"\)', fh.read())
            if m:
                return m.group(1)
    return None


def check_resources(found, budget, all_archs):
    """Lines naming what breaks the budget ({arch: {kernel: {"reg", "stack"}}}): a kernel with
    more registers or stack than recorded, a kernel not recorded, a recorded kernel not built.
    Architectures the build lacks are not compared, unless all_archs (then each is a line)."""
    lines = []
    for arch in sorted(set(budget) | set(found)):
        if arch not in found:
            if all_archs:
                lines.append(f"{arch}: recorded, not in the build")
            continue
        if arch not in budget:
            lines.append(f"{arch}: in the build, not recorded")
            continue
        have, want = found[arch], budget[arch]
        for k in sorted(set(have) | set(want)):
            if k not in want:
                lines.append(f"{arch} {k}: not recorded (REG {have[k]['reg']}, STACK "
                             f"{have[k]['stack']})")
            elif k not in have:
                lines.append(f"{arch} {k}: recorded, not in the build")
            else:
                for field in ("reg", "stack"):
                    if have[k][field] > want[k][field]:
                        lines.append(f"{arch} {k}: {field.upper()} {have[k][field]} > "
                                     f"{want[k][field]} recorded")
    return lines


def loop_cell(lp):
    return (f"{lp['instructions']} instr, {lp['HMMA'] or lp['HGMMA']} "
            f"{'HMMA' if lp['HMMA'] else 'HGMMA'}, {lp['LDSM']} LDSM, "
            f"{lp['LDL']}/{lp['STL']} LDL/STL, {lp['SYNCS']} SYNCS")


def report(rows, other, max_loops):
    print("| arch | kernel | build | bytes | REG | STACK | digest | loops with tensor "
          "instructions (innermost first) |")
    print("|---|---|---|---|---|---|---|---|")
    for key in sorted(set(rows) | set(other or {})):
        for label, table in (("a", rows), ("b", other)) if other is not None else (("", rows),):
            r = table.get(key)
            if r is None:
                print(f"| {key[0]} | `{key[1]}` | {label} | (absent) | | | | |")
                continue
            cells = "; ".join(loop_cell(lp) for lp in r["loops"][:max_loops]) or "-"
            print(f"| {key[0]} | `{key[1]}` | {label} | {r['bytes']} | {r['reg']} | "
                  f"{r['stack']} | {r['digest']} | {cells} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary", help="an executable, library or cubin with device code")
    ap.add_argument("--kernel", default=DEFAULT_KERNELS,
                    help=f"regular expression on the demangled name (default: {DEFAULT_KERNELS})")
    ap.add_argument("--arch", default="sm_90a", help="regular expression on the SASS architecture "
                    "(default: sm_90a; '.' for all)")
    ap.add_argument("--against", help="a second build, printed row by row beside the first")
    ap.add_argument("--loops", type=int, default=3, help="loops shown per kernel (default: 3)")
    ap.add_argument("--cuobjdump", help="the cuobjdump to run")
    ap.add_argument("--resources", action="store_true",
                    help="print every kernel's registers and stack (every architecture) as JSON")
    ap.add_argument("--check-resources", metavar="JSON",
                    help="compare with a --resources file; exit 1 naming each kernel over it")
    a = ap.parse_args()
    if a.loops < 1:
        ap.error(f"--loops = {a.loops} must be at least 1")
    for path in filter(None, (a.binary, a.against)):
        if not os.path.isfile(path):
            ap.error(f"{path}: no such file")
    if a.check_resources and not os.path.isfile(a.check_resources):
        ap.error(f"--check-resources {a.check_resources}: no such file")
    tool = find_cuobjdump(a.cuobjdump)
    if a.resources:
        json.dump({"nvcc": build_nvcc(a.binary), "kernels": resources(tool, a.binary)}, sys.stdout,
                  indent=1, sort_keys=True)
        print()
        return
    if a.check_resources:
        with open(a.check_resources) as f:
            budget = json.load(f)
        nvcc = build_nvcc(a.binary)
        if nvcc != budget.get("nvcc"):
            print(f"note: {a.check_resources} was recorded with nvcc {budget.get('nvcc')}, "
                  f"{a.binary} was built with {nvcc}")
        lines = check_resources(resources(tool, a.binary), budget["kernels"], all_archs=False)
        for line in lines:
            print(line)
        sys.exit(1 if lines else 0)
    rows = collect(tool, a.binary, a.kernel, a.arch)
    other = collect(tool, a.against, a.kernel, a.arch) if a.against else None
    if not rows and not other:
        sys.exit(f"sass-stats: no kernel matches --kernel '{a.kernel}' and --arch '{a.arch}' "
                 f"in {a.binary}")
    report(rows, other, a.loops)


if __name__ == "__main__":
    main()
