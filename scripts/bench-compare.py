#!/usr/bin/env python3
"""Compare two `treemla bench --json` files case by case (same GPU, ideally one run after the
other on the same machine), as a markdown table of whole-call times and their change.

    scripts/bench-compare.py baseline.json candidate.json [--min-change PCT]

Exits 2 when the files share no case. A change inside about 1% is the run-to-run spread of one
binary on the H200 (docs/gpu-check.md, "Measuring a kernel change").
"""
import argparse
import json
import sys

KEY = ("family", "tile", "batch", "heads", "q_len", "prefix", "page_size")


def load(path):
    with open(path) as f:
        doc = json.load(f)
    # Files from before the kernel families have no "family": their kernel is today's cpasync.
    rows = doc.get("results", []) + doc.get("empty_calls", [])
    cases = {tuple(r.get(k, "cpasync") if k == "family" else r[k] for k in KEY): r for r in rows}
    return doc, cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("baseline")
    ap.add_argument("candidate")
    ap.add_argument("--min-change", type=float, default=0.0,
                    help="only list cases whose time changed by at least this many percent")
    args = ap.parse_args()
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
