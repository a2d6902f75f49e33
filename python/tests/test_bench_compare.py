"""scripts/bench-compare.py: one run a side (two `treemla bench --json` files), and several runs a
side (alternated rounds, JSON or the printed table), checked on small files written here."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench-compare.py"

HEADER = ("family   tile       batch    H q_len  prefix  page |        us   us_pref   us_tail |"
          "  TFLOP/s   %mma |  KV GB/s   %hbm")


def run(*args):
    p = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                       text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def bench_json(path, us_by_family, empty_us=None):
    doc = {"gpu": "test", "commit": path.stem, "results": [
        {"family": f, "tile": "smem-large", "batch": 1, "heads": 16, "q_len": 16,
         "prefix": 131072, "page_size": 64, "us": us} for f, us in us_by_family.items()]}
    if empty_us is not None:  # the empty call, as `treemla bench --json` writes it
        doc["empty_calls"] = [{"family": "sm90a", "tile": "smem-large", "batch": 1, "heads": 8,
                               "q_len": 1, "prefix": 0, "page_size": 64, "us": empty_us}]
    path.write_text(json.dumps(doc))
    return path


def bench_table(path, us_by_family):
    lines = ["# treemla bench  gpu: test", HEADER]
    for f, us in us_by_family.items():
        lines.append(f"{f:8s} smem-large     1   16    16  131072    64 | {us:9.1f} {us:9.1f}"
                     "      1.0 |    100.0  10.0% |      100   2.0%")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_one_run_a_side(tmp_path):
    a = bench_json(tmp_path / "a.json", {"sm90a": 100.0, "decode": 50.0})
    b = bench_json(tmp_path / "b.json", {"sm90a": 90.0})
    rc, out, err = run(a, b)
    assert rc == 0, err
    assert "| sm90a | smem-large | 1 | 16 | 16 | 131072 | 64 | 100.0 | 90.0 | -10.0% |" in out
    assert "1 cases" in out  # decode is only in the baseline


def test_runs_medians_ranges_and_spread(tmp_path):
    # baseline sm90a 100, 102, 110 (median 102); candidate 95, 96, 97 (median 96): apart.
    # decode: 50, 60, 55 against 52, 58, 54: overlapping ranges.
    base = [bench_json(tmp_path / "b1.json", {"sm90a": 100.0, "decode": 50.0}),
            bench_table(tmp_path / "b2.txt", {"sm90a": 102.0, "decode": 60.0}),
            bench_json(tmp_path / "b3.json", {"sm90a": 110.0, "decode": 55.0})]
    cand = [bench_table(tmp_path / "c1.txt", {"sm90a": 95.0, "decode": 52.0}),
            bench_json(tmp_path / "c2.json", {"sm90a": 96.0, "decode": 58.0}),
            bench_json(tmp_path / "c3.json", {"sm90a": 97.0, "decode": 54.0})]
    rc, out, err = run("--baseline-runs", *base, "--candidate-runs", *cand)
    assert rc == 0, err
    rows = {l.split("|")[1].strip(): l for l in out.splitlines() if l.startswith("| ")}
    assert "| 102.0 (100.0-110.0) | 96.0 (95.0-97.0) | 0.941 |  |" in rows["sm90a"]
    assert "| 55.0 (50.0-60.0) | 54.0 (52.0-58.0) | 0.982 | within the spread |" in rows["decode"]
    assert "2 cases" in out and "1 with the two ranges apart" in out


def test_runs_keep_the_empty_calls_of_json_files(tmp_path):
    base = [bench_json(tmp_path / f"b{i}.json", {"sm90a": 100.0}, 11.0 + i) for i in range(2)]
    cand = [bench_json(tmp_path / f"c{i}.json", {"sm90a": 100.0}, 10.0 + i) for i in range(2)]
    rc, out, err = run("--baseline-runs", *base, "--candidate-runs", *cand)
    assert rc == 0, err
    assert "| sm90a | smem-large | 1 | 8 | 1 | 0 | 64 | 11.5 (11.0-12.0) | 10.5 (10.0-11.0) |" in out


def test_bad_uses_are_refused_with_a_message(tmp_path):
    a = bench_json(tmp_path / "a.json", {"sm90a": 100.0})
    b = bench_json(tmp_path / "b.json", {"decode": 50.0})
    rc, _, err = run(a, b)
    assert rc == 2 and "share no case" in err
    rc, _, err = run("--baseline-runs", a)
    assert rc == 2 and "together" in err
    rc, _, err = run(a, "--baseline-runs", a, "--candidate-runs", a)
    assert rc == 2 and "no positional files" in err
    rc, _, err = run(a)
    assert rc == 2 and "a baseline and a candidate" in err
    junk = tmp_path / "junk.txt"
    junk.write_text("no table here\n")
    rc, _, err = run("--baseline-runs", junk, "--candidate-runs", a)
    assert rc == 2 and "no row of treemla bench's table" in err
