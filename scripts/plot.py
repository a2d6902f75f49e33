#!/usr/bin/env python3
"""Pictures of the benchmark JSON files, as PNG (matplotlib).

  scripts/plot.py roofline BENCH_JSON [--peers PEERS_JSON] [-o OUT.png]
      Every case of `treemla bench --json` on a roofline: achieved TFLOP/s against arithmetic
      intensity (FLOP per byte of KV read), under the ceilings measured in the same run
      (hbm_read_gbps, mma_sync_bf16_tflops). FLOP = 2 B H q L 1088, bytes = B L 1152, as the
      bench counts them. PEERS_JSON, a list of {impl, batch, heads, q_len, prefix, page_size,
      us}, adds other implementations' times on the same shapes.
  scripts/plot.py fragmentation SIMULATE_JSON [-o OUT.png]
      The fragmentation table of `treemla simulate --device cuda --json`: the prefix pass on the
      churned pool, after a full defrag and in a fresh contiguous cache (time and runs per
      request), and what the defrag cost.

OUT defaults to the input's name with _roofline.png or _fragmentation.png in place of .json.
Needs matplotlib (the test command's venv has it). Exit status 2 on a bad argument or input.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

# One 576-wide bf16 latent row: QK over 576 columns and PV over 512 is 2 * 1088 FLOP per
# (query row, head, key); reading the row is 1152 bytes.
FLOP_PER_KEY = 2 * 1088
BYTES_PER_ROW = 1152
CASE_KEYS = ("batch", "heads", "q_len", "prefix", "page_size", "us")


class InputError(Exception):
    """A file that is missing, not JSON, or without the keys this picture needs."""


def load_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None


def need(obj, key: str, where: str, kind=(int, float)):
    """obj[key], which must be a number (or of `kind`)."""
    if not isinstance(obj, dict) or key not in obj:
        raise InputError(f"{where} has no '{key}'")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InputError(
            f"{where}['{key}'] must be {getattr(kind, '__name__', 'a number')}, got {value!r}"
        )
    return value


def case_point(case: dict, where: str) -> Tuple[float, float]:
    """(FLOP per byte, achieved TFLOP/s) of one case."""
    b, h, q, L, _, us = (need(case, k, where) for k in CASE_KEYS)
    if min(b, h, q, L) < 1 or us <= 0:
        raise InputError(
            f"{where}: batch, heads, q_len and prefix must be >= 1 and us > 0, got {case}"
        )
    flop = FLOP_PER_KEY * b * h * q * L
    return flop / (BYTES_PER_ROW * b * L), flop / (us * 1e-6) / 1e12


def case_label(case: dict) -> str:
    return "B{batch} H{heads} q{q_len} L{L} p{page_size}".format(
        L=f"{case['prefix'] // 1024}k" if case["prefix"] % 1024 == 0 else case["prefix"], **case
    )


def place_numbers(ax, first: Dict[int, Tuple[float, float]]) -> None:
    """Writes each case's number right of its point; numbers of points in one column (same
    intensity) are spread apart vertically, with a thin line back to the point when moved."""
    columns: Dict[float, List[Tuple[float, int]]] = {}
    for n, (x, y) in first.items():
        columns.setdefault(round(math.log10(x), 3), []).append((y, n))
    gap = 0.07  # decades between two numbers of one column
    for col, items in columns.items():
        x = 10**col
        last = -math.inf
        for y, n in sorted(items):
            ly = max(math.log10(y), last + gap)
            last = ly
            moved = abs(ly - math.log10(y)) > 1e-9
            ax.annotate(
                str(n),
                (x, y),
                xytext=(x * 1.35, 10**ly),
                fontsize=7,
                va="center",
                color="dimgray",
                arrowprops=dict(arrowstyle="-", lw=0.4, color="silver") if moved else None,
            )


def roofline(bench: dict, peers: Optional[List[dict]], out: str, source: str) -> None:
    hbm = need(bench, "hbm_read_gbps", source)
    mma = need(bench, "mma_sync_bf16_tflops", source)
    results = bench.get("results")
    if not isinstance(results, list) or not results:
        raise InputError(f"{source} has no 'results' list of cases")
    points = {}  # tile -> [(x, y, case)]
    for i, case in enumerate(results):
        x, y = case_point(case, f"{source} results[{i}]")
        points.setdefault(str(case.get("tile", "treemla")), []).append((x, y, case))
    peer_points = {}  # impl -> [(x, y)]
    for i, p in enumerate(peers or []):
        impl = need(p, "impl", f"peers[{i}]", str)
        peer_points.setdefault(impl, []).append(case_point(p, f"peers[{i}]"))

    xs = [x for pts in points.values() for x, _, _ in pts] + [
        x for pts in peer_points.values() for x, _ in pts
    ]
    ys = [y for pts in points.values() for _, y, _ in pts] + [
        y for pts in peer_points.values() for _, y in pts
    ]
    x_lo, x_hi = 10 ** math.floor(math.log10(min(xs) / 2)), 10 ** math.ceil(math.log10(max(xs) * 2))
    y_lo = 10 ** math.floor(math.log10(min(ys) / 2))
    ridge = mma * 1e12 / (hbm * 1e9)  # FLOP/byte where the two ceilings meet

    fig = plt.figure(figsize=(12, 6.5), dpi=110)
    ax = fig.add_axes((0.07, 0.09, 0.66, 0.84))
    grid = [x_lo * (x_hi / x_lo) ** (k / 400) for k in range(401)]
    ax.plot(grid, [min(mma, hbm * 1e9 * x / 1e12) for x in grid], color="black", lw=1.5)
    ax.text(
        x_lo * 1.15,
        hbm * 1e9 * x_lo * 1.4 / 1e12,
        f"HBM read {hbm:g} GB/s",
        rotation=33,
        fontsize=9,
        va="bottom",
    )
    ax.text(x_hi / 1.15, mma * 1.06, f"mma.sync bf16 {mma:.0f} TFLOP/s", ha="right", fontsize=9)
    ax.axvline(ridge, color="grey", lw=0.6, ls=":")
    styles = {
        "smem-large": dict(marker="o", color="tab:blue", s=34),
        "smem99k": dict(
            marker="s", facecolors="none", edgecolors="tab:orange", linewidths=1.2, s=52
        ),
    }
    numbers: Dict[str, int] = {}  # case label -> its number in the key; both tiles share it
    first: Dict[int, Tuple[float, float]] = {}  # number -> where its label goes
    for tile, pts in points.items():
        ax.scatter(
            [x for x, _, _ in pts],
            [y for _, y, _ in pts],
            label=f"treemla {tile}",
            zorder=3,
            **styles.get(tile, dict(marker="D", color="tab:green", s=34)),
        )
        for x, y, case in pts:
            n = numbers.setdefault(case_label(case), len(numbers) + 1)
            first.setdefault(n, (x, y))
    place_numbers(ax, first)
    key = "\n".join(f"{n:>2}  {label}" for label, n in numbers.items())
    fig.text(
        0.745,
        0.93,
        "treemla cases\n(batch, heads, q_len,\nprefix, page size)\n\n" + key,
        va="top",
        fontsize=8,
        family="monospace",
    )
    peer_styles = ["^", "v", "P", "X", "*", "h"]
    for k, (impl, pts) in enumerate(sorted(peer_points.items())):
        ax.scatter(
            [x for x, _ in pts],
            [y for _, y in pts],
            marker=peer_styles[k % len(peer_styles)],
            s=44,
            facecolors="none",
            edgecolors=f"C{k + 2}",
            linewidths=1.3,
            label=impl,
            zorder=3,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, mma * 2)
    ax.set_xlabel("arithmetic intensity, FLOP per byte of KV read  (2 H q 1088 / 1152)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(
        "Verify attention on {gpu} (sm_{sm}), commit {commit}, {date}".format(
            gpu=bench.get("gpu", "?"),
            sm=bench.get("sm", "?"),
            commit=bench.get("commit", "?"),
            date=bench.get("date", "?"),
        ),
        fontsize=11,
    )
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(loc="lower right", fontsize=8)
    fig.savefig(out)
    plt.close(fig)


LAYOUTS = (
    ("churned", "(a) churned"),
    ("defragged", "(b) after a full defrag"),
    ("contiguous_page64", "(c) fresh cache, page 64"),
)


def fragmentation(sim: dict, out: str, source: str) -> None:
    frag = sim.get("fragmentation") if isinstance(sim, dict) else None
    if frag is None:
        raise InputError(
            f"{source} has no fragmentation table: `treemla simulate` measures it only with "
            "--device cuda (a CUDA build on a GPU)"
        )
    rows: List[Tuple[str, Optional[dict]]] = []
    for key, name in LAYOUTS:
        layout = frag.get(key)
        if layout is not None:
            for k in (
                "page_size",
                "runs_per_request",
                "pages_per_run",
                "median_ms",
                "min_ms",
                "tflops",
            ):
                need(layout, k, f"{source} fragmentation.{key}")
        rows.append((name, layout))
    if all(layout is None for _, layout in rows):
        raise InputError(f"{source}: no layout of the fragmentation table was measured")
    config = sim.get("config", {})

    fig, (left, right) = plt.subplots(
        1, 2, figsize=(11, 4.8), dpi=110, gridspec_kw={"width_ratios": [3, 2]}
    )
    names = [name for name, _ in rows]
    ypos = list(range(len(rows)))[::-1]
    for y, (name, layout) in zip(ypos, rows):
        if layout is None:
            left.text(
                0, y, "  not measured (a full pool cannot be defragmented)", va="center", fontsize=8
            )
            continue
        left.barh(y, layout["median_ms"], color="tab:blue", height=0.6)
        left.plot([layout["min_ms"]], [y], marker="|", color="black", ms=14)
        left.text(
            layout["median_ms"],
            y,
            "  {:.3f} ms, {:.0f} TFLOP/s".format(layout["median_ms"], layout["tflops"]),
            va="center",
            fontsize=8,
        )
        right.barh(y, layout["runs_per_request"], color="tab:orange", height=0.6)
        right.text(
            layout["runs_per_request"],
            y,
            "  {:.1f} runs, {:,.0f} pages/run".format(
                layout["runs_per_request"], layout["pages_per_run"]
            ),
            va="center",
            fontsize=8,
        )
    measured = [layout["median_ms"] for _, layout in rows if layout]
    left.set_xlim(0, max(measured) * 1.45)
    left.set_yticks(ypos, names)
    left.set_xlabel("prefix pass, median ms (| = min)")
    runs = [layout["runs_per_request"] for _, layout in rows if layout]
    right.set_xlim(0, max(runs) * 1.9)
    right.set_yticks(ypos, [""] * len(rows))
    right.set_xlabel("contiguous runs of pages per request")
    d = frag.get("final_defrag") or {}
    note = ""
    if d.get("page_moves"):
        note = "(b) came from one full defrag: {:,} page moves, {:.0f} MiB in {:.3f} ms".format(
            d["page_moves"], d.get("bytes", 0) / 2**20, d.get("ms", 0)
        )
    title = (
        "Scattered pages and the verify prefix pass: {b} requests x {q} nodes x {h} heads over "
        "{rows:,} prefix rows\n"
        "(simulate --device {dev}, page size {ps}, {r} rounds, defrag threshold {t})"
    )
    fig.suptitle(
        title.format(
            b=frag.get("batch", "?"),
            q=frag.get("q_len", "?"),
            h=frag.get("heads", "?"),
            rows=frag.get("prefix_rows", 0),
            dev=config.get("device", "?"),
            ps=config.get("page_size", "?"),
            r=config.get("rounds", "?"),
            t=config.get("defrag_threshold", "?"),
        ),
        fontsize=10,
    )
    if note:
        fig.text(0.5, 0.01, note, ha="center", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(out)
    plt.close(fig)


def default_out(path: str, suffix: str) -> str:
    p = pathlib.Path(path)
    return str(p.with_name(p.stem + suffix + ".png"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="plot.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="picture", required=True)
    r = sub.add_parser("roofline", help="roofline of a `treemla bench --json` file")
    r.add_argument("bench_json")
    r.add_argument(
        "--peers", help="JSON list of {impl, batch, heads, q_len, prefix, page_size, us}"
    )
    r.add_argument("-o", "--output")
    f = sub.add_parser(
        "fragmentation", help="fragmentation table of a `treemla simulate --json` file"
    )
    f.add_argument("simulate_json")
    f.add_argument("-o", "--output")
    args = parser.parse_args(argv)
    try:
        if args.picture == "roofline":
            peers = None
            if args.peers:
                peers = load_json(args.peers)
                if not isinstance(peers, list):
                    raise InputError(f"{args.peers}: must be a JSON list of peer cases")
            out = args.output or default_out(args.bench_json, "_roofline")
            roofline(load_json(args.bench_json), peers, out, args.bench_json)
        else:
            out = args.output or default_out(args.simulate_json, "_fragmentation")
            fragmentation(load_json(args.simulate_json), out, args.simulate_json)
    except InputError as exc:
        print(f"plot.py: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
