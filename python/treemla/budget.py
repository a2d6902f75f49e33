"""The DDTree budget picker (docs/budget.md): choose the tree size B per request and round from a
measured table of verify cost, the drafter's path log-probabilities and the cost of a round
outside verify attention, to maximise expected accepted tokens per second.

    table = treemla.budget.load_cost_table("cost-table.json")   # `treemla bench --cost-table`
    choice = treemla.budget.pick_budget(table, path_logprobs, prefix_len=185000, layers=78,
                                        fixed_us=10000.0, per_node_us=10.0)
    choice["budget"], choice["tokens_per_s"]

``path_logprobs`` are DDTree's node scores in pop order without the root (``build_ddtree``'s
scores[1:]). The model, its assumptions and the table's JSON schema are in docs/budget.md.
"""
from __future__ import annotations

import json
import math
from typing import Dict, List, Optional, Sequence

from . import _C
from ._args import as_int

_KEYS = ("gpu", "date", "commit", "heads", "page_size", "n", "L", "us")


def load_cost_table(path: str) -> Dict:
    """Reads a cost table JSON (docs/budget.md). Raises ValueError naming the file and the key
    that is missing or malformed; the picker checks the values themselves (axes increasing,
    times finite and positive)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cost table {path!r} cannot be read: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"cost table {path!r} must be a JSON object, got {type(doc).__name__}")
    for key in _KEYS:
        if key not in doc:
            raise ValueError(f"cost table {path!r} has no key {key!r}")
    for key in ("n", "L", "us"):
        if not isinstance(doc[key], list):
            raise ValueError(f"cost table {path!r}: {key!r} must be a list")
    if not all(isinstance(row, list) for row in doc["us"]):
        raise ValueError(f"cost table {path!r}: 'us' must be a list of rows (one per n)")
    return {k: doc[k] for k in _KEYS}


def pick_budget(table: Dict, path_logprobs: Sequence[float], prefix_len: int, *,
                layers: int = 1, fixed_us: float = 0.0, per_node_us: float = 0.0,
                calibration: float = 1.0, candidates: Optional[Sequence[int]] = None,
                every_budget: bool = False, report_all: bool = False) -> Dict:
    """The budget B with the most expected accepted tokens per second.

    Returns a dict: budget, expected_tokens, verify_us (per layer), round_us, tokens_per_s, and
    ``all`` (every candidate's figures when ``report_all``). ``table`` is a dict as
    load_cost_table returns. Raises ValueError naming the argument and its bound."""
    missing = [k for k in _KEYS if k not in table]
    if missing:
        raise ValueError(f"table has no key {missing[0]!r} (expected {', '.join(_KEYS)})")
    scores: List[float] = []
    for i, s in enumerate(path_logprobs):
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            raise TypeError(f"path_logprobs[{i}] = {s!r} must be a number")
        scores.append(float(s))
    if not (isinstance(calibration, (int, float)) and math.isfinite(calibration)):
        raise ValueError(f"calibration = {calibration!r} must be a finite number")
    cands = [as_int(c, f"candidates[{i}]") for i, c in enumerate(candidates or [])]
    try:
        n = [as_int(x, f"table['n'][{i}]") for i, x in enumerate(table["n"])]
        L = [as_int(x, f"table['L'][{i}]") for i, x in enumerate(table["L"])]
        us = [[float(x) for x in row] for row in table["us"]]
        return _C.pick_budget(str(table["gpu"]), str(table["date"]), str(table["commit"]),
                              as_int(table["heads"], "table['heads']"),
                              as_int(table["page_size"], "table['page_size']"), n, L, us, scores,
                              as_int(prefix_len, "prefix_len"), as_int(layers, "layers"),
                              float(fixed_us), float(per_node_us), float(calibration), cands,
                              bool(every_budget), bool(report_all))
    except RuntimeError as e:  # the library's checks name the field and the bound
        raise ValueError(str(e)) from None
