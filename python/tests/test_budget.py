"""The budget picker's Python wrapper against a brute-force argmax, on the committed H200 cost
table and on synthetic tables, and its errors."""
import json
import math
import os
import random

import pytest

import treemla
from treemla import budget

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TABLE = os.path.join(ROOT, "bench", "results", "2026-12-02_h200_ffa2143_cost-table.json")


def brute_force(table, scores, L, layers, fixed_us, per_node_us):
    """argmax over the table's budgets, computed here: linear interpolation in L at row n."""
    best = None
    for i, n in enumerate(table["n"]):
        B = n - 1
        if B > len(scores):
            continue
        Ls, us = table["L"], table["us"][i]
        j = max(k for k in range(len(Ls)) if Ls[k] <= L)
        j = min(j, len(Ls) - 2)
        t = (L - Ls[j]) / (Ls[j + 1] - Ls[j])
        cv = us[j] + t * (us[j + 1] - us[j])
        tokens = 1 + sum(min(1.0, math.exp(s)) for s in scores[:B])
        rate = tokens / ((fixed_us + per_node_us * n + layers * cv) * 1e-6)
        if best is None or rate > best[1] * (1 + 1e-12):
            best = (B, rate)
    return best


def test_committed_table_matches_brute_force():
    table = budget.load_cost_table(TABLE)
    rng = random.Random(5)
    for trial in range(40):
        scores = sorted((math.log(rng.uniform(0.02, 1.0)) * rng.uniform(0.5, 3.0)
                         for _ in range(rng.choice([20, 200, 1023]))), reverse=True)
        L = rng.choice([1024, 5000, 65536, 131072, 185000, 262144])
        c = budget.pick_budget(table, scores, L, layers=78, fixed_us=10000.0, per_node_us=10.0)
        B, rate = brute_force(table, scores, L, 78, 10000.0, 10.0)
        assert c["budget"] == B, f"trial {trial} (seed 5)"
        assert c["tokens_per_s"] == pytest.approx(rate, rel=1e-9)


def test_report_all_lists_every_candidate():
    table = budget.load_cost_table(TABLE)
    c = budget.pick_budget(table, [-0.1] * 1023, 4096, report_all=True)
    assert [p["budget"] for p in c["all"]] == [n - 1 for n in table["n"]]
    assert max(p["tokens_per_s"] for p in c["all"]) == c["tokens_per_s"]


def test_errors_name_the_argument(tmp_path):
    table = budget.load_cost_table(TABLE)
    with pytest.raises(ValueError, match="prefix"):
        budget.pick_budget(table, [-0.5], 10 ** 7)  # L outside the table
    with pytest.raises(TypeError, match=r"path_logprobs\[1\]"):
        budget.pick_budget(table, [-0.5, "x"], 4096)
    with pytest.raises(ValueError):
        budget.pick_budget(table, [float("nan")], 4096)
    with pytest.raises(TypeError, match="prefix_len"):
        budget.pick_budget(table, [-0.5], 4096.5)
    bad = dict(table)
    del bad["us"]
    with pytest.raises(ValueError, match="'us'"):
        budget.pick_budget(bad, [-0.5], 4096)
    p = tmp_path / "t.json"
    p.write_text(json.dumps({k: v for k, v in table.items() if k != "L"}))
    with pytest.raises(ValueError, match="no key 'L'"):
        budget.load_cost_table(str(p))
    p.write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read"):
        budget.load_cost_table(str(p))
