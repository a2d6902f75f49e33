#!/usr/bin/env python3
"""Compare two `treemla bench --json` files case by case (same GPU, ideally one run after the
other on the same machine), as a markdown table of whole-call times and their change.

    scripts/bench-compare.py baseline.json candidate.json [--min-change PCT]
    scripts/bench-compare.py --baseline-runs B1 B2 ... --candidate-runs C1 C2 ... [--min-change PCT]

The second form takes several runs of each build (rounds alternated in one GPU call; each file
`treemla bench --json` output or the table `treemla bench` prints) and gives, per case, each
side's median and range and the ratio of the medians; a case whose two ranges overlap is marked
"within the spread". Exits 2 when the files share no case or cannot be read. A change inside
about 1% is the run-to-run spread of one binary on the H200, more for sm90a at some shapes
(docs/gpu-check.md, "Measuring a kernel change").
"""
import argparse
import importlib.util
import json
import pathlib
import statistics
import sys

KEY = ("family", "tile", "batch", "heads", "q_len", "prefix", "page_size")


def load(path):
    with open(path) as f:
        doc = json.load(f)
    # Files from before the kernel families have no "family": their kernel is today's cpasync.
    rows = doc.get("results", []) + doc.get("empty_calls", [])
    cases = {tuple(r.get(k, "cpasync") if k == "family" else r[k] for k in KEY): r for r in rows}
    return doc, cases


def table_reader():
    """bench-fit.py's reader of the table `treemla bench` prints (one parser for both scripts)."""
    spec = importlib.util.spec_from_file_location(
        "treemla_bench_fit", pathlib.Path(__file__).resolve().parent / "bench-fit.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    return fit.table_rows


def runs_of(paths):
    """{case key: [us, ...]} over several files: JSON read as the one-run form reads it (results
    and empty calls), printed tables through bench-fit.py's reader."""
    cases, table_rows = {}, None
    for path in paths:
        with open(path) as f:
            text = f.read()
        if text.lstrip().startswith("{"):
            for k, r in load(path)[1].items():
                cases.setdefault(k, []).append(r["us"])
            continue
        table_rows = table_rows or table_reader()
        # (family, tile, batch, heads, q_len, page_size, prefix, us)
        for name, tile, b, h, q, page, prefix, us in table_rows(path, text):
            cases.setdefault((name, tile, b, h, q, prefix, page), []).append(us)
    return cases


def compare_runs(base_paths, cand_paths, min_change):
    try:
        base, cand = runs_of(base_paths), runs_of(cand_paths)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"bench-compare: {e}", file=sys.stderr)
        return 2
    shared = [k for k in base if k in cand]
    if not shared:
        print("bench-compare: the baseline and candidate runs share no case", file=sys.stderr)
        return 2
    print(f"- baseline: {len(base_paths)} runs; candidate: {len(cand_paths)} runs")
    print()
    print("| family | tile | B | H | q | L | page | baseline us, median (range) | "
          "candidate us, median (range) | ratio of medians | |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ratios, apart = [], 0
    for k in shared:
        a, b = base[k], cand[k]
        ratio = statistics.median(b) / statistics.median(a)
        ratios.append(ratio)
        overlap = min(b) <= max(a) and min(a) <= max(b)
        apart += not overlap
        if abs(100.0 * (ratio - 1.0)) >= min_change:
            print("| " + " | ".join(str(v) for v in k) +
                  f" | {statistics.median(a):.1f} ({min(a):.1f}-{max(a):.1f})"
                  f" | {statistics.median(b):.1f} ({min(b):.1f}-{max(b):.1f})"
                  f" | {ratio:.3f} | {'within the spread' if overlap else ''} |")
    print()
    print(f"{len(shared)} cases; ratio of medians from {min(ratios):.3f} to {max(ratios):.3f} "
          f"(below 1 = candidate faster); {apart} with the two ranges apart")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("baseline", nargs="?")
    ap.add_argument("candidate", nargs="?")
    ap.add_argument("--baseline-runs", nargs="+", metavar="FILE",
                    help="several runs of the baseline (with --candidate-runs)")
    ap.add_argument("--candidate-runs", nargs="+", metavar="FILE",
                    help="several runs of the candidate (with --baseline-runs)")
    ap.add_argument("--min-change", type=float, default=0.0,
                    help="only list cases whose time changed by at least this many percent")
    args = ap.parse_args()
    if args.baseline_runs or args.candidate_runs:
        if not (args.baseline_runs and args.candidate_runs) or args.baseline or args.candidate:
            print("bench-compare: give --baseline-runs and --candidate-runs together, and no "
                  "positional files with them", file=sys.stderr)
            return 2
        return compare_runs(args.baseline_runs, args.candidate_runs, args.min_change)
    if not (args.baseline and args.candidate):
        print("bench-compare: give a baseline and a candidate file (or --baseline-runs and "
              "--candidate-runs)", file=sys.stderr)
        return 2
    base_doc, base = load(args.baseline)
    cand_doc, cand = load(args.candidate)
    shared = [k for k in base if k in cand]
    if not shared:
        print(f"bench-compare: {args.baseline} and {args.candidate} share no case", file=sys.stderr)
        return 2
    for name, doc in (("baseline", base_doc), ("candidate", cand_doc)):
        print(f"- {name}: commit {doc.get('commit')}, {doc.get('gpu')}, {doc.get('date')}, "
              f"HBM read {doc.get('hbm_read_gbps', 0):.0f} GB/s, "
              f"mma.sync {doc.get('mma_sync_bf16_tflops', 0):.1f} TFLOP/s")
    print()
    print("| family | tile | B | H | q | L | page | baseline us | candidate us | change |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    changes = []
    for k in shared:
        a, b = base[k]["us"], cand[k]["us"]
        change = 100.0 * (b / a - 1.0)
        changes.append(change)
        if abs(change) >= args.min_change:
            print("| " + " | ".join(str(v) for v in k) + f" | {a:.1f} | {b:.1f} | {change:+.1f}% |")
    print()
    print(f"{len(shared)} cases; time change from {min(changes):+.1f}% to {max(changes):+.1f}% "
          "(negative = candidate faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
