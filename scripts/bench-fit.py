#!/usr/bin/env python3
"""Fit call time against prefix length: for every kernel family (or peer) and shape measured at
two or more prefix lengths, the least-squares line us = fixed + per_key * L, printed as a markdown
table of microseconds per 1,024 keys of each request and microseconds at L = 0 (the part of a
call that does not grow with the prefix).

    scripts/bench-fit.py FILE [FILE ...]

Each FILE is `treemla bench --json` output (its "results"), the table `treemla bench` prints, or
`bench/peers.py --json` output (a list of {impl, batch, heads, q_len, prefix, page_size, us}). Rows of every file are pooled; a
case measured more than once keeps its median. Exits 2 when no family and shape has two prefix
lengths. docs/verify-kernel.md ("The fixed cost of a split call") shows what such a fit found.
"""
import argparse
import json
import statistics
import sys

SHAPE = ("batch", "heads", "q_len", "page_size")


def rows_of(path):
    """(name, tile, batch, heads, q_len, page_size, prefix, us) of every timed case in a file."""
    with open(path) as f:
        text = f.read()
    if not text.lstrip().startswith(("{", "[")):  # the table treemla bench prints
        return table_rows(path, text)
    doc = json.loads(text)
    if isinstance(doc, list):  # bench/peers.py
        return [(r["impl"], "-", *(r[k] for k in SHAPE), r["prefix"], r["us"]) for r in doc]
    if not isinstance(doc, dict) or "results" not in doc:
        raise ValueError(f"{path}: neither treemla bench --json output nor bench/peers.py output")
    return [(r.get("family", "cpasync"), r["tile"], *(r[k] for k in SHAPE), r["prefix"], r["us"])
            for r in doc["results"]]


def table_rows(path, text):
    """The rows of `treemla bench`'s printed table: family tile batch H q_len prefix page | us ..."""
    rows = []
    for line in text.splitlines():
        f = line.split()
        if len(f) > 8 and f[7] == "|" and not line.startswith("#") and f[0] != "family":
            b, h, q, prefix, page = (int(x) for x in f[2:7])
            rows.append((f[0], f[1], b, h, q, page, prefix, float(f[8])))
    if not rows:
        raise ValueError(f"{path}: no JSON and no row of treemla bench's table")
    return rows


def fit_line(points):
    """Least-squares (fixed, per_key) of us = fixed + per_key * L over (L, us) points."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    per_key = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx
    return my - per_key * mx, per_key


def fits(rows):
    """{(name, tile, batch, heads, q_len, page_size): (points, fixed, per_key)} for the groups
    with at least two distinct prefix lengths; points are (L, median us) in increasing L."""
    groups = {}
    for *key, prefix, us in rows:
        groups.setdefault(tuple(key), {}).setdefault(prefix, []).append(us)
    out = {}
    for key, by_len in groups.items():
        points = sorted((L, statistics.median(v)) for L, v in by_len.items() if L > 0)
        if len(points) >= 2:
            out[key] = (points, *fit_line(points))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    rows = []
    for path in args.files:
        try:
            rows += rows_of(path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"bench-fit: {path}: {e}", file=sys.stderr)
            return 2
    found = fits(rows)
    if not found:
        print("bench-fit: no family and shape was measured at two or more prefix lengths",
              file=sys.stderr)
        return 2
    print("| family | tile | B | H | q | page | L: us | us per 1,024 keys | us at L = 0 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(found):
        points, fixed, per_key = found[key]
        pts = ", ".join(f"{L}: {us:.1f}" for L, us in points)
        print("| " + " | ".join(str(v) for v in key) +
              f" | {pts} | {per_key * 1024:.3f} | {fixed:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
