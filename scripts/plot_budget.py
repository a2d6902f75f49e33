#!/usr/bin/env python3
"""Draws the budget picker's picture (docs/budget.md): the budget B* it picks against the prefix
length L, and the tokens-per-second gain of picking it over fixed budgets, from a cost table.

The numbers come from the tool itself: for each drafter profile the script runs

    treemla simulate --budget-compare --draft-logit-range R --compare-prompts <L grid> --json ...

so the picture shows exactly the model and the comparison that the tool prints (docs/tool.md).
A profile is the synthetic drafter's confidence: its top-k logits are uniform in [0, R] against 1
for the rest of the vocabulary (tools/treemla/sim/synthetic.h); the legend gives each profile's
tokens per round at the largest tree.

Usage (from the repository root, after building the tool):

    python3 scripts/plot_budget.py --treemla build/treemla --out docs/budget-picker.png

Needs matplotlib (pip install matplotlib); the comparison itself takes seconds.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

PROFILES = [2.0, 4.0, 8.0]  # drafter logit ranges: weak, the tool's default, confident
FIXED = [15, 63, 255, 1023]  # trees of 16, 64, 256 and 1024 nodes
# L from 1K to 256K, four points per doubling, plus GLM-5's 185K.
PROMPTS = sorted({int(round(1024 * 2 ** (k / 4))) for k in range(33)} | {185000})


def run_compare(treemla, logit_range, args):
    """One `simulate --budget-compare` run; returns its JSON document."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "compare.json")
        cmd = [treemla, "simulate", "--budget-compare", "--draft-logit-range", str(logit_range),
               "--compare-prompts", ",".join(str(p) for p in args.prompts),
               "--compare-budgets", ",".join(str(b) for b in FIXED),
               "--rounds", str(args.rounds), "--seed", str(args.seed), "--json", path]
        if args.cost_table:
            cmd += ["--cost-table", args.cost_table]
        p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            sys.exit("plot_budget: %s failed (exit %d):\n%s" % (" ".join(cmd), p.returncode, p.stderr))
        with open(path) as f:
            return json.load(f)


def label(logit_range, doc):
    largest = max(f["budget"] for f in doc["results"][0]["fixed"])
    tokens = next(f["tokens_per_round"] for f in doc["results"][0]["fixed"] if f["budget"] == largest)
    return "logits in [0, %g]: %.1f tokens/round at B=%d" % (logit_range, tokens, largest)


def plot(docs, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_b, ax_tps, ax_gain) = plt.subplots(1, 3, figsize=(17, 5.2))
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    first = docs[0][1]
    table = first["cost_model"]["table"]
    cost = first["cost_model"]
    styles = [("single", "-", "the best single budget for every L"),
              ("best_listed", "--", "the best of B=%s at each L" % ",".join(map(str, FIXED))),
              ("best_any", ":", "the best table budget at each L (hindsight)")]
    for (r, doc), color in zip(docs, colors):
        L = [x["prompt"] for x in doc["results"]]
        ax_b.plot(L, [1 + x["auto"]["mean_budget"] for x in doc["results"]], "o-", ms=3, color=color,
                  label=label(r, doc))
        for key, style, _ in styles:
            ax_gain.plot(L, [100 * x[key]["gain"] for x in doc["results"]], style, color=color)
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=c, label="logits in [0, %g] (single: B=%d)" % (r, d["best_single_budget"]))
               for (r, d), c in zip(docs, colors)]
    handles += [Line2D([], [], color="black", ls=style, label="over " + text) for _, style, text in styles]
    default = next(doc for r, doc in docs if r == 4.0) if any(r == 4.0 for r, _ in docs) else first
    L = [x["prompt"] for x in default["results"]]
    for b, color in zip(FIXED, colors):
        ax_tps.plot(L, [next(f["tokens_per_s"] for f in x["fixed"] if f["budget"] == b) for x in default["results"]],
                    "-", color=color, lw=1, label="fixed B=%d" % b)
    ax_tps.plot(L, [x["auto"]["tokens_per_s"] for x in default["results"]], "k-", lw=2.2, label="auto")

    for ax in (ax_b, ax_tps, ax_gain):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prefix length L (tokens)")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xticks([1024, 4096, 16384, 65536, 262144], ["1K", "4K", "16K", "64K", "256K"])
        ax.axvline(185000, color="gray", lw=0.8, ls=":")
    ax_b.set_yscale("log", base=2)
    ax_b.set_yticks([1, 16, 32, 64, 128, 256, 512, 1024], ["1", "16", "32", "64", "128", "256", "512", "1024"])
    ax_b.set_ylabel("1 + B* (tree nodes; mean of the per-round picks)")
    ax_b.set_title("B* against L, per drafter profile")
    ax_b.legend(fontsize=8)
    ax_tps.set_yscale("log")
    ax_tps.set_ylabel("tokens/s (one request)")
    ax_tps.set_title("tokens/s, drafter logits in [0, 4]")
    ax_tps.legend(fontsize=8)
    ax_gain.axhline(0, color="black", lw=0.8)
    ax_gain.set_ylabel("tokens/s gain of auto (%)")
    ax_gain.set_title("gain of auto over fixed budgets")
    ax_gain.legend(handles=handles, fontsize=7.5)
    fig.suptitle("Budget picker on the %s cost table (%s, commit %s, H=%d, page %d): round = %d layers x C_v(1+B, L)"
                 " + %g us + %g us/node; 185K dotted" % (table["gpu"], table["date"], table["commit"], table["heads"],
                                                          table["page_size"], cost["layers"], cost["round_fixed_us"],
                                                          cost["round_per_node_us"]), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--treemla", default=os.environ.get("TREEMLA_BIN", "build/treemla"), help="the treemla binary")
    ap.add_argument("--out", default="docs/budget-picker.png", help="the PNG to write")
    ap.add_argument("--cost-table", help="a cost table JSON (default: the tool's default table)")
    ap.add_argument("--rounds", type=int, default=400, help="rounds per prompt length")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profiles", default=",".join("%g" % r for r in PROFILES),
                    help="drafter logit ranges, comma-separated")
    ap.add_argument("--prompts", default=",".join(map(str, PROMPTS)), help="prefix lengths, comma-separated")
    ap.add_argument("--json-out", help="also write the comparisons here, one document per profile")
    args = ap.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("plot_budget: needs matplotlib (pip install matplotlib)")
    if not os.access(args.treemla, os.X_OK):
        sys.exit("plot_budget: --treemla %s is not an executable (build the tool first)" % args.treemla)
    args.prompts = [int(p) for p in args.prompts.split(",")]
    profiles = [float(r) for r in args.profiles.split(",")]
    docs = [(r, run_compare(args.treemla, r, args)) for r in profiles]
    plot(docs, args.out)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump([{"draft_logit_range": r, "compare": d} for r, d in docs], f, indent=1)
    print("plot_budget: wrote %s" % args.out)


if __name__ == "__main__":
    main()
